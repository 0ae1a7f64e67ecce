"""Would an exact windowed kernel make Gemma 3's sliding-window layers cheap on CPU? transformers runs a sliding
layer's attention as SDPA over every key with a band mask; this times that against one batched SDPA call over
256-query blocks, each with only the 511 keys before it and its own (the same band mask, per block), on random
bfloat16 q/k/v of Gemma 3 270M's shape (4 query heads, 1 KV head, d 256, window 512), one thread. Exact up to
rounding (the float32 error against the band-masked reference is printed).

    .venv/bin/python benchmarks/sliding_kernel.py --out studies/long-prompt/speed/sliding-kernel.json
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

from local_kernel import best_of  # noqa: E402  (this folder: the timing both kernel scripts share)
from orthorank.results import atomic_write_text, environment  # noqa: E402

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
        t_band = best_of(lambda: band_masked(qb, kb, vb, WINDOW, s), args.rounds)
        t_blocked = best_of(lambda: blocked(qb, kb, vb, WINDOW, s), args.rounds)
        row = {"seq_len": N, "band_masked_ms": round(t_band * 1e3, 1), "blocked_ms": round(t_blocked * 1e3, 1),
               "speedup": round(t_band / t_blocked, 2), "max_abs_error_float32": err}
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
