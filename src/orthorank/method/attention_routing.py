"""Routing a selection layer's attention: for the duration of one selective call, the layer's attention module runs
the selected rows' queries against every token's keys and values (`selective_attention`, method/attention.py), and
the layer's input norm hands back the selected rows of the norm the layer already computed for every token (their
keys and values need it), instead of norming those rows a second time. Rows move with one `index_select` /
`index_copy_` over whole rows (`gather_rows`, `scatter_rows`).

Neither module is replaced: its instance forward is swapped for a router (inside accelerate's hook where there is
one) that calls its own forward outside a selective call, so state_dict keys and hooks stay the model's. Functions
here take the `SelectiveLayer` (method/layer.py) whose call they serve: its layer, adapter, configuration, window,
soft-capping and attention-chunking settings.

Shapes: B rows, T tokens in the chunk, K selected per row, S keys (past + T, or a sliding cache's latest), H query
heads, Hkv key/value heads, d head size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from orthorank.method.attention import selective_attention
from orthorank.method.phase_marks import phase
from orthorank.method.selection import keep_to_indices

if TYPE_CHECKING:
    from orthorank.method.layer import SelectiveLayer
    from orthorank.method.sequence_context import Facts


class RowCall:
    """What one selective call hands its attention module: every token's attention input and RoPE, the selected
    rows and positions, the cache and the model's mask."""

    __slots__ = ("x", "pos_emb", "idx", "q_pos", "past", "cache", "mask4d", "key_keep", "padded", "rows", "h_sel",
                 "x_sel")


def _flat_rows(idx: torch.Tensor, T: int, batch: int) -> torch.Tensor:
    """idx [B, K] positions -> [B * K] rows of a [batch * T, C] view (batch 1: every row of idx reads row 0)."""
    if batch == 1:
        return idx.reshape(-1)
    return (idx + torch.arange(idx.shape[0], device=idx.device).unsqueeze(1) * T).reshape(-1)


def gather_rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows of a [1 or B, T, C] tensor at idx [B, K] -> [B, K, C]. One index_select over whole rows: `gather` with an
    index expanded to [B, K, C] reads C indices per row (SmolLM2 at 1k-4k tokens: 9-24x slower, the same values)."""
    B, K = idx.shape
    N, T, C = t.shape
    return t.reshape(N * T, C).index_select(0, _flat_rows(idx, T, N)).view(B, K, C)


def scatter_rows(t: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor, inplace: bool) -> torch.Tensor:
    """t [B, T, C] with rows [B, K, C] written at idx [B, K] (unique per row), in place or into a copy: one
    index_copy_ over whole rows, 5-6x faster than `scatter` with an expanded index (SmolLM2 at 1k-4k tokens)."""
    B, T, C = t.shape
    out = t if inplace else t.clone()
    if not out.is_contiguous():
        return out.scatter_(1, idx.unsqueeze(-1).expand_as(rows), rows)
    out.view(B * T, C).index_copy_(0, _flat_rows(idx, T, B), rows.reshape(-1, C))
    return out


def keys_values(sel: SelectiveLayer, x: torch.Tensor, pos_emb) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token's keys (RoPE at its true position) and values: [B, Hkv, T, d] each."""
    attn = sel.layer.self_attn
    k, v = sel.adapter.keys_values(attn, x)
    cos, sin = pos_emb
    return sel.adapter.rope(attn, k, cos, sin).transpose(1, 2), v.transpose(1, 2)


def key_keep(sel: SelectiveLayer, idx: torch.Tensor, real: torch.Tensor | None, B: int, T: int, past: int,
             facts: Facts, device: torch.device) -> torch.Tensor | None:
    """Ablation (bypass_kv=False): bypassed tokens of this chunk offer no keys/values (cached ones still do).
    [B, past + T] bool, or None when every key stays."""
    cfg = sel.config
    if cfg.bypass_kv:
        return None
    keep = torch.zeros(B, T, dtype=torch.bool, device=device).scatter_(1, idx, True if real is None else real)
    if cfg.sink_kv_visible:  # variant: the sink's keys/values stay visible although it is bypassed
        rows = torch.nonzero(facts.sink_pos >= 0).squeeze(-1)
        keep[rows, facts.sink_pos[rows]] = True
    return torch.cat([torch.ones(B, past, dtype=torch.bool, device=device), keep], dim=1)


