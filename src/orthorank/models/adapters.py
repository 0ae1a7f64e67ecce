"""Per-family adapters: where a model keeps its decoder layers and how they apply RoPE.

The method code talks to decoder layers only through an adapter, so adding a family means adding an adapter
here, not touching the algorithm.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from orthorank.errors import UserError


@dataclass(frozen=True)
class FamilyAdapter:
    """Llama-style layout: model.model.layers[i] with input_layernorm, self_attn.{q,k,v,o}_proj,
    post_attention_layernorm and mlp."""

    family: str

    def decoder(self, model: nn.Module) -> nn.Module:
        return model.model

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return self.decoder(model).layers

    def set_layers(self, model: nn.Module, layers: nn.ModuleList) -> None:
        self.decoder(model).layers = layers

    def rotate_half(self, layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        # Use the family's own rotate_half so RoPE stays bit-identical with the model's attention.
        return sys.modules[type(layer.self_attn).__module__].rotate_half


_ADAPTERS: dict[str, FamilyAdapter] = {
    name: FamilyAdapter(name) for name in ("llama", "mistral", "qwen2")
}


def register_adapter(model_type: str, adapter: FamilyAdapter) -> None:
    _ADAPTERS[model_type] = adapter


def supported_families() -> list[str]:
    return sorted(_ADAPTERS)


def get_adapter(model: nn.Module) -> FamilyAdapter:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _ADAPTERS:
        raise UserError(
            f"model family {model_type!r} is not supported; supported families: {', '.join(supported_families())}"
        )
    return _ADAPTERS[model_type]
