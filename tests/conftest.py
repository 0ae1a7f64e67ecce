from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

FAMILIES = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}


def tiny_model(family: str = "llama", layers: int = 4, seed: int = 0, attn: str = "sdpa", **overrides):
    torch.manual_seed(seed)
    kwargs = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, pad_token_id=0,
    )
    kwargs.update(overrides)
    config = FAMILIES[family](**kwargs)
    config._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init gives no attention sink; a large first-token embedding direction makes selection non-trivial.
    model.eval().requires_grad_(False)
    return model


@pytest.fixture
def model():
    return tiny_model()


def pytest_collection_modifyitems(config, items):
    pass