def run_routed(sel: SelectiveLayer, call: RowCall, h_sel: torch.Tensor, x_sel: torch.Tensor, args: tuple,
               kwargs: dict[str, Any]) -> Any:
    """The family's layer forward on the selected rows h_sel, its attention routed to this call and its input norm
    answered with x_sel, the rows of the norm the layer already computed for every token."""
    call.h_sel, call.x_sel = h_sel, x_sel
    undo = None if sel.attention_routed else route_attention(sel)  # a bare wrapper (search runner, layer benchmarks)
    sel.call = call
    try:
        return sel.inner(h_sel, *args, **kwargs)
    finally:
        sel.call = None
        call.h_sel = call.x_sel = None
        if undo is not None:
            undo()


def route_attention(sel: SelectiveLayer) -> Callable[[], None]:
    """Route the layer's attention module (and its input norm) through `sel` for as long as it is installed:
    during a selective call the attention runs selective attention and the norm hands back the selected rows of the
    norm already computed for every token; otherwise each runs its own forward. Nothing on the modules changes during
    a forward (what torch.compile needs). Returns the undo."""
    attn = sel.layer.self_attn
    inner = current_forward(attn)

    def route(hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
        call = sel.call
        if call is None:
            return inner(hidden_states, *args, **kwargs)
        return attention_forward(sel, call)(hidden_states, *args, **kwargs)

    undos = [install_forward(attn, route)]
    norm = getattr(sel.layer, sel.adapter.input_norm) if sel.adapter.input_norm else None
    if norm is not None:
        norm_inner = current_forward(norm)

        def route_norm(hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
            call = sel.call
            if call is not None and hidden_states is call.h_sel and not args and not kwargs:
                return call.x_sel  # the family normed exactly the selected rows: their rows of the whole norm
            return norm_inner(hidden_states, *args, **kwargs)

        undos.append(install_forward(norm, route_norm))
    sel.attention_routed = True

    def restore() -> None:
        for undo in reversed(undos):
            undo()
        sel.attention_routed = False

    return restore


def attention_forward(sel: SelectiveLayer, call: RowCall) -> Callable[..., Any]:
    """The attention module's forward for one selective call."""
    attn, adapter = sel.layer.self_attn, sel.adapter

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
        # hidden_states: the attention input of the selected rows [B, K, D]; position_embeddings: theirs
        cos_q, sin_q = kwargs.get("position_embeddings", args[0] if args else None)
        q = adapter.rope(attn, adapter.queries(attn, hidden_states), cos_q, sin_q)  # [B, K, H, d]
        kept = sel.chunk_kv
        if kept is not None and kept[0] is call.x:
            k, v = kept[1], kept[2]
        else:
            k, v = keys_values(sel, call.x, call.pos_emb)  # [B, Hkv, T, d]
        if call.cache is not None:
            k, v = call.cache.update(k, v, attn.layer_idx)  # complete cache: every token's K/V
        B, T = call.x.shape[:2]
        S = k.shape[2]
        k_offset = 0 if S >= call.past + T else call.past + T - S  # sliding caches keep the latest keys
        mask = None
        if call.mask4d is not None:
            m = call.mask4d.expand(B, -1, -1, -1)
            mask = m.gather(2, call.idx[:, None, :, None].expand(B, m.shape[1], call.idx.shape[1], m.shape[3]))
            mask = mask[..., :S]
        if _gathers_keys(sel, call, mask, S):
            return attn.o_proj(_pruned_attention(sel, q, call, k, v)), None
        key_valid = _key_valid(sel, call, B, T, S, k_offset, mask is not None)
        q_pos, idx = call.q_pos, call.idx
        if call.rows is not None:  # batch-compacted decode step: the kept rows' keys, values and masks
            r = call.rows
            k, v, q_pos, idx = k.index_select(0, r), v.index_select(0, r), q_pos[r], idx[r]
            mask = None if mask is None else mask.index_select(0, r)
            key_valid = None if key_valid is None else key_valid.index_select(0, r)
            B = r.numel()
        with phase("attention kernel"):
            o, w = selective_attention(
                q, q_pos, k, v, scale=attn.scaling, k_offset=k_offset, key_valid=key_valid,
                window=sel._window, softcap=sel._softcap, mask=mask, backend=sel.backend, attn_module=attn,
                max_chunks=sel.max_attention_chunks, min_chunk_keys=sel.min_chunk_keys)
        out = attn.o_proj(o)
        if w is not None:  # rows that ran attention report their weights; bypassed rows report zeros
            full = w.new_zeros(B, w.shape[1], T, w.shape[-1])
            w = full.scatter(2, idx[:, None, :, None].expand_as(w), w)
            if call.rows is not None:
                w = w.new_zeros(call.x.shape[0], *w.shape[1:]).index_copy(0, call.rows, w)
        return out, w

    return forward


def _gathers_keys(sel: SelectiveLayer, call: RowCall, mask: torch.Tensor | None, S: int) -> bool:
    """Whether progressive pruning's prefill takes the gathered path: the kept keys only, in full-attention
    layers of unpadded whole sequences (elsewhere the pruned keys are masked instead: the same result, no saving),
    and not under eager attention, whose weights a caller may read."""
    return (sel.config.progressive and call.key_keep is not None and call.past == 0 and not call.padded
            and mask is None and call.rows is None and sel._window is None and S == call.x.shape[1]
            and sel.backend != "eager")


def _pruned_attention(sel: SelectiveLayer, q: torch.Tensor, call: RowCall, k: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
    """The kept queries [B, K, H, d] against the kept keys only (and the sink's where it stays visible), gathered:
    the attention core costs K x K per head instead of K x T. Causality holds in the kept tokens' own order, so
    each query's position becomes its place among the kept keys (positions already sit in RoPE)."""
    attn = sel.layer.self_attn
    kidx, _ = keep_to_indices(call.key_keep)  # [B, S'] every row keeps as many: no padding
    B, Hkv, _, d = k.shape
    gather = kidx[:, None, :, None].expand(B, Hkv, kidx.shape[1], d)
    k_sel = k.gather(2, gather)
    v_sel = v.gather(2, kidx[:, None, :, None].expand(B, Hkv, kidx.shape[1], v.shape[-1]))
    q_place = torch.searchsorted(kidx, call.q_pos, right=True) - 1  # every query is itself a kept key
    o, _ = selective_attention(q, q_place, k_sel, v_sel, scale=attn.scaling, softcap=sel._softcap,
                               backend=sel.backend, attn_module=attn, max_chunks=sel.max_attention_chunks,
                               min_chunk_keys=sel.min_chunk_keys)
    return o


def _key_valid(sel: SelectiveLayer, call: RowCall, B: int, T: int, S: int, k_offset: int, have_mask: bool):
    """[B, S] bool or None: keys that may be attended apart from causality and the window."""
    parts = [] if call.key_keep is None else [call.key_keep]
    pad = sel._context.attention_mask
    if not have_mask and call.padded and pad is not None and pad.shape[0] == B and pad.shape[1] >= call.past + T:
        # No 4-D mask from the model (SDPA's causal shortcut, flash's 2-D mask, flex's block mask): padding
        # comes from the 2-D mask of past + current tokens that the context captured.
        parts.append(pad[:, :call.past + T].bool())
    if not parts:
        return None
    valid = parts[0] if len(parts) == 1 else parts[0] & parts[1]
    valid = valid[:, k_offset:k_offset + S]
    if valid.shape[1] < S:  # static caches: unfilled slots lie beyond every query (causally masked anyway)
        valid = F.pad(valid, (0, S - valid.shape[1]), value=False)
    return valid


def install_forward(module: nn.Module, forward: Callable[..., Any]) -> Callable[[], None]:
    """Replace the instance's forward (keeping class, hooks and state_dict keys), composing with accelerate: where
    its hook wraps forward, replace the `_old_forward` it calls. Returns a function that undoes it."""
    attr = "_old_forward" if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward") else "forward"
    had = attr in module.__dict__
    previous = module.__dict__.get(attr)
    setattr(module, attr, forward)

    def restore() -> None:
        if had:
            setattr(module, attr, previous)
        else:
            delattr(module, attr)

    return restore


def current_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward an installed replacement should call through to."""
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        return module._old_forward
    return module.__dict__.get("forward") or type(module).forward.__get__(module)
