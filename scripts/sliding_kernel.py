"""Would an exact windowed kernel make Gemma 3's sliding-window layers cheap on CPU? transformers runs a sliding
layer's attention as SDPA over every key with a band mask; this times that against one batched SDPA call over
256-query blocks, each with only the 511 keys before it and its own (the same band mask, per block), on random
bfloat16 q/k/v of Gemma 3 270M's shape (4 query heads, 1 KV head, d 256, window 512), one thread. Exact up to
rounding (the float32 error against the band-masked reference is printed).

    .venv/bin/python scripts/sliding_kernel.py --out studies/long-prompt/speed/sliding-kernel.json

Since issue 57 the library's kernel (models/sliding_attention.py: `blocked_sliding_attention`, transformers' own SDPA
function per block on the model's mask sliced to the band) is timed beside transformers' SDPA function on the whole
band mask, which is what a Gemma 3 sliding layer runs: `model_sdpa_ms`, `library_blocked_ms`, `library_speedup`, and
the library's float32 error against it. The rows are interleaved (each round times every kernel once) and each
figure is the best of its rounds: a kernel figure, never mixed into a method's speed-up.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.models.sliding_attention import blocked_sliding_attention  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402

H, HKV, D, WINDOW = 4, 1, 256, 512  # Gemma 3 270M


def band_masked(q, k, v, W, s):
    """Every key, a band mask: what the model's SDPA path computes for a sliding layer."""
    N = q.shape[2]
    i = torch.arange(N)
    mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - W)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], scale=s,
                                          enable_gqa=q.shape[1] != k.shape[1])


def blocked(q, k, v, W, s, C=256):
    """Each block of C queries against the W - 1 keys before it and its own, all blocks in one call."""
    B, H, N, d = q.shape; Hkv = k.shape[1]
    out = torch.empty_like(q)
    nb = N // C
    # keys for block b: [b*C - W + 1 + ... ] -> take L = W - 1 + C keys ending at block end, pad front with zeros
    pad = W - 1
    kp = torch.cat([k.new_zeros(B, Hkv, pad, d), k], 2); vp = torch.cat([v.new_zeros(B, Hkv, pad, d), v], 2)
    L = pad + C
    kb = kp[:, :, :nb * C + pad].unfold(2, L, C).permute(0, 2, 1, 4, 3).reshape(B * nb, Hkv, L, d)
    vb = vp[:, :, :nb * C + pad].unfold(2, L, C).permute(0, 2, 1, 4, 3).reshape(B * nb, Hkv, L, d)
    qb = q[:, :, :nb * C].reshape(B, H, nb, C, d).permute(0, 2, 1, 3, 4).reshape(B * nb, H, C, d)
    r = torch.arange(C)[:, None]; c = torch.arange(L)[None, :]
    m = (c <= r + pad) & (c > r + pad - W)  # query r sits at key column r + pad
    mb = m[None, None].expand(B * nb, 1, C, L).clone()
    for blk in range(nb):  # the zero padding in front of the first W - 1 keys
        if pad - blk * C <= 0:
            break
        mb[blk, :, :, :pad - blk * C] = False
    mb = mb.reshape(B, nb, 1, C, L)
    # padded keys exist only in the first block (for N >= W); mask them there
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mb.reshape(B * nb, 1, C, L), scale=s, enable_gqa=H != Hkv)
    out[:, :, :nb * C] = o.reshape(B, nb, H, C, d).permute(0, 2, 1, 3, 4).reshape(B, H, nb * C, d)
    if nb * C < N:
        a = nb * C; i = torch.arange(N)
        mask = (i[None, :] <= i[a:, None]) & (i[None, :] > i[a:, None] - W)
        out[:, :, a:] = F.scaled_dot_product_attention(q[:, :, a:], k, v, attn_mask=mask[None, None], scale=s, enable_gqa=H != Hkv)
    return out

class _Layer:
    """What transformers' SDPA function reads off a Gemma 3 sliding attention module."""

    num_key_value_groups = H // HKV
    is_causal = True
    sliding_window = WINDOW
    training = False


def model_sdpa(q, k, v, mask, s):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS["sdpa"](_Layer(), q, k, v, mask, scaling=s)[0]


def library(q, k, v, mask, s):
    return blocked_sliding_attention(_Layer(), q, k, v, mask, scaling=s)[0]


def interleaved_best(fns: dict, rounds: int) -> dict[str, float]:
    import time

    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="2048,4096,8192")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for N in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, H, N, D, generator=g)
        k, v = (torch.randn(1, HKV, N, D, generator=g) for _ in range(2))
        s = D ** -0.5
        err = float((blocked(q, k, v, WINDOW, s) - band_masked(q, k, v, WINDOW, s)).abs().max())  # float32
        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
        i = torch.arange(N)
        band = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - WINDOW))[None, None]
        lib_err = float((library(q, k, v, band, s) - model_sdpa(q, k, v, band, s)).abs().max())  # float32
        t = interleaved_best({"band": lambda: band_masked(qb, kb, vb, WINDOW, s),
                              "blocked": lambda: blocked(qb, kb, vb, WINDOW, s),
                              "model": lambda: model_sdpa(qb, kb, vb, band, s),
                              "library": lambda: library(qb, kb, vb, band, s)}, args.rounds)
        row = {"seq_len": N, "band_masked_ms": round(t["band"] * 1e3, 1), "blocked_ms": round(t["blocked"] * 1e3, 1),
               "speedup": round(t["band"] / t["blocked"], 2), "max_abs_error_float32": err,
               "model_sdpa_ms": round(t["model"] * 1e3, 1), "library_blocked_ms": round(t["library"] * 1e3, 1),
               "library_speedup": round(t["model"] / t["library"], 2), "library_max_abs_error_float32": lib_err}
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        atomic_write_text(Path(args.out), json.dumps({"command": " ".join(sys.argv), "rounds": args.rounds,
                                                      "threads": 1, "shape": {"heads": H, "kv_heads": HKV,
                                                                              "head_dim": D, "window": WINDOW},
                                                      "rows": rows, "environment": environment("cpu")},
                                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
