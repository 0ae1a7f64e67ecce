"""How far bfloat16 perplexities move from float32 on this CPU, and how much faster they come.

Two `orthorank compare` runs of the same rows (dense and the committed plans) on the same windows, one per dtype,
through the result store; this script only pairs them: for each row and dataset the ratio ppl(bf16) / ppl(fp32)
over the same windows with its 95% paired bootstrap interval, and each run's wall time.

    .venv/bin/python scripts/bf16_vs_fp32.py --windows 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("bfloat16", "float32")
DATASETS = ("wikitext2", "c4")


def run_compare(args, dtype: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "orthorank.harness.cli.main", "compare", "--model", args.model, "--dtype", dtype,
           "--threads", str(args.threads), "--methods", args.methods, "--sparsity", args.sparsity, "--datasets",
           ",".join(DATASETS), "--seq-len", str(args.seq_len), "--max-windows", str(args.windows), "--plans-dir",
           args.plans_dir, "--store", args.store, "--out", str(out), "--overwrite"]
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return json.loads((out / "compare.json").read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--windows", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--methods", default="dense,sleb,orthorank")
    p.add_argument("--sparsity", default="0.2")
    p.add_argument("--plans-dir", default=str(ROOT / "plans/smollm2-135m"))
    p.add_argument("--store", default=str(ROOT / "scripts/results/store"))
    p.add_argument("--out", default=str(ROOT / "scripts/results/bf16-vs-fp32"))
    args = p.parse_args()

    from orthorank.harness.evaluation.stats import paired_perplexity_ratio, perplexity_interval
    from orthorank.harness.results import atomic_write_text, environment

    out = Path(args.out)
    runs = {d: run_compare(args, d, out / d) for d in DTYPES}
    lines = [f"bfloat16 vs float32 on the CPU: first {args.windows} windows of {args.seq_len} tokens (a slice), 95% "
             "bootstrap intervals; ratio = ppl(bf16) / ppl(fp32), paired over windows", "",
             "| plan | dataset | fp32 ppl | bf16 ppl | ratio [95% CI] |", "|---|---|---|---|---|"]
    rows = []
    fp32 = {(r["method"], r["level"]): r for r in runs["float32"]["rows"]}
    for r16 in runs["bfloat16"]["rows"]:
        r32 = fp32[(r16["method"], r16["level"])]
        label = r16["method"] if r16["method"] == "dense" else f"{r16['method']}-{r16['level']:g}"
        for d in DATASETS:
            a, b = r16[d]["window_nll"], r32[d]["window_nll"]
            tokens = r16[d]["tokens_per_window"]
            ratio = paired_perplexity_ratio(a, b, tokens)
            pa, pb = perplexity_interval(a, tokens), perplexity_interval(b, tokens)
            rows.append({"plan": label, "dataset": d, "fp32": pb.to_dict(), "bf16": pa.to_dict(),
                         "ratio": ratio.to_dict()})
            lines.append(f"| {label} | {d} | {pb.value:.3f} | {pa.value:.3f} | {ratio.text('.4f')} |")
    seconds = {d: runs[d]["seconds"] for d in DTYPES}
    lines += ["", f"Wall time of each dtype's evaluation of these rows, {args.threads} thread(s) (the result store "
              f"skips windows computed before): " + ", ".join(f"{d} {json.dumps(seconds[d])}" for d in DTYPES)]
    atomic_write_text(out / "bf16-vs-fp32.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "bf16-vs-fp32.json", json.dumps({"rows": rows, "seconds": seconds,
                                                             "settings": vars(args),
                                                             "environment": environment("cpu")}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
