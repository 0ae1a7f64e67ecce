"""How much OrthoRank's plan and its perplexity move with the calibration sample (issue: robust plans).

For each calibration size (samples x tokens) and seed, run `orthorank calibrate --method orthorank` (compute-matched
10% and 20%), then evaluate every plan on the same first N windows of WikiText-2 and C4 (seq-len 2048) through
the result store, with bootstrap intervals. Resumable: existing plan files and stored windows are reused.

    .venv/bin/python scripts/calibration_spread.py            # defaults below; writes summary.json / .md
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_calibrate(args, samples: int, seq_len: int, seed: int, out_dir: Path) -> None:
    wanted = [out_dir / f"orthorank-{s}.json" for s in args.sparsity.split(",")]
    if all(p.is_file() for p in wanted):
        return
    committed = [ROOT / "plans/smollm2-135m" / p.name for p in wanted]
    if all(_same_calibration(p, samples, seq_len, seed) for p in committed):
        # the committed default plans came from this very search (same settings and seed): reuse them
        out_dir.mkdir(parents=True, exist_ok=True)
        for src, dst in zip(committed, wanted):
            dst.write_text(src.read_text())
        return
    cmd = [sys.executable, "-m", "orthorank.harness.cli.main", "calibrate", "--model", "smollm2-135m", "--method", "orthorank",
           "--sparsity", args.sparsity, "--calib-samples", str(samples), "--seq-len", str(seq_len),
           "--seed", str(seed), "--dtype", args.dtype, "--threads", str(args.threads), "--out", str(out_dir),
           "--overwrite"]
    if args.exhaustive:
        cmd.append("--exhaustive")
    elif seq_len >= 1024:  # larger calibration sets: screen a quarter of the windows, re-check the contenders
        cmd += ["--screen-fraction", "0.25"]
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def _same_calibration(path: Path, samples: int, seq_len: int, seed: int) -> bool:
    if not path.is_file():
        return False
    prov = json.loads(path.read_text()).get("provenance", {})
    cal = prov.get("calibration", {})
    return (cal.get("samples"), cal.get("seq_len"), cal.get("seed"), cal.get("data")) == (samples, seq_len, seed, "c4") \
        and prov.get("search_mode") == "exhaustive" and prov.get("match") == "compute"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="8x256,4x2048", help="calibration sizes, samples x tokens")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--sparsity", default="0.1,0.2")
    p.add_argument("--eval-windows", type=int, default=20, help="first N windows of each test set (seq-len 2048)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--exhaustive", action="store_true", help="exhaustive greedy instead of the default screening")
    p.add_argument("--search-only", action="store_true", help="make the plans, evaluate nothing")
    p.add_argument("--out", default=str(ROOT / "scripts/results/calibration-spread"))
    p.add_argument("--store", default=str(ROOT / "scripts/results/store"))
    args = p.parse_args()

    out = Path(args.out)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    plan_dirs = {(n, t, seed): out / "plans" / f"{n}x{t}-seed{seed}" for (n, t), seed in itertools.product(sizes, seeds)}
    for (n, t, seed), d in plan_dirs.items():
        run_calibrate(args, n, t, seed, d)
    if args.search_only:
        return 0

    from orthorank.harness.results import atomic_write_text, environment

    # Each calibration's plans are evaluated by `orthorank compare` (through the result store); dense once.
    rows = [_rows(args, "dense", None, None, run_compare(args, "dense", None, out / "eval" / "dense"))[0]]
    for (n, t, seed), d in plan_dirs.items():
        rows += _rows(args, f"{n}x{t}", seed, d, run_compare(args, "orthorank", d, out / "eval" / d.name))
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_nll")}), flush=True)
    summary = summarize(rows, sizes, args)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.json", json.dumps({"rows": rows, "summary": summary, "settings": vars(args),
                                                        "environment": environment("cpu")}, indent=1) + "\n")
    atomic_write_text(out / "summary.md", summary["markdown"] + "\n")
    print(summary["markdown"])
    return 0


def run_compare(args, method: str, plans: Path | None, out: Path) -> dict:
    cmd = [sys.executable, "-m", "orthorank.harness.cli.main", "compare", "--model", "smollm2-135m", "--dtype", args.dtype,
           "--threads", str(args.threads), "--methods", method, "--datasets", "wikitext2,c4", "--seq-len", "2048",
           "--max-windows", str(args.eval_windows), "--store", args.store, "--out", str(out), "--overwrite"]
    if plans is not None:
        cmd += ["--sparsity", args.sparsity, "--plans-dir", str(plans)]
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads((out / "compare.json").read_text())


def _rows(args, size: str, seed: int | None, plans: Path | None, result: dict) -> list[dict]:
    """compare.json rows -> this study's rows (interval and window NLLs per dataset)."""
    out = []
    for r in result["rows"]:
        plan = json.loads((plans / f"orthorank-{r['level']:g}.json").read_text()) if plans is not None else None
        row = {"size": size, "seed": seed, "sparsity": r["level"] if plans is not None else None,
               "layers": r["layers"], "compute_sparsity": r["sparsity"]["compute"],
               "search_seconds": plan["provenance"].get("search_seconds") if plan else None}
        for d in ("wikitext2", "c4"):
            lo, hi = r[d]["ci95"]
            row[d] = {"value": r[d]["perplexity"], "low": lo, "high": hi, "level": 0.95}
            row[f"{d}_nll"] = r[d]["window_nll"]
        out.append(row)
    return out


def summarize(rows, sizes, args) -> dict:
    lines = [f"Calibration spread: OrthoRank plans (compute-matched) from {len(args.seeds.split(','))} seeds per "
             f"calibration size, each evaluated on the first {args.eval_windows} windows of 2048 tokens of "
             "WikiText-2 and C4 (a slice; 95% bootstrap intervals over windows).", "",
             "| calibration | sparsity | seed | layers | search s | wikitext2 | c4 |", "|---|---|---|---|---|---|---|"]
    out = {"per_size": {}}
    for r in rows:
        if r["size"] == "dense":
            cells = ["dense", "0", "-", "-", "-"]
        else:
            cells = [r["size"], f"{r['sparsity']:g}", str(r["seed"]), ",".join(map(str, r["layers"])),
                     f"{r['search_seconds']:.0f}"]
        for d in ("wikitext2", "c4"):
            ci = r[d]
            cells.append(f"{ci['value']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| calibration | sparsity | distinct layers over seeds | layers in every seed | wikitext2 range | "
              "c4 range |", "|---|---|---|---|---|---|"]
    for (n, t) in sizes:
        size = f"{n}x{t}"
        for s in sorted({r["sparsity"] for r in rows if r["size"] == size}):
            rs = [r for r in rows if r["size"] == size and r["sparsity"] == s]
            sets = [set(r["layers"]) for r in rs]
            union, inter = set().union(*sets), set.intersection(*sets)
            w = [r["wikitext2"]["value"] for r in rs]
            c = [r["c4"]["value"] for r in rs]
            out["per_size"][f"{size}@{s:g}"] = {"union": sorted(union), "common": sorted(inter),
                                                "wikitext2": [min(w), max(w)], "c4": [min(c), max(c)]}
            lines.append(f"| {size} | {s:g} | {len(union)} | {len(inter)} of {len(rs[0]['layers'])} | "
                         f"{min(w):.2f}-{max(w):.2f} | {min(c):.2f}-{max(c):.2f} |")
    out["markdown"] = "\n".join(lines)
    return out


if __name__ == "__main__":
    sys.exit(main())
