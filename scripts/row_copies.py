"""The selection layer's row copies before and after issue 57, side by side: gathering the selected rows of the
residual stream with `gather` on an index expanded to every element (before) against one `index_select` over whole
rows (`gather_rows`, now), and writing them back with `scatter_` on an expanded index against `index_copy_`
(`scatter_rows`). SmolLM2-135M's hidden size, bfloat16, the router plan's keep ratio, batch 1, one thread; both forms
give the same tensor (checked here). Interleaved rounds; per length the median of the per-round ratios old / new with
a bootstrap interval over rounds.

    .venv/bin/python scripts/row_copies.py --out scripts/results/selection-speed/row-copies.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.reports.speed import paired_ratio  # noqa: E402
from orthorank.harness.results import atomic_write_text, environment  # noqa: E402
from orthorank.harness.runtime.timing import interleaved_rounds  # noqa: E402
from orthorank.method.attention_routing import gather_rows, scatter_rows  # noqa: E402

D, RATIO = 576, 0.36328125  # SmolLM2-135M; plans/smollm2-135m/router-searched-0.2.json


def _ratio(old: list[float], new: list[float]) -> dict[str, float]:
    mid, lo, hi = paired_ratio(old, new)
    return {"median": mid, "low": lo, "high": hi}


def measure(T: int, rounds: int, calls: int) -> dict:
    g = torch.Generator().manual_seed(T)
    K = int(np.ceil(RATIO * T))
    h = torch.randn(1, T, D, generator=g).to(torch.bfloat16)
    idx = torch.randperm(T, generator=g)[:K].sort().values.unsqueeze(0)
    rows = torch.randn(1, K, D, generator=g).to(torch.bfloat16)
    expanded = idx.unsqueeze(-1).expand(1, K, D)
    assert torch.equal(h.gather(1, expanded), gather_rows(h, idx))
    assert torch.equal(h.clone().scatter_(1, expanded, rows), scatter_rows(h.clone(), idx, rows, inplace=True))
    out = h.clone()
    fns = {"gather (before)": lambda: h.gather(1, idx.unsqueeze(-1).expand(1, K, D)),
           "index_select (now)": lambda: gather_rows(h, idx),
           "scatter_ (before)": lambda: out.scatter_(1, idx.unsqueeze(-1).expand(1, K, D), rows),
           "index_copy_ (now)": lambda: scatter_rows(out, idx, rows, inplace=True)}

    def time_one(name: str) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fns[name]()
        return (time.perf_counter() - start) / calls

    times = interleaved_rounds(list(fns), time_one, rounds, warmup=1)
    ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    return {"seq_len": T, "kept": K, "median_ms": ms,
            "gather_speedup": _ratio(times["gather (before)"], times["index_select (now)"]),
            "scatter_speedup": _ratio(times["scatter_ (before)"], times["index_copy_ (now)"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1024,4096,8192")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    runs = [measure(int(T), args.rounds, args.calls) for T in args.lengths.split(",")]
    for r in runs:
        g, s = r["gather_speedup"], r["scatter_speedup"]
        ms = ", ".join(f"{k} {v:.3f} ms" for k, v in r["median_ms"].items())
        print(f"{r['seq_len']:6d} tokens: gather {g['median']:.1f}x [{g['low']:.1f}, {g['high']:.1f}], scatter "
              f"{s['median']:.1f}x [{s['low']:.1f}, {s['high']:.1f}]  ({ms})")
    if args.out:
        body = {"what": "row copies of a selection layer, before and after issue 57", "hidden": D, "ratio": RATIO,
                "dtype": "bfloat16", "threads": 1, "rounds": args.rounds, "calls_per_round": args.calls,
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()], "runs": runs, "environment": environment("cpu")}
        atomic_write_text(args.out, json.dumps(body, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
