"""A decoder's shape as the cost model and the memory guard need it, read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arch:
    """The numbers a FLOP count needs, from a Hugging Face config (Llama-style decoder)."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @classmethod
    def from_config(cls, config: Any, num_layers: int | None = None) -> "Arch":
        d = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        return cls(
            num_layers=int(num_layers if num_layers is not None else config.num_hidden_layers),
            hidden=d,
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or d // heads),
            ffn=int(config.intermediate_size),
            vocab=int(config.vocab_size),
        )
