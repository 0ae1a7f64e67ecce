"""`orthorank zeroshot`: zero-shot accuracy (PIQA, WinoGrande, HellaSwag, ARC-e, ARC-c, ...) through
lm-evaluation-harness, offline, for a dense, OrthoRank or layer-pruned model."""

from __future__ import annotations

import argparse

from orthorank.cli.common import (
    DATA_DIR_HELP,
    add_model_args,
    add_output_args,
    add_plan_args,
    add_store_args,
    positive_int,
)
from orthorank.evaluation.zeroshot.registry import ALL_TASKS, MAIN_TASKS
from orthorank.method.registry import saved


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
