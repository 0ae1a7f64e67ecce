"""How many query chunks the prefix/diagonal split should use: the selected queries' attention alone, split into
each given number of chunks, against the dense causal kernel on the same random q/k/v (interleaved rounds, the
order rotated each round). method/attention.py's `split_chunk_count` was chosen from these sweeps.

    .venv/bin/python scripts/split_chunks.py --shape gemma-full --seq-len 16384 --chunks 16,21,22,24 \\
        --out scripts/results/length-profile/chunk-sweeps/gemma-16k.json
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

# query heads, KV heads, head dim
SHAPES = {"smollm2": (9, 3, 64), "gemma-full": (4, 1, 256), "llama3-8b": (32, 8, 128), "llama2-7b": (32, 32, 128)}


def sweep(shape: str, T: int, counts: list[int], rounds: int, ratio: float = 0.33) -> dict:
    H, Hkv, hd = SHAPES[shape]
    G = H // Hkv
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, T, hd, generator=g) for n in (H, Hkv, Hkv))
    K = keep_count(T, ratio)
    idx = torch.sort(torch.randperm(T - 1, generator=g)[:K] + 1).values[None]  # the sink (0) never selected
    qs = q.gather(2, idx[:, None, :, None].expand(1, H, K, hd))
    scale = hd ** -0.5
    fns = {"causal": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                                               enable_gqa=H > Hkv)}
    for c in counts:
        fns[str(c)] = (lambda ch=_even(K, c): attention_split.split_attention(qs, idx, k, v, scale, ch))
    times: dict[str, list[float]] = {n: [] for n in fns}
    for f in fns.values():
        f()
    for r in range(rounds):
        order = list(fns.items())
        for name, f in order[r % len(order):] + order[:r % len(order)]:
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    causal = statistics.median(times["causal"])
    return {"shape": shape, "seq_len": T, "selected": K, "groups": G, "head_dim": hd, "causal_ms": 1e3 * causal,
            "chosen_by_split_chunk_count": split_chunk_count(K, G, 32),
            "split_of_causal": {c: statistics.median(times[str(c)]) / causal for c in counts},
            "split_of_causal_range": {c: [min(times[str(c)]) / causal, max(times[str(c)]) / causal] for c in counts},
            "folded_rows_per_chunk": {c: -(-K // c) * G for c in counts}, "times_s": times}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--chunks", default="8,16,32", help="chunk counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the result JSON here")
    args = ap.parse_args(argv)
    if not attention_split.available():
        print("error: this torch has no CPU flash kernel returning the log-sum-exp", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    row = sweep(args.shape, args.seq_len, [int(c) for c in args.chunks.split(",")], args.rounds)
    for c, x in row["split_of_causal"].items():
        lo, hi = row["split_of_causal_range"][c]
        print(f"{args.shape} {args.seq_len}: {c:>3} chunks of {row['folded_rows_per_chunk'][c]:>5} rows: "
              f"{x:.3f} of causal [{lo:.3f}-{hi:.3f}]")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps({**row, "environment": environment("cpu")}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
