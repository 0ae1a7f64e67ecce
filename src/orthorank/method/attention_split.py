"""Selected queries against their keys without a mask over the keys every query sees: prefix + diagonal, merged.

The masked SDPA of method/attention.py gives each chunk of selected queries (in position order) the keys up to the
chunk's last position and a boolean mask over all of them. On CPU that mask is what costs: the kernel adds a float
copy of it to every score block, so at 32k tokens a selection layer's attention runs ~1.3x slower per useful FLOP
than the dense layer's causal kernel (scripts/results/length-scaling/length-scaling.md). But every query
of a chunk sees every key up to the chunk's *first* position: only the keys between the first and the last position
(the chunk's diagonal, ~S / chunks of them) need a mask. So each chunk runs twice, unmasked over the prefix and
masked over the diagonal, and the two partial softmaxes are merged by their log-sum-exps:

    lse = logaddexp(lse_p, lse_d),  out = exp(lse_p - lse) out_p + exp(lse_d - lse) out_d

Grouped-query heads fold into the query axis ([B, Hkv, G * n, d]), so neither K/V nor the mask is repeated.
This needs the log-sum-exp, which only the CPU flash kernel's private op returns
(aten::_scaled_dot_product_flash_attention_for_cpu); `available()` says whether this torch has it.
Scope: no padding among the keys, no sliding window, no model mask, keys from position 0 (the long-prompt prefill).
"""

from __future__ import annotations

import torch


def available() -> bool:
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                       scale=scale)


def split_attention(qh: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    chunks: list[tuple[int, int]]) -> torch.Tensor:
    """qh [B, H, K, d] (queries in position order), q_pos [B, K], k/v [B, Hkv, S, d] from position 0 -> [B, H, K, d]:
    each query attends to the keys at or before its position."""
    B, H, K, d = qh.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    out = torch.empty((B, H, K, d), dtype=qh.dtype, device=qh.device)
    bounds = torch.stack([torch.stack([q_pos[:, a].amin(), q_pos[:, b - 1].amax()]) for a, b in chunks]).tolist()
    k_pos = torch.arange(S, device=qh.device)
    zero, minus_inf = qh.new_zeros(()), qh.new_full((), float("-inf"))
    for (a, b), (first, last) in zip(chunks, bounds):
        n = b - a
        qg = qh[:, :, a:b].reshape(B, Hkv, G * n, d)  # head h = kv head h // G: the group folds into the queries
        P = int(first) + 1  # keys 0..first: seen by every query of the chunk
        o, lse = _flash(qg, k[:, :, :P], v[:, :, :P], scale)
        E = min(S, int(last) + 1)
        if E > P:
            # the chunk's diagonal, built at its folded rows' positions: one pass over the mask, no expanded copy
            rows = q_pos[:, None, a:b].expand(B, G, n).reshape(B, 1, G * n, 1)
            add = torch.where(k_pos[P:E] <= rows, zero, minus_inf)  # [B, 1, G * n, E - P], in q's dtype
            o_d, lse_d = _flash(qg, k[:, :, P:E], v[:, :, P:E], scale, add)
            seen = rows[..., 0] >= P  # a query sees a diagonal key iff it lies past the prefix
            lse_d = lse_d.masked_fill(~seen, float("-inf"))  # a row with no diagonal key: the kernel says 0
            both = torch.logaddexp(lse, lse_d)
            o = o * torch.exp(lse - both)[..., None] + torch.nan_to_num(o_d) * torch.exp(lse_d - both)[..., None]
        out[:, :, a:b] = o.reshape(B, Hkv, G, n, d).reshape(B, H, n, d)
    return out
