"""The transfer study (issue: plans that hold on text they were not fitted to).

For every calibration setting (source x size) it fits SLEB, ShortGPT, Shortened-PPL, OrthoRank (exactly
compute-matched) and the hybrid plan at 10% and 20% into plans/smollm2-135m/transfer/<setting>/, evaluates them
with `orthorank compare` on every domain (wikitext2, c4, code, news; SEQ_LEN-token windows, the first WINDOWS of each)
into benchmarks/results/transfer-smollm2-135m/<setting>/, and renders the matrix: per method, sparsity, calibration
and evaluation domain, the paired perplexity ratio against SLEB calibrated on the same source, the worst-domain
ratio, and the gap between a method's in-domain and out-of-domain ratios; one heat map per sparsity.

Everything resumes: searches from their checkpoints, evaluations from the result store, and a finished step (its
plan files or compare.json present) is skipped. Run it again to go on where it stopped:
    .venv/bin/python benchmarks/transfer.py run [--only c4-8k,...]
    .venv/bin/python benchmarks/transfer.py matrix
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
PLANS = ROOT / "plans" / MODEL / "transfer"
OUT = ROOT / "benchmarks" / "results" / f"transfer-{MODEL}"
STORE = ROOT / "benchmarks" / "results" / "store"
# The hybrid search's cost table: this study's dtype and evaluation length on the machine that runs it (measured
# with the searches paused: `orthorank bench --dtype float32 --threads 2 --batch 1 --seq-len 512 --warmup 1
# --repeats 15 --cost-layers 1,15,28 --cost-table <this>`).
COST_TABLE = ROOT / "benchmarks" / "results" / "transfer-smollm2-135m" / "cost-table.json"
SEQ_LEN = 512  # evaluation windows, and the length at which compute is matched
WINDOWS = 32
DOMAINS = ("wikitext2", "c4", "code", "news")
SPARSITIES = "0.1,0.2"
# (setting, calibration source, tokens): the four sources at 8K, then C4 at 2K and 32K (the size effect).
SETTINGS = [("c4-8k", "c4", 8192), ("mix-8k", "mix", 8192), ("code-8k", "code", 8192),
            ("wikitext2-8k", "wikitext2", 8192), ("c4-2k", "c4", 2048), ("c4-32k", "c4", 32768)]
METHODS = ("sleb", "shortgpt", "shortened-ppl", "orthorank", "hybrid")
# Greedy searches screen every candidate on the first 2K calibration tokens and re-check the contenders on all of
# them: the screening cost stays that of a 2K search whatever the calibration size (8K: 0.25, 32K: 0.0625).
SCREEN_TOKENS = 2048
# In-domain: the evaluation domains a calibration source's text comes from.
IN_DOMAIN = {"c4": {"c4"}, "wikitext2": {"wikitext2"}, "code": {"code"}, "news": {"news"},
             "mix": {"c4", "wikitext2", "code", "news"}}


def orthorank(*args: str, may_refuse: bool = False) -> bool:
    """Run one command; True when it succeeded. A refusal (exit 2) is allowed where `may_refuse` (the hybrid search
    refuses a cost table measured on another machine)."""
    cmd = [sys.executable, "-m", "orthorank.cli.main", *args]
    print("+", " ".join(cmd[2:]), flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TOKENIZERS_PARALLELISM="false")
    code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    if code == 2 and may_refuse:
        return False
    if code:
        raise SystemExit(f"command failed with exit status {code}")
    return True


def screen(tokens: int) -> str:
    return f"{min(1.0, SCREEN_TOKENS / tokens):g}"


def run(only: list[str] | None, threads: int, dtype: str) -> None:
    common = ["--model", MODEL, "--dtype", dtype, "--threads", str(threads)]
    for name, source, tokens in SETTINGS:
        if only and name not in only:
            continue
        plans = PLANS / name
        for method in METHODS:
            if all((plans / f"{method}-{s}.json").exists() for s in SPARSITIES.split(",")):
                continue
            started = time.time()
            if method == "hybrid":
                if not orthorank("calibrate", *common, "--method", "hybrid", "--cost-table", str(COST_TABLE),
                                 "--sparsity", SPARSITIES, "--calib-data", source, "--calib-tokens", str(tokens),
                                 "--seq-len", "256", "--batch-size", "4", "--screen-fraction", screen(tokens),
                                 "--cost-seq-len", str(SEQ_LEN), "--store", str(STORE), "--out-dir", str(plans),
                                 may_refuse=True):
                    print(f"{name} hybrid: skipped (no cost table of this machine at {COST_TABLE})", flush=True)
                    continue
            else:
                orthorank("calibrate", *common, "--method", method, "--sparsity", SPARSITIES, "--calib-data", source,
                          "--calib-tokens", str(tokens), "--seq-len", "256", "--batch-size", "4",
                          "--screen-fraction", screen(tokens), "--cost-seq-len", str(SEQ_LEN), "--store", str(STORE),
                          "--out-dir", str(plans))
            print(f"{name} {method}: {time.time() - started:.0f}s", flush=True)
        out = OUT / name
        have = [m for m in METHODS if all((plans / f"{m}-{s}.json").exists() for s in SPARSITIES.split(","))]
        done = json.loads((out / "compare.json").read_text()) if (out / "compare.json").exists() else {}
        if {r["method"] for r in done.get("rows", [])} != {"dense", *have}:  # evaluated rows come from the store
            orthorank("compare", *common, "--methods", ",".join(["dense", *have]), "--sparsity", SPARSITIES,
                      "--datasets", ",".join(DOMAINS), "--seq-len", str(SEQ_LEN), "--max-windows", str(WINDOWS),
                      "--plans-dir", str(plans), "--store", str(STORE), "--out", str(out), "--overwrite")
            matrix()


def _ratio(c: dict) -> str:
    lo, hi = c["ci95"]
    mark = "**" if lo > 1 or hi < 1 else ""
    return f"{mark}{c['ratio']:.3f} [{lo:.3f}, {hi:.3f}]{mark}"


def matrix() -> None:
    import numpy as np

    cells, worst, meta = {}, {}, {}
    for name, source, tokens in SETTINGS:
        path = OUT / name / "compare.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        meta[name] = {"source": source, "tokens": tokens, "windows": data["windows"], "seq_len": data["seq_len"]}
        for c in data["comparisons"]:
            if c["b"] == "sleb" and c["a_level"] == c["b_level"] and "(" not in c["a"]:
                cells[(c["a"], c["a_level"], name, c["dataset"])] = c
        for w in data.get("worst_domain", []):
            worst[(w["method"], w["level"], name)] = w
    done = [n for n, _, _ in SETTINGS if n in meta]
    methods = [m for m in METHODS if m != "sleb"]
    lines = [f"# Transfer matrix: {MODEL}, paired perplexity ratio against SLEB calibrated on the same source", "",
             f"Windows: the first {WINDOWS} windows of {SEQ_LEN} tokens of each domain (a slice; the domains hold 256 "
             "such windows in their capped streams, WikiText-2 595), 95% paired bootstrap intervals; ** = the "
             "interval excludes 1. Below 1 = the method's perplexity is lower than SLEB's. Calibration settings "
             f"finished: {', '.join(done) or 'none yet'} of {', '.join(n for n, _, _ in SETTINGS)}.", ""]
    summary = []
    for level in (0.1, 0.2):
        lines += [f"## {level:g} sparsity", "", "| method | calibration | " + " | ".join(DOMAINS) +
                  " | worst domain | in-domain mean | out-of-domain mean | gap (out / in) |",
                  "|---" * (len(DOMAINS) + 6) + "|"]
        for m in methods:
            for name in done:
                row = [cells.get((m, level, name, d)) for d in DOMAINS]
                if not any(row):
                    continue
                w = worst.get((m, level, name))
                ins = [c["ratio"] for c, d in zip(row, DOMAINS) if c and d in IN_DOMAIN[meta[name]["source"]]]
                outs = [c["ratio"] for c, d in zip(row, DOMAINS) if c and d not in IN_DOMAIN[meta[name]["source"]]]
                gin = math.exp(np.mean(np.log(ins))) if ins else None
                gout = math.exp(np.mean(np.log(outs))) if outs else None
                gap = f"{gout / gin:.3f}" if gin and gout else "-"
                lines.append(f"| {m} | {name} | " + " | ".join(_ratio(c) if c else "-" for c in row)
                             + f" | {(w['worst_dataset'] + ' ' + _ratio(w)) if w else '-'}"
                             + f" | {f'{gin:.3f}' if gin else '-'} | {f'{gout:.3f}' if gout else '-'} | {gap} |")
                summary.append({"method": m, "level": level, "calibration": name,
                                "ratios": {d: c for c, d in zip(row, DOMAINS) if c}, "worst": w,
                                "in_domain_geomean": gin, "out_of_domain_geomean": gout})
        lines.append("")
    lines += ["In-domain: the evaluation domains the calibration text comes from (mix: all four, so it has no "
              "out-of-domain column). Means are geometric means of the point ratios; the gap is out / in (above 1 = "
              "the method's advantage over SLEB shrinks off its calibration domain)."]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "transfer.md").write_text("\n".join(lines) + "\n")
    (OUT / "transfer.json").write_text(json.dumps({"settings": meta, "cells": summary, "windows": WINDOWS,
                                                   "seq_len": SEQ_LEN, "domains": DOMAINS}, indent=1) + "\n")
    _heatmaps(cells, done, methods)
    print("\n".join(lines))


def _heatmaps(cells, done, methods) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    for level in (0.1, 0.2):
        rows = [(m, n) for m in methods for n in done if any((m, level, n, d) in cells for d in DOMAINS)]
        if not rows:
            continue
        grid = np.full((len(rows), len(DOMAINS)), np.nan)
        for i, (m, n) in enumerate(rows):
            for j, d in enumerate(DOMAINS):
                c = cells.get((m, level, n, d))
                if c:
                    grid[i, j] = math.log2(c["ratio"])
        fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.6))
        lim = max(0.05, float(np.nanmax(np.abs(grid))))
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        for i, (m, n) in enumerate(rows):
            for j, d in enumerate(DOMAINS):
                c = cells.get((m, level, n, d))
                if c:
                    sig = c["ci95"][0] > 1 or c["ci95"][1] < 1
                    ax.text(j, i, f"{c['ratio']:.2f}{'*' if sig else ''}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(DOMAINS)), [f"eval: {d}" for d in DOMAINS], fontsize=8)
        ax.set_yticks(range(len(rows)), [f"{m} | calib {n}" for m, n in rows], fontsize=7)
        ax.set_title(f"{MODEL} at {level:g}: perplexity / SLEB's (same calibration); * = 95% CI excludes 1", fontsize=8)
        fig.colorbar(im, ax=ax, label="log2 ratio (blue: better than SLEB)")
        fig.tight_layout()
        fig.savefig(OUT / f"transfer-{level:g}.png", dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("run", "matrix"))
    p.add_argument("--only", default=None, help="comma-separated settings, e.g. c4-8k,mix-8k")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32",
                   help="float32 (default: on CPUs without AVX-512 BF16 bfloat16 is several times slower) or bfloat16")
    a = p.parse_args()
    if a.what == "run":
        run(a.only.split(",") if a.only else None, a.threads, a.dtype)
    matrix()
