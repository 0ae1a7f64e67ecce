"""Apply a plan to a Hugging Face model in place, and restore it to dense.

OrthoRank leaves every module where it is: each selection layer's instance gets a `SelectiveLayer` as its forward
(inside accelerate's hook where the model was dispatched), so state_dict keys, hooks and device placement stay the
model's own. Layer removal swaps the decoder's layer list for the kept layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from orthorank.errors import UserError
from orthorank.method.attention import backend_for
from orthorank.method.attention_routing import current_forward, install_forward
from orthorank.method.layer import SelectiveLayer
from orthorank.method.sequence_context import SequenceContext
from orthorank.method import local_attention
from orthorank.method import policy_inputs
from orthorank.method.selection import SelectionConfig
from orthorank.models.adapters import get_adapter

if TYPE_CHECKING:  # plans name their kinds, and the kinds apply themselves with the functions below
    from orthorank.method.plan import Plan

_STATE = "_orthorank_state"
_LAYER_ATTR = "_orthorank"


def _begin(model: nn.Module) -> dict[str, Any]:
    if getattr(model, _STATE, None) is not None:
        restore_dense(model)
    adapter = get_adapter(model)
    state = {
        "layers": adapter.layers(model),
        "num_hidden_layers": model.config.num_hidden_layers,
        "layer_types": getattr(model.config, "layer_types", None),
        "hooks": [],
        "restores": [],
    }
    setattr(model, _STATE, state)
    return state


def selective(layer: nn.Module) -> SelectiveLayer | None:
    """The OrthoRank state installed on a decoder layer (None for a dense layer)."""
    return getattr(layer, _LAYER_ATTR, None)


def apply_orthorank(model: nn.Module, layers: list[int], config: SelectionConfig) -> nn.Module:
    """Make the given decoder layers token-selective, in place."""
    return apply_hybrid(model, [], {i: config for i in layers})


def prune_layers(model: nn.Module, layers: list[int]) -> nn.Module:
    """Remove whole decoder layers (SLEB, Shortened LLaMA, ShortGPT). Kept layers are renumbered so that the
    KV cache, which is indexed by layer, stays dense."""
    return apply_hybrid(model, layers, {})


def restore_dense(model: nn.Module) -> nn.Module:
    state = getattr(model, _STATE, None)
    if state is None:
        return model
    for hook in state["hooks"]:
        hook.remove()
    for undo in reversed(state["restores"]):
        undo()
    for i, idx in state.get("attn_layer_idx", {}).items():
        state["layers"][i].self_attn.layer_idx = idx
    get_adapter(model).set_layers(model, state["layers"])
    model.config.num_hidden_layers = state["num_hidden_layers"]
    if state["layer_types"] is not None:
        model.config.layer_types = state["layer_types"]
    setattr(model, _STATE, None)
    return model


def apply_hybrid(model: nn.Module, removed: list[int], selections: dict[int, SelectionConfig]) -> nn.Module:
    """Remove some decoder layers and make others token-selective, each with its own SelectionConfig, in place
    (apply_orthorank and prune_layers are its two halves).

    Indices are the original model's. Selection is installed on the layer instances first (each SelectiveLayer keeps
    its original index, as apply_orthorank gives it), then the removed layers leave the layer list and the kept ones
    are renumbered for the KV cache, as prune_layers does. The result equals removing the layers from the model and
    then selecting tokens in the kept layers at their new positions (tests/harness/test_hybrid.py)."""
    adapter = get_adapter(model)
    restore_dense(model)
    original = adapter.layers(model)
    drop = set(removed)
    bad = sorted(i for i in drop | set(selections) if not 0 <= i < len(original))
    if bad:
        raise UserError(f"layer indices {bad} are out of range for a model with {len(original)} layers")
    both = sorted(drop & set(selections))
    if both:
        raise UserError(f"layers {both} cannot be both removed and selective")
    if len(drop) >= len(original):
        raise UserError("a plan cannot remove every layer")
    if selections:
        backend_for(getattr(model.config, "_attn_implementation", None))
    state = _begin(model)
    if selections:
        context = SequenceContext()
        site = policy_inputs.Site(model, original, drop, context, adapter.head_logits)
        state["hooks"].append(adapter.decoder(model).register_forward_pre_hook(context.capture, with_kwargs=True))
        for i in sorted(selections):
            layer = original[i]
            sel = SelectiveLayer(layer, adapter, selections[i], context, i, inner=current_forward(layer))
            state["restores"].append(install_forward(layer, sel))
            state["restores"].append(sel.route_attention())
            setattr(layer, _LAYER_ATTR, sel)
            state["restores"].append(lambda layer=layer: delattr(layer, _LAYER_ATTR))
            state["hooks"] += policy_inputs.install(sel.rule, site, i, sel)
        state["context"] = context
    if drop:
        kept = [i for i in range(len(original)) if i not in drop]
        state["attn_layer_idx"] = {i: original[i].self_attn.layer_idx for i in kept}
        for new, old in enumerate(kept):
            original[old].self_attn.layer_idx = new
        adapter.set_layers(model, nn.ModuleList(original[i] for i in kept))
        model.config.num_hidden_layers = len(kept)
        if isinstance(state["layer_types"], list):
            model.config.layer_types = [state["layer_types"][i] for i in kept]
    return model


def apply_local(model: nn.Module, layers: list[int], cfg: local_attention.LocalAttention) -> nn.Module:
    """Local prefill attention in the given decoder layers, in place (method/local_attention.py): each layer's
    attention module calls the local pattern instead of its own kernel; every token is still updated."""
    adapter = get_adapter(model)
    restore_dense(model)
    original = adapter.layers(model)
    bad = sorted(i for i in layers if not 0 <= i < len(original))
    if bad:
        raise UserError(f"layer indices {bad} are out of range for a model with {len(original)} layers")
    types = getattr(model.config, "layer_types", None)
    sliding = sorted(i for i in layers if isinstance(types, list) and types[i] != "full_attention")
    if sliding:
        raise UserError(f"layers {sliding} already attend a sliding window; local attention applies to "
                        "full-attention layers")
    state = _begin(model)
    for i in layers:
        state["restores"].append(local_attention.install(original[i].self_attn, cfg))
    return model


def sequence_context(model: nn.Module) -> SequenceContext | None:
    """The SequenceContext of the plan applied to `model` (None when no layer selects tokens): recorders are set
    on it (method/recording.py)."""
    state = getattr(model, _STATE, None)
    return None if state is None else state.get("context")


def apply_plan(model: nn.Module, plan: Plan) -> nn.Module:
    """Apply a plan of any kind, in place (its kind, method/kinds/, knows how)."""
    return plan.kind.apply(model, plan)
