"""Scoring a selection layer's tokens in cache-sized blocks against one pass over the whole input (issue 57, item 3).

A router's score (method/router.py) and the paper's sink dot product (method/orthogonality.py) sum in float32 over a
bfloat16 input. Converting the whole [T, D] input at once writes and re-reads a float32 copy that does not fit in
cache; converting SCORE_ROWS tokens at a time keeps it there (the library does so from SCORE_BLOCKS_FROM tokens on, so
below that both rows run one pass). This times both on random inputs of SmolLM2-135M's
shape (a random router), one thread, interleaved rounds, and checks that they give the same bits.

    .venv/bin/python scripts/score_rows.py --out scripts/results/selection-speed/score-rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.reports.speed import paired_ratio  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.harness.runtime.timing import interleaved_rounds  # noqa: E402
from orthorank.method.orthogonality import SCORE_ROWS, sink_scores  # noqa: E402
from orthorank.method.router import extra_features, random_router  # noqa: E402


def one_pass_router(r, src, hidden, sink):
    """The router's score as it was: one float32 copy of the whole input."""
    w_x, w_e, b = r.folded(src.device)
    B, T, D = src.shape
    xf = src.float()
    return torch.mv(xf.reshape(B * T, D), w_x).view(B, T) + extra_features(xf, hidden, sink) @ w_e + b


def one_pass_rule(src, sink):
    return torch.mv(src[0].float(), sink[0].float()).abs()[None]


def measure(T: int, D: int, rounds: int) -> dict:
    g = torch.Generator().manual_seed(T)
    src = torch.randn(1, T, D, generator=g).bfloat16()
    hidden = (torch.randn(1, T, D, generator=g) * 3).bfloat16()
    sink = src[:, 0]
    r = random_router([0], D).layers[0]
    fns = {"router_one_pass": lambda: one_pass_router(r, src, hidden, sink),
           "router_blocks": lambda: r.score(src, hidden, sink),
           "rule_one_pass": lambda: one_pass_rule(src, sink),
           "rule_blocks": lambda: sink_scores(src, sink)}
    same = {"router": bool(torch.equal(fns["router_one_pass"](), fns["router_blocks"]())),
            "rule": bool(torch.equal(fns["rule_one_pass"](), fns["rule_blocks"]()))}

    def time_one(name: str) -> float:
        start = time.perf_counter()
        fns[name]()
        return time.perf_counter() - start

    times = interleaved_rounds(list(fns), time_one, rounds, warmup=1)
    row = {"seq_len": T, "hidden": D, "same_bits": same,
           "ms": {k: round(sorted(v)[len(v) // 2] * 1e3, 3) for k, v in times.items()}}
    for kind in ("router", "rule"):
        mid, lo, hi = paired_ratio(times[f"{kind}_one_pass"], times[f"{kind}_blocks"])
        row[f"{kind}_speedup"] = {"median": round(mid, 3), "low": round(lo, 3), "high": round(hi, 3)}
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    for T in (int(x) for x in args.lengths.split(",")):
        row = measure(T, args.hidden, args.rounds)
        rows.append(row)
        print(f"{T:5d} tokens: router {row['ms']['router_one_pass']:.2f} -> {row['ms']['router_blocks']:.2f} ms "
              f"({row['router_speedup']['median']:.2f}x [{row['router_speedup']['low']:.2f}, "
              f"{row['router_speedup']['high']:.2f}]); rule {row['ms']['rule_one_pass']:.2f} -> "
              f"{row['ms']['rule_blocks']:.2f} ms; same bits {row['same_bits']}", flush=True)
    if args.out:
        body = {"command": " ".join(["scripts/score_rows.py", *sys.argv[1:]]), "rounds": args.rounds, "threads": args.threads,
                "score_rows": SCORE_ROWS, "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()], "rows": rows, "environment": environment("cpu")}
        atomic_write_text(args.out, json.dumps(body, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
