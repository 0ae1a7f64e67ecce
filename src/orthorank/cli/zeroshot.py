"""`orthorank zeroshot`: zero-shot accuracy (PIQA, WinoGrande, HellaSwag, ARC-e, ARC-c, ...) through
lm-evaluation-harness, offline, for a dense, OrthoRank or layer-pruned model."""

from __future__ import annotations

import argparse
from pathlib import Path

from orthorank.cli.common import (
    add_model_args, add_output_args, add_plan_args, finite_float, load_from_args, plan_from_args, positive_int,
)
from orthorank.errors import UserError
from orthorank.evaluation.zeroshot.registry import ALL_TASKS, MAIN_TASKS, TASKS, resolve_tasks
from orthorank.method.plan import Plan
from orthorank.method.plan_store import PLAN_METHODS, find_plan
from orthorank.models.loading import EMBEDDED_MODEL
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
    add_plan_args(p, methods=("dense", "orthorank", "prune", *[m for m in PLAN_METHODS if m != "orthorank"]))
    p.add_argument("--sparsity", type=finite_float, default=None,
                   help="use the saved plan plans/<model>/<method>-<S>.json (from `orthorank calibrate`)")
    p.add_argument("--tasks", default=",".join(MAIN_TASKS), help="comma-separated harness task names, main, all "
                   f"(default: {','.join(MAIN_TASKS)})")
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate the first N examples of each task")
    p.add_argument("--data-dir", default=None, help="folder laid out like ../shared/data")
    p.add_argument("--batch-size", type=_batch_size, default=None,
                   help="dense/pruned plans (default 8); OrthoRank plans always use 1, since padding would change "
                        "token selection")
    p.add_argument("--metric", choices=("acc", "acc_norm"), default="acc", help="metric of the printed table")
    add_output_args(p)
    p.set_defaults(func=run)


def expected_model_name(spec: str) -> str:
    """The name load_model will give `spec` (what plans record), known before loading it."""
    return Path(spec).resolve().name if spec != EMBEDDED_MODEL and Path(spec).is_dir() else spec


def saved_plan_path(args) -> Path | None:
    """For --method M --sparsity S: the saved plan file, found before the model is loaded."""
    if args.sparsity is None:
        return None
    if args.plan:
        raise UserError("give either --plan or --method with --sparsity, not both")
    if args.layers:
        raise UserError("--sparsity picks a saved plan; it does not combine with --layers")
    if args.method == "dense":
        raise UserError("--method dense takes no --sparsity")
    if args.method == "prune":
        raise UserError("with --sparsity, name the pruning method: " + ", ".join(PLAN_METHODS[1:]))
    return find_plan(expected_model_name(args.model), args.method, args.sparsity)


def check_plan_args(args) -> None:
    """Plan options that cannot work, found before the model is loaded."""
    if args.sparsity is None and args.method != "dense" and not args.plan and not (
            args.layers and args.method in ("orthorank", "prune")):
        extra = " or --layers" if args.method in ("orthorank", "prune") else ""
        raise UserError(f"--method {args.method} needs --sparsity S (a saved plan), --plan FILE{extra}")


def plan_for(args, lm, saved: Path | None) -> Plan:
    """--plan FILE, --method M --sparsity S (saved plan), or --method/--layers as in other commands."""
    if saved is not None:
        plan = Plan.load(saved)
        plan.check_model(lm.name, lm.signature())
        return plan
    return plan_from_args(args, lm)


def run(args) -> int:
    from orthorank.evaluation.zeroshot.convert import resolve_data_dir
    from orthorank.evaluation.zeroshot.registry import check_task_files
    from orthorank.evaluation.zeroshot.runner import DEFAULT_BATCH_SIZE, format_table, require_lm_eval, run_zeroshot

    check_writable(args.json_out, args.overwrite)
    names = resolve_tasks(args.tasks)
    check_plan_args(args)
    root = resolve_data_dir(args.data_dir)
    check_task_files(names, root)
    require_lm_eval()
    saved = saved_plan_path(args)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError(f"{args.model} is a random-weight shape; zero-shot evaluation needs a real model")
    plan = plan_for(args, lm, saved)
    info: dict = {}
    results = run_zeroshot(lm, plan, names, limit=args.limit, data_dir=root,
                           batch_size=args.batch_size or DEFAULT_BATCH_SIZE, info=info)
    layers = ",".join(map(str, plan.layers)) or "-"
    label = plan.label() if plan.method != "dense" else "dense"
    print(format_table({label: results}, names, metric=args.metric), end="")
    for name in names:
        extra = "  ".join(f"{k} {v:.4f}" for k, v in results[name].items() if not k.endswith("_stderr"))
        print(f"{TASKS[name].title}: {extra}  ({info['examples'][name]} examples)")
    print(f"(method {plan.method}, layers {layers}, effective sparsity {plan.effective_sparsity:.3f}, "
          f"batch size {info['batch_size']}, {info['seconds']:.1f}s)")
    if args.json_out:
        path = write_json(args.json_out, {
            "command": "zeroshot",
            "model": lm.name,
            "tasks": names,
            "limit": args.limit,
            "seed": args.seed,
            "plan": plan.to_dict(),
            "results": results,
            "examples": info["examples"],
            "batch_size": info["batch_size"],
            "harness_tasks": info["tasks"],
            "seconds": info["seconds"],
        }, device=lm.device, overwrite=args.overwrite)
        print(f"wrote {path}")
    return 0
