"""`orthorank compare`: dense vs layer pruning vs OrthoRank at equal sparsity, as a table, JSON and a plot."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from orthorank.baselines.registry import SEARCH_METHODS
from orthorank.cli.calibrate import parse_sparsities
from orthorank.cli.common import add_model_args, load_from_args, positive_int
from orthorank.errors import UserError
from orthorank.evaluation.compare import Row, ablation_plans, evaluate_rows, markdown_table, plot_ppl
from orthorank.evaluation.data import DATASETS, load_eval_text
from orthorank.evaluation.perplexity import make_windows, tokenize_text
from orthorank.method.plan import Plan
from orthorank.method.plan_store import find_plan
from orthorank.results import check_writable, write_json

METHODS = ("dense", *SEARCH_METHODS)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="perplexity table of dense, layer pruning and OrthoRank at equal sparsity",
                       description="Evaluates the stored plans (plans/<model>/<method>-<sparsity>.json, made by "
                                   "`orthorank calibrate`) on the same windows, in one run.")
    add_model_args(p)
    p.add_argument("--methods", default="dense,sleb,shortened-ppl,shortgpt,orthorank",
                   help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument("--sparsity", default="0.1,0.2")
    p.add_argument("--datasets", default="wikitext2,c4", help=f"comma-separated, from {', '.join(DATASETS)}")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seq-len", type=positive_int, default=2048)
    p.add_argument("--max-windows", type=positive_int, default=None, help="bound the windows per dataset")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--ablations", action="store_true",
                   help="add OrthoRank with random/inverse selection, raw states and no K/V for bypassed tokens")
    p.add_argument("--zeroshot", action="store_true", help="add a zero-shot accuracy table (lm-eval)")
    p.add_argument("--tasks", default="piqa,winogrande,hellaswag,arc_easy,arc_challenge")
    p.add_argument("--limit", type=positive_int, default=None, help="zero-shot examples per task")
    p.add_argument("--out", default="results/compare", help="folder for compare.json, compare.md, compare.png")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run)


def _split(text: str, allowed, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise UserError(f"unknown {what} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
    return items


def build_rows(lm, methods: list[str], sparsities: list[float], ablations: bool) -> list[Row]:
    rows: list[Row] = []
    for method in methods:
        if method == "dense":
            rows.append(Row("dense", 0.0, Plan("dense", [], lm.name, lm.signature())))
            continue
        for s in sparsities:
            plan = Plan.load(find_plan(lm.name, method, s))
            plan.check_model(lm.name, lm.signature())
            rows.append(Row(method, s, plan))
            if ablations and method == "orthorank":
                rows += [Row(name, s, variant) for name, variant in ablation_plans(plan)]
    return rows


def run(args) -> int:
    methods = _split(args.methods, METHODS, "method")
    datasets = _split(args.datasets, DATASETS, "dataset")
    sparsities = parse_sparsities(args.sparsity)
    out = Path(args.out)
    for name in ("compare.json", "compare.md", "compare.png"):
        check_writable(out / name, args.overwrite)
    texts = {d: load_eval_text(d, args.data_dir) for d in datasets}
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("compare needs a real model with a tokenizer")
    rows = build_rows(lm, methods, sparsities, args.ablations)
    windows = {d: make_windows(tokenize_text(lm.tokenizer, t), args.seq_len, args.max_windows) for d, t in texts.items()}
    start = time.perf_counter()
    evaluate_rows(lm.model, rows, windows, args.batch_size)
    seconds = time.perf_counter() - start

    table = markdown_table(rows, datasets)
    n_windows = ", ".join(f"{d}: {w.shape[0]} x {args.seq_len}" for d, w in windows.items())
    report = [f"Perplexity (lower is better), {lm.name}, windows {n_windows}\n", table]
    payload = {"command": "compare", "model": lm.name, "datasets": datasets, "seq_len": args.seq_len,
               "windows": {d: int(w.shape[0]) for d, w in windows.items()}, "seed": args.seed,
               "rows": [r.to_dict() for r in rows], "plans": [r.plan.to_dict() for r in rows],
               "seconds": round(seconds, 1)}
    if args.zeroshot:
        from orthorank.evaluation.zeroshot.runner import format_table, run_zeroshot

        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        zs: dict[str, dict] = {}
        for row in rows:
            label = row.method if row.method == "dense" else f"{row.method} {row.sparsity:g}"
            zs[label] = run_zeroshot(lm, row.plan, tasks, args.limit, args.data_dir)
        report += ["", f"Zero-shot (limit {args.limit or 'all'} examples per task)\n",
                   format_table(zs, tasks, metric="acc"), format_table(zs, tasks, metric="acc_norm")]
        payload["zeroshot"] = [{"method": label, **{t: v for t, v in res.items()}} for label, res in zs.items()]
    text = "\n".join(report)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(text + "\n")
    write_json(out / "compare.json", payload, device=lm.device, overwrite=True)
    plot = plot_ppl(rows, datasets, out / "compare.png")
    print(f"\nwrote {out / 'compare.md'}, {out / 'compare.json'}; plot: {plot}  ({seconds:.0f}s of evaluation)")
    return 0
