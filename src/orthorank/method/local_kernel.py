"""The kernels under local prefill attention (method/local_attention.py) for rows without padding.

The pattern: a context query at p reads the G first keys and the keys from floor(p / C) * C - W to p; the prompt's
last `tail` queries read every key up to themselves. Two exact ways to run it:

- `placeholder_blocks` (the first kernel): one causal SDPA call per block of C queries over its G + W + C keys, with
  G + W placeholder queries in front so that torch's top-left causal mask lands on the block's diagonal. Simple, but
  the placeholders cost about a quarter of the work and every block is its own call.
- `window_split` (the default where torch has the CPU flash op): every block's keys split into its window prefix
  (the G first keys and the W keys before the block, which every query of the block reads: no mask) and its
  diagonal (the block's own C keys, causal), each run as one call over all blocks at once, and the two partial
  softmaxes merged by their log-sum-exps. Grouped-query heads fold into the query axis, so K/V are never repeated;
  the diagonal's causal mask is one shared [G * C, C] pattern. The tail runs the same way: the whole context as its
  prefix, its own keys as its diagonal. Queries before the first block whose window clears the global keys read
  every key before them: one causal call.

Both equal the masked reference (`local_allowed`) to float32 rounding; in bfloat16 they differ by a rounding of the
merge (tests/method/test_local_attention.py bounds it). Measured against each other and the keys-read ideal by
scripts/local_kernel.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from orthorank.method.attention_split import _flash, available


def placeholder_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, global_keys: int,
                       window: int, block: int, tail: int) -> torch.Tensor:
    """q [B, H, N, d], k/v [B, Hkv, N, d], no padding -> [B, H, N, d]: one causal call per block of queries."""
    B, H, N, d = q.shape
    gqa = H != k.shape[1]
    S, W, C = global_keys, window, block
    context = max(0, N - tail)
    out = torch.empty_like(q)
    for a in range(0, context, C):
        b = min(a + C, context)
        lo = max(S, a - W)
        if lo <= S:  # the window reaches back to the global keys: the keys are 0..b-1, contiguous
            kk, vv = k[:, :, :b], v[:, :, :b]
        else:
            kk, vv = torch.cat([k[:, :, :S], k[:, :, lo:b]], 2), torch.cat([v[:, :, :S], v[:, :, lo:b]], 2)
        pad = kk.shape[2] - (b - a)  # placeholder queries in front: query p is row pad + p - a, key p is its last
        qq = torch.cat([q.new_zeros(B, H, pad, d), q[:, :, a:b]], 2) if pad else q[:, :, a:b]
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale, enable_gqa=gqa)
        out[:, :, a:b] = o[:, :, pad:]
    if context < N:  # the tail: every key up to each query
        k_pos = torch.arange(N, device=q.device)
        mask = k_pos[None, :] <= k_pos[context:, None]
        out[:, :, context:] = F.scaled_dot_product_attention(q[:, :, context:], k, v, attn_mask=mask[None, None],
                                                             scale=scale, enable_gqa=gqa)
    return out


def _fold(q: torch.Tensor, Hkv: int, blocks: int, n: int) -> torch.Tensor:
    """q [B, H, blocks * n, d] -> [B * blocks, Hkv, G * n, d]: each block a batch row, a KV head's G query heads one
    query axis (head h = kv * G + g, as transformers groups them). One copy."""
    B, H, _, d = q.shape
    G = H // Hkv
    return q.reshape(B, Hkv, G, blocks, n, d).permute(0, 3, 1, 2, 4, 5).reshape(B * blocks, Hkv, G * n, d)


def _diagonal_mask(n: int, G: int, like: torch.Tensor) -> torch.Tensor:
    """[1, 1, G * n, n] additive: folded query row g * n + i reads the block's keys 0..i."""
    i = torch.arange(n, device=like.device)
    seen = i[None, :] <= i.repeat(G)[:, None]
    return torch.zeros(G * n, n, dtype=like.dtype, device=like.device).masked_fill_(~seen, float("-inf"))[None, None]


