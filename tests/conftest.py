from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

FAMILIES = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}


def tiny_config(family: str = "llama", layers: int = 4, attn: str = "sdpa", **overrides):
    kwargs = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, pad_token_id=0,
    )
    kwargs.update(overrides)
    config = FAMILIES[family](**kwargs)
    config._attn_implementation = attn
    return config


def tiny_model(family: str = "llama", layers: int = 4, seed: int = 0, attn: str = "sdpa", **overrides):
    """A tiny random model of a supported family, built in the test (no downloads)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, layers, attn, **overrides), dtype=torch.float32)
    return model.eval().requires_grad_(False)


@pytest.fixture
def model():
    return tiny_model()


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory):
    """A local Hugging Face folder: a tiny random Llama with the embedded model's real tokenizer, so CLI paths
    run end to end in seconds."""
    from orthorank.models.loading import embedded_gguf_path
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    folder = tmp_path_factory.mktemp("tiny-llama")
    m = tiny_model(layers=4, vocab_size=len(tok), pad_token_id=tok.eos_token_id)
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def pytest_collection_modifyitems(config, items):
    """Tests marked `data` read ../shared/data (or ORTHORANK_DATA_DIR); without it they are skipped, saying why."""
    from orthorank.evaluation.data import find_data_dir

    if find_data_dir() is not None:
        return
    skip = pytest.mark.skip(reason="offline evaluation data not found: put it at ../shared/data or set "
                                   "ORTHORANK_DATA_DIR")
    for item in items:
        if item.get_closest_marker("data") is not None:
            item.add_marker(skip)
