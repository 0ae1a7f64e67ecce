"""Public model shapes with random weights, for speed work where real weights cannot travel.

Speed does not depend on the weights' values, only on the shapes, so these configs reproduce the published
architectures (hidden size, heads, KV heads, MLP width, vocabulary, layer count).
"""

from __future__ import annotations

from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, PretrainedConfig

SHAPES: dict[str, dict] = {
    # meta-llama/Llama-2-7b-hf
    "llama2-7b": dict(
        cls=LlamaConfig, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_theta=10000.0,
    ),
    # meta-llama/Meta-Llama-3-8B
    "llama3-8b": dict(
        cls=LlamaConfig, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=500000.0,
    ),
    # mistralai/Mistral-7B-v0.1 (sliding window disabled: prefill lengths here stay below 4096)
    "mistral-7b": dict(
        cls=MistralConfig, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None,
    ),
    # HuggingFaceTB/SmolLM2-135M-Instruct, for shape-only runs of the embedded model
    "smollm2-135m-shape": dict(
        cls=LlamaConfig, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
    ),
    # google/gemma-3-270m: five sliding-window (512) layers to one full layer, one KV head of 256, a 262k vocabulary
    # whose LM head is most of the model's compute; RoPE per layer type at Gemma 3's defaults (1e6 full, 1e4 local)
    "gemma3-270m-shape": dict(
        cls=Gemma3TextConfig, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
        max_position_embeddings=32768, rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=512,
        rope_theta=None, tie_word_embeddings=True,
    ),
}


def shape_config(name: str, num_layers: int | None = None) -> PretrainedConfig:
    spec = dict(SHAPES[name])
    cls = spec.pop("cls")
    rope_theta = spec.pop("rope_theta")
    if num_layers is not None:
        spec["num_hidden_layers"] = num_layers
    config = cls(**spec)
    config.name_or_path = name
    if rope_theta is None:  # the config class's own RoPE settings (per layer type)
        return config
    # transformers 5 keeps RoPE settings in rope_parameters; older releases read rope_theta.
    if getattr(config, "rope_parameters", None) is not None:
        config.rope_parameters = {**config.rope_parameters, "rope_theta": rope_theta}
    else:
        config.rope_theta = rope_theta
    return config
