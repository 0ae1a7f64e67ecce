"""`orthorank zeroshot`: zero-shot accuracy (PIQA, WinoGrande, HellaSwag, ARC-e, ARC-c, ...) through
lm-evaluation-harness, offline, for a dense, OrthoRank or layer-pruned model."""

from __future__ import annotations

import argparse
import time

import numpy as np

from orthorank import distributed as dist
from orthorank.cli.common import (
    DATA_DIR_HELP, add_model_args, add_output_args, add_plan_args, add_store_args, check_plan_args, load_from_args,
    plan_for, positive_int, saved_plan_path, store_from_args,
)
from orthorank.errors import UserError
from orthorank.evaluation.compare import Row
from orthorank.evaluation.stats import mean_stderr
from orthorank.evaluation.zeroshot.convert import resolve_data_dir
from orthorank.evaluation.zeroshot.registry import ALL_TASKS, MAIN_TASKS, TASKS, check_task_files, resolve_tasks
from orthorank.evaluation.zeroshot.runner import DEFAULT_BATCH_SIZE, format_table, require_lm_eval
from orthorank.evaluation.zeroshot.scoring import evaluate_zeroshot_rows
from orthorank.method.registry import saved
from orthorank.results import check_writable, write_json


def _batch_size(text: str) -> int | str:
    return text if text.startswith("auto") else positive_int(text)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "zeroshot", help="zero-shot accuracy through lm-evaluation-harness (offline tasks)",
        description="Zero-shot accuracy through lm-evaluation-harness with the harness's prompts and metrics, on "
                    "offline copies of the tasks read from ../shared/data. Tasks: " + ", ".join(ALL_TASKS)
                    + " (or main = the paper's five, all).")
    add_model_args(p)
    add_plan_args(p, methods=("dense", "prune", *saved()), saved=True)
    p.add_argument("--tasks", default=",".join(MAIN_TASKS), help="comma-separated harness task names, main, all "
                   f"(default: {','.join(MAIN_TASKS)})")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="evaluate the first N examples of each task (default: every example)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--batch-size", type=_batch_size, default=None,
                   help="rows per forward (default 8); rows are right-padded with a mask, so OrthoRank's selection "
                        "and every row's result are those of batch size 1")
    p.add_argument("--metric", choices=("acc", "acc_norm"), default="acc", help="metric of the printed table (default %(default)s)")
    add_output_args(p)
    add_store_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    check_writable(args.json_out, args.overwrite)
    names = resolve_tasks(args.tasks)
    check_plan_args(args)
    root = resolve_data_dir(args.data_dir)
    check_task_files(names, root)
    require_lm_eval()
    saved = saved_plan_path(args)
    if isinstance(args.batch_size, str):
        raise UserError("the per-item scorer takes a whole-number --batch-size")
    dist.init(args.device)
    args.device = dist.local_device(args.device)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError(f"{args.model} is a random-weight shape; zero-shot evaluation needs a real model")
    plan = plan_for(args, lm, saved)
    label = plan.label() if plan.method != "dense" else "dense"
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    start = time.perf_counter()
    zs = evaluate_zeroshot_rows(lm, [Row(label, plan.target_sparsity or 0.0, plan)], names, args.limit, root,
                                store_from_args(args), batch_size)[0]
    seconds = time.perf_counter() - start
    if not dist.is_main():
        return 0
    results = {}
    for t in names:
        results[t] = {}
        for metric, x in zs[t].items():
            if metric == "perplexity":  # LAMBADA: per-item log-likelihoods, aggregated as the harness does
                results[t]["perplexity"] = float(np.exp(-x.mean()))
                continue
            results[t][metric] = float(x.mean())
            results[t][f"{metric}_stderr"] = mean_stderr(x)
    examples = {t: int(len(next(iter(zs[t].values())))) for t in names}
    layers = ",".join(map(str, plan.layers)) or "-"
    print(format_table({label: results}, names, metric=args.metric), end="")
    for name in names:
        extra = "  ".join(f"{k} {v:.4f}" for k, v in results[name].items() if not k.endswith("_stderr"))
        print(f"{TASKS[name].title}: {extra}  ({examples[name]} examples)")
    print(f"(method {plan.method}, layers {layers}, nominal sparsity {plan.nominal_sparsity:.3f}, batch size "
          f"{batch_size}, {dist.world_size()} process(es), {seconds:.1f}s)")
    if args.json_out:
        path = write_json(args.json_out, {
            "command": "zeroshot",
            "model": lm.name,
            "tasks": names,
            "limit": args.limit,
            "seed": args.seed,
            "plan": plan.to_dict(),
            "results": results,
            "outcomes": {t: {m: x.tolist() for m, x in zs[t].items()} for t in names},
            "examples": examples,
            "batch_size": batch_size,
            "world_size": dist.world_size(),
            "harness_tasks": {t: TASKS[t].offline for t in names},
            "seconds": round(seconds, 3),
        }, device=lm.device, overwrite=args.overwrite)
        print(f"wrote {path}")
    return 0
