"""Would local attention's prefill kernel run nearer its keys-read ideal with every block batched into two calls?
A prototype (not the library's kernel): all whole blocks past the sinks' reach in one unmasked prefix call (sinks +
window keys) and one causal call over each block's own keys, merged by their log-sum-exps (method/attention_split.py's
merge), against method/local_attention.py's kernel (one causal call per 256-query block with placeholder queries)
and the dense causal kernel, on random bfloat16 q/k/v of a full-attention layer's shape, one thread.

    .venv/bin/python scripts/local_kernel.py --out studies/long-prompt/speed/local-kernel.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.method.attention_split import _flash  # noqa: E402
from orthorank.method.local_attention import LocalAttention, local_attention, mean_keys_read  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402

SHAPES = {"smollm2-135m": (9, 3, 64), "gemma3-270m": (4, 1, 256)}  # query heads, KV heads, head dim


def batched_local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, cfg: LocalAttention) -> torch.Tensor:
    """Every whole block past the sinks' reach in one prefix call (sinks + window, unmasked, grouped heads folded
    into the queries) and one causal diagonal call (the block's own keys), merged by log-sum-exp; the first blocks,
    a last partial block and the tail as method/local_attention.py runs them."""
    B, H, N, d = q.shape
    Hkv = k.shape[1]; G = H // Hkv
    S, W, C = cfg.sinks, cfg.window, cfg.block
    context = max(0, N - cfg.tail)
    out = torch.empty_like(q)
    # regular blocks: a - W >= S, whole (b - a == C)
    first = -(-(S + W) // C) * C  # first block start with a - W >= S
    nblk = max(0, (context - first) // C)
    done_to = first + nblk * C
    # irregular blocks (head and last partial): the existing kernel on those query ranges
    def one(a, b):
        lo = max(S, a - W)
        if lo <= S:
            kk, vv = k[:, :, :b], v[:, :, :b]
        else:
            kk, vv = torch.cat([k[:, :, :S], k[:, :, lo:b]], 2), torch.cat([v[:, :, :S], v[:, :, lo:b]], 2)
        pad = kk.shape[2] - (b - a)
        qq = torch.cat([q.new_zeros(B, H, pad, d), q[:, :, a:b]], 2) if pad else q[:, :, a:b]
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale, enable_gqa=H != Hkv)
        out[:, :, a:b] = o[:, :, pad:]
    for a in range(0, min(first, context), C):
        one(a, min(a + C, context))
    if nblk:
        a0 = first
        # prefix keys per block: sinks + [a - W, a)
        kw = k[:, :, a0 - W: a0 - W + (nblk - 1) * C + W].unfold(2, W, C)  # [B, Hkv, nblk, d, W]
        vw = v[:, :, a0 - W: a0 - W + (nblk - 1) * C + W].unfold(2, W, C)
        kw = kw.permute(0, 2, 1, 4, 3)  # [B, nblk, Hkv, W, d]
        vw = vw.permute(0, 2, 1, 4, 3)
        ks = k[:, None, :, :S].expand(B, nblk, Hkv, S, d)
        vs = v[:, None, :, :S].expand(B, nblk, Hkv, S, d)
        kp = torch.cat([ks, kw], 3).reshape(B * nblk, Hkv, S + W, d)
        vp = torch.cat([vs, vw], 3).reshape(B * nblk, Hkv, S + W, d)
        qb = q[:, :, a0:done_to].reshape(B, Hkv, G, nblk, C, d).permute(0, 3, 1, 2, 4, 5).reshape(B * nblk, Hkv, G * C, d)
        o_p, lse_p = _flash(qb, kp, vp, scale)
        # diagonal: the block's own keys, causal
        kd = k[:, :, a0:done_to].reshape(B, Hkv, nblk, C, d).permute(0, 2, 1, 3, 4).reshape(B * nblk, Hkv, C, d)
        vd = v[:, :, a0:done_to].reshape(B, Hkv, nblk, C, d).permute(0, 2, 1, 3, 4).reshape(B * nblk, Hkv, C, d)
        qd = qb.reshape(B * nblk, Hkv * G, C, d)  # heads h = kv * G + g
        kd_h = kd.repeat_interleave(G, 1) if G > 1 else kd
        vd_h = vd.repeat_interleave(G, 1) if G > 1 else vd
        o_d, lse_d = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qd, kd_h, vd_h, 0.0, True, scale=scale)
        o_p = o_p.reshape(B * nblk, H, C, d); lse_p = lse_p.reshape(B * nblk, H, C)
        both = torch.logaddexp(lse_p, lse_d)
        o = (o_p.float() * torch.exp(lse_p - both)[..., None] + o_d.float() * torch.exp(lse_d - both)[..., None]).to(q.dtype)
        out[:, :, a0:done_to] = o.reshape(B, nblk, H, C, d).permute(0, 2, 1, 3, 4).reshape(B, H, nblk * C, d)
    for a in range(done_to, context, C):
        one(a, min(a + C, context))
    if context < N:
        k_pos = torch.arange(N, device=q.device)
        mask = k_pos[None, :] <= k_pos[context:, None]
        out[:, :, context:] = F.scaled_dot_product_attention(q[:, :, context:], k, v, attn_mask=mask[None, None], scale=scale, enable_gqa=H != Hkv)
    return out


def best_of(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = LocalAttention()
    rows = []
    for model, (H, Hkv, d) in SHAPES.items():
        for N in (int(x) for x in args.lengths.split(",")):
            g = torch.Generator().manual_seed(0)
            q = torch.randn(1, H, N, d, generator=g).bfloat16()
            k, v = (torch.randn(1, Hkv, N, d, generator=g).bfloat16() for _ in range(2))
            s = d ** -0.5
            ref = local_attention(q.float(), k.float(), v.float(), scale=s, cfg=cfg)
            old, new = local_attention(q, k, v, scale=s, cfg=cfg), batched_local(q, k, v, scale=s, cfg=cfg)
            causal = best_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s,
                                                                    enable_gqa=H != Hkv), args.rounds)
            t_old = best_of(lambda: local_attention(q, k, v, scale=s, cfg=cfg), args.rounds)
            t_new = best_of(lambda: batched_local(q, k, v, scale=s, cfg=cfg), args.rounds)
            row = {"model_shape": model, "seq_len": N, "causal_ms": round(causal * 1e3, 1),
                   "library_fraction_of_causal": round(t_old / causal, 3),
                   "batched_fraction_of_causal": round(t_new / causal, 3),
                   "keys_read_ideal_fraction": round(mean_keys_read(N, cfg) / ((N + 1) / 2), 3),
                   "max_abs_error_vs_float32": {"library": float((old.float() - ref).abs().max()),
                                                "batched": float((new.float() - ref).abs().max())}}
            rows.append(row)
            print(json.dumps(row))
    if args.out:
        atomic_write_text(Path(args.out), json.dumps({"command": " ".join(sys.argv), "rounds": args.rounds,
                                                      "threads": 1, "rows": rows, "environment": environment("cpu")},
                                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
