from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

FAMILIES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config"}

_ROPE_LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

# Tiny random members of every supported decoder family, built from transformers' own config classes:
# name -> (config class, overrides). Small sliding windows so that 40-token inputs cross them.
ZOO: dict[str, tuple[str, dict]] = {
    "llama2": ("LlamaConfig", {}),
    "llama3": ("LlamaConfig", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    "llama3.1": ("LlamaConfig", {"rope_parameters": dict(_ROPE_LLAMA3)}),
    "llama3.2": ("LlamaConfig", {"rope_parameters": dict(_ROPE_LLAMA3), "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {"sliding_window": 16}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16}),
    "qwen2": ("Qwen2Config", {}),
    "qwen2.5": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 32, "decoder_sparse_step": 1}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 16, "query_pre_attn_scalar": 16,
                                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 16, "query_pre_attn_scalar": 16,
                                    "sliding_window_pattern": 2}),
    "phi3": ("Phi3Config", {"partial_rotary_factor": 0.5}),
    "olmo2": ("Olmo2Config", {}),
    "granite": ("GraniteConfig", {"residual_multiplier": 0.5, "attention_multiplier": 0.2,
                                  "embedding_multiplier": 2.0, "logits_scaling": 4.0}),
}


def tiny_config(family: str = "llama", layers: int = 4, attn: str = "sdpa", **overrides):
    kwargs = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    )
    cls_name = FAMILIES.get(family)
    if cls_name is None:
        cls_name, extra = ZOO[family]
        kwargs.update(extra)
    kwargs.update(overrides)
    config = getattr(transformers, cls_name)(**kwargs)
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
    from orthorank.models.gguf import converted_folder
    from orthorank.models.loading import embedded_gguf_path
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(converted_folder(embedded_gguf_path())))
    folder = tmp_path_factory.mktemp("tiny-llama")
    m = tiny_model(layers=4, vocab_size=len(tok), pad_token_id=tok.eos_token_id)
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def ids_for(batch: int = 2, length: int = 24, vocab: int = 128, seed: int = 1, low: int = 1) -> torch.Tensor:
    """Random token ids [batch, length] in [low, vocab), from their own seed."""
    return torch.randint(low, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def prompt_ids(batch: int = 1, length: int = 40, seed: int = 3) -> torch.Tensor:
    """The long-prompt tests' ids (no special tokens below 3): one 40-token prompt by default."""
    return ids_for(batch, length, 128, seed, low=3)


def model_signature(m) -> dict:
    """What a plan records of the model it was made for."""
    c = m.config
    return {"model_type": c.model_type, "num_layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size}


def left_pad(rows: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths as one left-padded batch: (ids, attention mask)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run tests marked slow (long fault-injection trials)")


def pytest_collection_modifyitems(config, items):
    """Tests marked `data` read ../shared/data (or ORTHORANK_DATA_DIR); without it they are skipped, saying why.
    Tests marked `slow` run only with --slow. Every flex_attention case is `heavy` (its kernels compile on first
    use), so `make test-fast` leaves them to `make test`."""
    from orthorank.harness.evaluation.data import find_data_dir

    for item in items:
        if "flex_attention" in item.name:
            item.add_marker(pytest.mark.heavy)

    if not config.getoption("--slow"):
        later = pytest.mark.skip(reason="slow: run with --slow (make test-slow)")
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(later)
    if find_data_dir() is not None:
        return
    skip = pytest.mark.skip(reason="offline evaluation data not found: put it at ../shared/data or set "
                                   "ORTHORANK_DATA_DIR")
    for item in items:
        if item.get_closest_marker("data") is not None:
            item.add_marker(skip)