def _merge_into(target: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor],
                diagonal: tuple[torch.Tensor, torch.Tensor], B: int, blocks: int, n: int) -> None:
    """Write softmax(prefix keys + diagonal keys) . V into target [B, blocks * n, Hkv, G, d] (a view of the output)
    from the two partial results ([B * blocks, Hkv, G * n, d] with log-sum-exps [B * blocks, Hkv, G * n])."""
    (o_p, lse_p), (o_d, lse_d) = prefix, diagonal
    Hkv, d = o_p.shape[1], o_p.shape[-1]
    G = o_p.shape[2] // n
    share = torch.sigmoid(lse_p - lse_d).to(o_p.dtype)  # the prefix's part of each query's softmax mass
    six = (B, blocks, Hkv, G, n, d)
    dest = target.reshape(B, blocks, n, Hkv, G, d).permute(0, 1, 3, 4, 2, 5)
    torch.lerp(o_d.reshape(six), o_p.reshape(six), share.reshape(*six[:-1], 1), out=dest)


def window_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, global_keys: int,
                 window: int, block: int, tail: int) -> torch.Tensor:
    """q [B, H, N, d], k/v [B, Hkv, N, d], no padding -> [B, H, N, d] (a transposed view of [B, N, H, d], the layout
    the attention module returns, so its transpose back is free)."""
    B, H, N, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    S, W, C = global_keys, window, block
    context = max(0, N - tail)
    if context == 0:  # the whole prompt is the tail: dense causal attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=G > 1)
    out_bnhd = q.new_empty(B, N, H, d)
    out = out_bnhd.transpose(1, 2)
    first = min(context, -(-(S + W) // C) * C)  # the first block whose window clears the global keys
    if first:  # every earlier query reads every key before it
        out[:, :, :first] = F.scaled_dot_product_attention(q[:, :, :first], k[:, :, :first], v[:, :, :first],
                                                           is_causal=True, scale=scale, enable_gqa=G > 1)
    target = out_bnhd.view(B, N, Hkv, G, d)
    a = first
    while a < context:  # the whole blocks in one pass, then the last partial block
        blocks = (context - a) // C
        n = C if blocks else context - a
        blocks = max(blocks, 1)
        e = a + blocks * n
        qf = _fold(q[:, :, a:e], Hkv, blocks, n)
        # the window prefix of block j: the global keys and keys a + j * n - W .. a + j * n - 1 (a strided view)
        kw = k[:, :, a - W:e - n].unfold(2, W, n).permute(0, 2, 1, 4, 3)  # [B, blocks, Hkv, W, d]
        vw = v[:, :, a - W:e - n].unfold(2, W, n).permute(0, 2, 1, 4, 3)
        kp = torch.cat([k[:, None, :, :S].expand(B, blocks, Hkv, S, d), kw], 3).reshape(B * blocks, Hkv, S + W, d)
        vp = torch.cat([v[:, None, :, :S].expand(B, blocks, Hkv, S, d), vw], 3).reshape(B * blocks, Hkv, S + W, d)
        kd = k[:, :, a:e].reshape(B, Hkv, blocks, n, d).transpose(1, 2).reshape(B * blocks, Hkv, n, d)
        vd = v[:, :, a:e].reshape(B, Hkv, blocks, n, d).transpose(1, 2).reshape(B * blocks, Hkv, n, d)
        _merge_into(target[:, a:e], _flash(qf, kp, vp, scale), _flash(qf, kd, vd, scale, _diagonal_mask(n, G, q)),
                    B, blocks, n)
        a = e
    if context < N:  # the tail: the whole context as its prefix, its own keys causally
        n = N - context
        qf = _fold(q[:, :, context:], Hkv, 1, n)
        _merge_into(target[:, context:], _flash(qf, k[:, :, :context], v[:, :, :context], scale),
                    _flash(qf, k[:, :, context:], v[:, :, context:], scale, _diagonal_mask(n, G, q)), B, 1, n)
    return out


# what "auto" runs: "split" where torch has the CPU flash op and the tensors are on the CPU (placeholder_blocks
# elsewhere); a benchmark sets "placeholder" to time the whole model under the first kernel
AUTO = "split"


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, global_keys: int, window: int,
        block: int, tail: int, kernel: str = "auto") -> torch.Tensor:
    """The chosen kernel (KERNELS, or "auto": AUTO where it can run)."""
    if kernel == "auto":
        kernel = AUTO if AUTO != "split" or (available() and q.device.type == "cpu") else "placeholder"
    return KERNELS[kernel](q, k, v, scale=scale, global_keys=global_keys, window=window, block=block, tail=tail)


KERNELS = {"placeholder": placeholder_blocks, "split": window_split}
