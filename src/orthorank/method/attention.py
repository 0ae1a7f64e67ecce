"""Selective attention on plain tensors: the queries of some rows, at their true positions, against every key.

    selective_attention(q, q_pos, k, v, scale=..., k_offset=..., key_valid=..., window=..., softcap=...,
                        mask=..., backend="sdpa" | "eager" | "flex")

q [B, K, H, d] (rows in position order), q_pos [B, K] absolute positions, k/v [B, Hkv, S, d] whose first key sits
at absolute position k_offset (0, or more when a sliding-window cache keeps only the latest keys). A query sees
key j when k_offset + j <= its position, the key is valid (not padding, not an ablated bypassed token) and, with a
window w, its position minus the key's is below w. `mask` ([B, 1, K, S], bool or additive) replaces the causal,
window and padding part with rows of the model's own 4-D mask where the model built one. Returns [B, K, H*d], and
for the eager backend the attention weights [B, H, K, S].

Backends, by the model's attention implementation (see BACKENDS): masked SDPA (one mask row per selected token,
broadcast over heads, grouped-query heads in the kernel; on CPU long sequences in query chunks against only the
keys from the window's start (sliding layers) to each chunk's last position, and from 4k keys on split into an
unmasked prefix and a masked diagonal (method/attention_split.py); on accelerators one call with no device-to-host
sync), eager (the family's own eager function: soft-capping, weights for output_attentions), FlexAttention (a block
mask built from the positions). A flash-attention model's selective layers use SDPA math on its 2-D padding mask.
"""

from __future__ import annotations

import sys
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from orthorank.errors import UserError
from orthorank.method import attention_split
from orthorank.models.sliding_attention import IMPLEMENTATION as SLIDING

# model attention implementation -> selective backend (flash models: SDPA math, the same masking semantics)
BACKENDS: dict[str, str] = {
    "sdpa": "sdpa",
    "eager": "eager",
    "flex_attention": "flex",
    "flash_attention_2": "sdpa",
    # models/sliding_attention.py's blocked kernel: SDPA's masks, and the selective SDPA path already reads only
    # the keys a sliding layer's window reaches
    SLIDING: "sdpa",
}


def backend_for(attn_implementation: str | None, softcap: float | None = None) -> str:
    impl = attn_implementation or "sdpa"
    if impl not in BACKENDS:
        raise UserError(f"attention implementation {impl!r} is not supported by OrthoRank's selective layers; "
                        f"use one of: {', '.join(BACKENDS)}")
    backend = BACKENDS[impl]
    if softcap and impl == "flash_attention_2":
        backend = "eager"  # flash applies soft-capping; SDPA cannot
    return backend


def allowed_keys(q_pos: torch.Tensor, S: int, k_offset: int = 0, key_valid: torch.Tensor | None = None,
                 window: int | None = None) -> torch.Tensor:
    """[B, 1, K, S] bool: which keys each selected query may attend to."""
    k_pos = torch.arange(k_offset, k_offset + S, device=q_pos.device)
    m = k_pos[None, None, :] <= q_pos[:, :, None]
    if window is not None:
        m = m & (q_pos[:, :, None] - k_pos[None, None, :] < window)
    if key_valid is not None:
        m = m & key_valid[:, None, :]
    return m.unsqueeze(1)


