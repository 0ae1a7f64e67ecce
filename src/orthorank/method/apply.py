"""Apply a plan to a Hugging Face model in place, and restore it to dense."""

from __future__ import annotations

from typing import Any

from torch import nn

from orthorank.errors import UserError
from orthorank.method.layer import OrthoRankLayer, SequenceContext
from orthorank.method.plan import Plan
from orthorank.method.selection import SelectionConfig
from orthorank.models.adapters import get_adapter

_STATE = "_orthorank_state"


def _begin(model: nn.Module) -> dict[str, Any]:
    if getattr(model, _STATE, None) is not None:
        restore_dense(model)
    adapter = get_adapter(model)
    state = {
        "layers": adapter.layers(model),
        "num_hidden_layers": model.config.num_hidden_layers,
        "layer_types": getattr(model.config, "layer_types", None),
        "hooks": [],
    }
    setattr(model, _STATE, state)
    return state


def apply_orthorank(model: nn.Module, layers: list[int], config: SelectionConfig) -> nn.Module:
    """Wrap the given decoder layers in token-selective OrthoRank layers."""
    adapter = get_adapter(model)
    restore_dense(model)
    original = adapter.layers(model)
    bad = [i for i in layers if not 0 <= i < len(original)]
    if bad:
        raise UserError(f"layer indices {bad} are out of range for a model with {len(original)} layers")
    state = _begin(model)
    context = SequenceContext()
    state["hooks"].append(adapter.decoder(model).register_forward_pre_hook(context.capture, with_kwargs=True))
    wrapped = nn.ModuleList(
        OrthoRankLayer(layer, adapter, config, context, i) if i in set(layers) else layer
        for i, layer in enumerate(original)
    )
    adapter.set_layers(model, wrapped)
    return model


def prune_layers(model: nn.Module, layers: list[int]) -> nn.Module:
    """Remove whole decoder layers (SLEB, Shortened LLaMA, ShortGPT). Kept layers are renumbered so that the
    KV cache, which is indexed by layer, stays dense."""
    adapter = get_adapter(model)
    restore_dense(model)
    original = adapter.layers(model)
    drop = set(layers)
    if any(not 0 <= i < len(original) for i in drop):
        raise UserError(f"layer indices {sorted(drop)} are out of range for a model with {len(original)} layers")
    if len(drop) >= len(original):
        raise UserError("a plan cannot remove every layer")
    state = _begin(model)
    kept = [i for i in range(len(original)) if i not in drop]
    state["attn_layer_idx"] = {i: original[i].self_attn.layer_idx for i in kept}
    for new, old in enumerate(kept):
        original[old].self_attn.layer_idx = new
    adapter.set_layers(model, nn.ModuleList(original[i] for i in kept))
    model.config.num_hidden_layers = len(kept)
    if isinstance(state["layer_types"], list):
        model.config.layer_types = [state["layer_types"][i] for i in kept]
    return model


def restore_dense(model: nn.Module) -> nn.Module:
    state = getattr(model, _STATE, None)
    if state is None:
        return model
    for hook in state["hooks"]:
        hook.remove()
    for i, idx in state.get("attn_layer_idx", {}).items():
        state["layers"][i].self_attn.layer_idx = idx
    get_adapter(model).set_layers(model, state["layers"])
    model.config.num_hidden_layers = state["num_hidden_layers"]
    if state["layer_types"] is not None:
        model.config.layer_types = state["layer_types"]
    setattr(model, _STATE, None)
    return model


def apply_plan(model: nn.Module, plan: Plan) -> nn.Module:
    if plan.method == "dense":
        return restore_dense(model)
    if plan.method == "orthorank":
        return apply_orthorank(model, plan.layers, plan.selection)
    return prune_layers(model, plan.layers)
