"""Would a block-sparse kernel run the selected queries' attention nearer its FLOPs on CPU? FlexAttention compiled
by Inductor (it skips key blocks that are fully masked) against the dense causal kernel and the split path that
selection layers use (method/attention_split.py), on random q/k/v of the SmolLM2 shape, a third of the queries.

    .venv/bin/python scripts/flex_selected.py --seq-len 4096 --out scripts/results/length-profile/flex-4k.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.method import attention_split  # noqa: E402
from orthorank.method.attention import _even, split_chunk_count  # noqa: E402
from orthorank.method.selection import keep_count  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402

H, HKV, HD = 9, 3, 64  # SmolLM2-135M: query heads, KV heads, head dim


def measure(T: int, rounds: int, block: int) -> dict:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, T, HD, generator=g) for n in (H, HKV, HKV))
    K = keep_count(T, 0.33)
    idx = torch.sort(torch.randperm(T - 1, generator=g)[:K] + 1).values[None]  # the sink (0) never selected
    qs = q.gather(2, idx[:, None, :, None].expand(1, H, K, HD))
    scale = HD ** -0.5
    pos = idx[0]
    block_mask = create_block_mask(lambda b, h, qi, kj: pos[qi] >= kj, 1, 1, K, T, device="cpu", BLOCK_SIZE=block)
    flex = torch.compile(flex_attention, dynamic=False)
    chunks = _even(K, split_chunk_count(K, H // HKV, 32))
    fns = {"causal": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                                               enable_gqa=True),
           "split": lambda: attention_split.split_attention(qs, idx, k, v, scale, chunks),
           "flex": lambda: flex(qs, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)}
    start = time.perf_counter()
    max_diff = (fns["split"]() - fns["flex"]()).abs().max().item()  # the first flex call compiles
    compile_s = time.perf_counter() - start
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    causal = statistics.median(times["causal"])
    return {"shape": "smollm2-135m", "seq_len": T, "selected": K, "block_size": block, "causal_ms": 1e3 * causal,
            "of_causal": {n: statistics.median(t) / causal for n, t in times.items()},
            "max_abs_diff_flex_vs_split": max_diff, "first_calls_s": compile_s, "times_s": times}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=128, help="FlexAttention block size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the result JSON here")
    args = ap.parse_args(argv)
    if not attention_split.available():
        print("error: this torch has no CPU flash kernel returning the log-sum-exp", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    row = measure(args.seq_len, args.rounds, args.block)
    print(f"{args.seq_len} tokens: selected queries' attention, of the causal kernel's {row['causal_ms']:.1f} ms: "
          f"split {row['of_causal']['split']:.3f}, compiled FlexAttention {row['of_causal']['flex']:.3f} "
          f"(max |flex - split| {row['max_abs_diff_flex_vs_split']:.1e}; first calls {row['first_calls_s']:.1f} s)")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps({**row, "environment": environment("cpu")}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