def _and_keys(mask: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    if keep is None:
        return mask
    kk = keep[:, None, None, : mask.shape[-1]]
    return mask & kk if mask.dtype == torch.bool else mask.masked_fill(~kk, torch.finfo(mask.dtype).min)


def selective_attention(
    q: torch.Tensor,
    q_pos: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    k_offset: int = 0,
    key_valid: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    mask: torch.Tensor | None = None,
    backend: str = "sdpa",
    attn_module: nn.Module | None = None,
    max_chunks: int = 4,
    min_chunk_keys: int = 512,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if backend == "sdpa":
        return _sdpa(q, q_pos, k, v, scale, k_offset, key_valid, window, mask, max_chunks, min_chunk_keys), None
    if backend == "eager":
        return _eager(q, q_pos, k, v, scale, k_offset, key_valid, window, softcap, mask, attn_module)
    if backend == "flex":
        return _flex(q, q_pos, k, v, scale, k_offset, key_valid, window, softcap, mask), None
    raise UserError(f"unknown selective-attention backend {backend!r}; choose from sdpa, eager, flex")


def _chunks(K: int, S: int, max_chunks: int, min_chunk_keys: int) -> list[tuple[int, int]]:
    n = max(1, min(max_chunks, S // max(1, min_chunk_keys), K // 16))
    return _even(K, n)


def _even(K: int, n: int) -> list[tuple[int, int]]:
    bounds = [round(i * K / n) for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(n) if bounds[i + 1] > bounds[i]]


def _window_chunks(K: int, S: int, window: int) -> list[tuple[int, int]]:
    """A sliding-window layer's selected queries need only the keys of their window: chunks spanning about a
    quarter of a window each read 1.25 windows of keys per query, where the causal chunks read every key up to the
    chunk's end (at 32k tokens a Gemma 3 sliding layer's selective attention cost more than the dense layer's)."""
    return _even(K, max(1, min(K // 16, -(-4 * S // window))))


# At or beyond this many keys a full-attention selection layer on CPU splits each query chunk into an unmasked
# prefix and a masked diagonal (method/attention_split.py): measured on the SmolLM2 shape, the selected queries'
# attention fell from 0.43-0.48 to 0.33-0.38 of the dense causal kernel's time at 8k-32k tokens; at 4k, with chunks
# sized as below, the split was faster than the masked kernel on the SmolLM2, Gemma 3 and Llama-3-8B shapes
# (SmolLM2 0.41-0.49 against 0.48-0.57 of causal) and equal within noise on Llama-2-7B's (0.49-0.64 against
# 0.49-0.62); at 1k-2k neither won (docs/results.md). Exact either
# way (tests/harness/test_bench.py).
SPLIT_MIN_KEYS = 4096
# The CPU flash kernel cuts a call's query rows into blocks (>= 768 rows: blocks of 256, >= 192: 64, else 32; aten's
# FlashAttentionKernel.cpp) and reads every K/V block once per query block: small blocks, or a last block of a few
# rows, re-read K/V for little work. The split folds a chunk's query heads per KV head into its rows, so chunks are
# sized to fill whole 256-row blocks (at least 4 per chunk, more only where that would need more than max_chunks
# chunks), while the masked diagonals, ~1 / chunks of the work, stay small. Measured on the Gemma 3 shape at 16k
# tokens (head dim 256): 22 chunks of 983 rows (4 blocks) took 0.35 of the causal kernel's time, 21 chunks of
# 1,029 rows (4 blocks and one of 5 rows) 0.49; the SmolLM2 shape: 16 chunks of 1,014 rows 0.36-0.41, 32 chunks of
# 507 rows 0.42-0.47 (docs/results.md).
SPLIT_ROW_BLOCK = 256
SPLIT_MIN_BLOCKS = 4


def split_chunk_count(K: int, groups: int, max_chunks: int) -> int:
    """How many chunks the split path cuts K selected queries into, with `groups` query heads per KV head."""
    blocks = SPLIT_MIN_BLOCKS
    while True:
        per_chunk = max(1, SPLIT_ROW_BLOCK * blocks // groups)  # queries whose folded rows fill `blocks` blocks
        n = -(-K // per_chunk)
        if n <= max_chunks:
            return min(max_chunks, max(2, min(n, K // 16)))
        blocks += 1


def query_chunks(K: int, S: int, groups: int, window: int | None, max_chunks: int, min_chunk_keys: int,
                 can_split: bool, host_reads: bool = True) -> tuple[str, list[tuple[int, int]]]:
    """How selected queries [K] against S keys run: ("window" | "split" | "masked", query chunks). Without host
    reads (accelerators, compiled graphs) one masked call."""
    if not host_reads:
        return "masked", [(0, K)]
    if window is not None and window < S:
        return "window", (_window_chunks(K, S, window) if max_chunks > 1 else [(0, K)])
    if can_split and S >= SPLIT_MIN_KEYS and max_chunks > 1 and attention_split.available():
        return "split", _even(K, split_chunk_count(K, groups, max_chunks))
    return "masked", _chunks(K, S, max_chunks, min_chunk_keys)


def _sdpa(q, q_pos, k, v, scale, k_offset, key_valid, window, mask, max_chunks, min_chunk_keys,
          split: bool = True) -> torch.Tensor:
    """split=False keeps the masked kernel at every length (the benchmark's baseline for the split)."""
    B, K, H, hd = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qh = q.transpose(1, 2)  # [B, H, K, d]
    if mask is not None and mask.shape[1] != 1:  # a per-head mask (no HF model makes one): one call
        o = F.scaled_dot_product_attention(qh, k, v, attn_mask=_and_keys(mask, key_valid), scale=scale,
                                           enable_gqa=H > Hkv)
        return o.transpose(1, 2).reshape(B, K, H * hd)
    # Chunk bounds are read on the host: free on CPU; on accelerators that read would be a device-to-host sync per
    # layer (no CUDA graphs, a stalled launch queue), and in a compiled graph a graph break, so there the selected
    # queries take one masked call.
    host_reads = q.device.type == "cpu" and not torch.compiler.is_compiling()
    windowed = window is not None and window < S
    if mask is None and key_valid is None and not windowed and k_offset == 0 and host_reads:
        o = _contiguous_causal(qh, q_pos, k, v, scale)
        if o is not None:
            return o.transpose(1, 2).reshape(B, K, H * hd)
    can_split = split and mask is None and key_valid is None and k_offset == 0
    path, chunks = query_chunks(K, S, H // Hkv, window, max_chunks, min_chunk_keys, can_split, host_reads)
    if path == "split":
        o = attention_split.split_attention(qh, q_pos, k, v, scale, chunks)
        return o.transpose(1, 2).reshape(B, K, H * hd)
    if host_reads and (len(chunks) > 1 or windowed):  # one sync per layer
        spans = torch.stack([torch.stack([q_pos[:, a:b].amin(), q_pos[:, a:b].amax()]) for a, b in chunks]).tolist()
    else:
        spans = [(k_offset, k_offset + S - 1)]
    out = torch.empty((B, H, K, hd), dtype=q.dtype, device=q.device)
    for (a, b), (first, last) in zip(chunks, spans):
        # Keys from the window's start of the chunk's first query (0 without a window) to its last query, rounded
        # to multiples of 64 (aligned shapes for the kernels; the extra keys are masked anyway).
        hi = min(S, -(-(int(last) - k_offset + 1) // 64) * 64)
        lo = max(0, (int(first) - k_offset - window + 1) // 64 * 64) if windowed else 0
        kv = None if key_valid is None else key_valid[:, lo:hi]
        if mask is not None:
            m = _and_keys(mask[:, :, a:b, lo:hi], kv)
        else:
            m = allowed_keys(q_pos[:, a:b], hi - lo, k_offset + lo, kv, window)
        # m is [B, 1, chunk, keys]: one row per selected token, broadcast over every head (GQA in the kernel, so
        # neither K/V nor the mask is repeated per query group).
        out[:, :, a:b] = F.scaled_dot_product_attention(qh[:, :, a:b], k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=m,
                                                        scale=scale, enable_gqa=H > Hkv)
    return out.transpose(1, 2).reshape(B, K, H * hd)


# Keys ahead of every query that the causal path pads for (progressive pruning's visible sink is one).
MAX_CAUSAL_PAD = 8


def _contiguous_causal(qh, q_pos, k, v, scale) -> torch.Tensor | None:
    """Queries [B, H, K, d] at the last K of the S key positions (progressive pruning's gathered kept tokens, whose
    keys are the queries plus the sink before them): the causal kernel at S tokens with S - K placeholder queries in
    front, their outputs dropped, instead of a masked call that computes the whole square through a materialised
    mask (about twice the causal kernel's time on CPU). None where the queries are not so laid out."""
    B, H, K, d = qh.shape
    S = k.shape[2]
    pad = S - K
    if not 0 <= pad <= MAX_CAUSAL_PAD:
        return None
    if not bool((q_pos == torch.arange(pad, S, device=q_pos.device)).all()):  # a host read: callers check it's free
        return None
    if pad:
        qh = torch.cat([qh.new_zeros(B, H, pad, d), qh], dim=2)
    o = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=H > k.shape[1])
    return o[:, :, pad:]


def _eager(q, q_pos, k, v, scale, k_offset, key_valid, window, softcap, mask, attn_module):
    B, K, H, hd = q.shape
    S = k.shape[2]
    if mask is not None:
        m = _and_keys(mask[..., :S], key_valid)
    else:
        m = allowed_keys(q_pos, S, k_offset, key_valid, window)
    if m.dtype == torch.bool:
        m = torch.zeros(m.shape, dtype=q.dtype, device=q.device).masked_fill_(~m, torch.finfo(q.dtype).min)
    eager = _family_eager(attn_module)
    kwargs = {"softcap": softcap} if softcap else {}
    o, w = eager(attn_module, q.transpose(1, 2), k, v, m, dropout=0.0, scaling=scale, **kwargs)
    return o.reshape(B, K, H * hd), w


def _family_eager(attn_module: nn.Module | None) -> Callable:
    """The family's own eager attention function (soft-capping and dtype rules as the dense model has them)."""
    mod = sys.modules[type(attn_module).__module__] if attn_module is not None else None
    fn = getattr(mod, "eager_attention_forward", None)
    if fn is None:
        # lazily: the llama modeling module costs ~0.8 s to import; only families without their own need it
        from transformers.models.llama.modeling_llama import eager_attention_forward as fn
    return fn


def _flex(q, q_pos, k, v, scale, k_offset, key_valid, window, softcap, mask) -> torch.Tensor:
    B, K, H, hd = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if mask is not None:  # the model's own 4-D rows (rare under flex: a user-supplied mask)
        allowed = _and_keys(mask[..., :S], key_valid)
        if allowed.dtype != torch.bool:
            allowed = allowed > torch.finfo(allowed.dtype).min / 2
    else:
        allowed = allowed_keys(q_pos, S, k_offset, key_valid, window)
    allowed = allowed[:, 0]

    def mask_mod(b, h, qi, kj):
        return allowed[b, qi, kj]

    def softcapped(score, b, h, qi, kj):
        return torch.tanh(score / softcap) * softcap

    score_mod = softcapped if softcap else None

    block = create_block_mask(mask_mod, B, None, K, S, device=q.device)
    with warnings.catch_warnings():  # uncompiled flex runs its reference math: exact, and fine for a few rows
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        o = flex_attention(q.transpose(1, 2), k, v, score_mod=score_mod, block_mask=block, scale=scale,
                           enable_gqa=H != Hkv)
    return o.transpose(1, 2).reshape(B, K, H * hd)
