"""The selection layer's paths that compute every token's dense update first (method/layer.py): the oracle policy,
which keeps the K largest updates, and recording (method/recording.py), which hands what the layer computed to a
recorder. Neither saves compute; both are references and tools, not the product's path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from orthorank.errors import UserError

if TYPE_CHECKING:
    from orthorank.method.layer import SelectiveLayer
    from orthorank.method.sequence_context import Facts


def oracle(sel: SelectiveLayer, hidden_states: torch.Tensor, args: tuple, kwargs: dict[str, Any], src: torch.Tensor,
           past: int, facts: Facts) -> Any:
    """The oracle policy: the dense layer (every token's update, every key and value into the cache), then only
    the K largest updates kept. A selected token's update equals its dense update (its query sees every key
    either way), so this is exactly the selective layer with the best choice of tokens: an upper bound."""
    out = sel.inner(hidden_states, *args, **kwargs)
    h_new = out[0] if isinstance(out, tuple) else out
    norms = torch.linalg.vector_norm((h_new - hidden_states).float(), dim=-1)
    chosen = sel._select_given(norms, hidden_states, src, past, facts)
    if chosen is None:
        sel._last = None
        return out
    idx, real = chosen
    B, T, _ = hidden_states.shape
    sel._last = (idx, real, T)
    keep = torch.zeros(B, T, dtype=torch.bool, device=hidden_states.device)
    keep.scatter_(1, idx, True if real is None else real)
    result = torch.where(keep.unsqueeze(-1), h_new, hidden_states)
    return (result, *out[1:]) if isinstance(out, tuple) else result


def recorded(sel: SelectiveLayer, recorder: Any, hidden_states: torch.Tensor, args: tuple, kwargs: dict[str, Any],
             past: int) -> Any:
    """The layer for a recorder (method/recording.py): the dense update of every token, then either every
    update kept (recorder.select False: the dense model) or only those the layer's own policy selects, with
    what the layer computed handed to the recorder. Autograd stays on: recorders take gradients through it."""
    if past > 0:
        raise UserError("recording a selection layer needs whole windows (no KV cache)")
    if torch.is_grad_enabled() and not hidden_states.requires_grad:
        hidden_states = hidden_states.detach().requires_grad_(True)  # the first layer gradients must reach
    x = sel.adapter.attention_input(sel.layer, hidden_states)
    src = sel.adapter.score_input(hidden_states, x) if sel.config.source == "normed" else hidden_states
    out = sel.inner(hidden_states, *args, **kwargs)
    h_new = out[0] if isinstance(out, tuple) else out
    result, keep = h_new, None
    if recorder.select:
        B, T, _ = hidden_states.shape
        with torch.no_grad():
            sel._hidden = hidden_states.detach()
            facts = sel._context.facts(B, T, 0, hidden_states.device, sel.config.ratio)
            chosen = sel._select_given(None, hidden_states.detach(), src.detach(), 0, facts)
        if chosen is not None:
            idx, real = chosen
            keep = torch.zeros(B, T, dtype=torch.bool, device=h_new.device)
            keep.scatter_(1, idx, True if real is None else real)
            result = torch.where(keep.unsqueeze(-1), h_new, hidden_states)
    recorder.add(sel, hidden_states=hidden_states, src=src, dense_out=h_new, out=result, keep=keep)
    return (result, *out[1:]) if isinstance(out, tuple) else result
