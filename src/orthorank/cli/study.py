"""`orthorank study`: the paper's whole study for one model, and `--summary` across studies."""

from __future__ import annotations

import argparse

from orthorank.cli.common import DATA_DIR_HELP, add_model_args
from orthorank.study.budgets import BUDGETS
from orthorank.study.stages import stage_names


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="the paper's whole study for one model: one folder, one report",
                       description="Sink analysis, plans of every method at 10% and 20%, perplexity on every "
                                   "domain with the ablations, zero-shot, long inputs, speed, the router policy and "
                                   "(standard, full) the hybrid frontier, each by the command that does it; then "
                                   "DIR/report.html with the "
                                   "paper's claims tested. Resumable: run it again to go on. With --summary: one "
                                   "claims x models table from several study folders.")
    add_model_args(p)
    p.add_argument("--out", required=True, help="the study folder (with --summary: the summary's folder)")
    p.add_argument("--budget", default="quick", choices=list(BUDGETS),
                   help="quick (a first run: minutes), standard (what the README reports), full (hours per model), "
                        "test (seconds on a tiny model: a smoke run of a new setup, no evidence) (default %(default)s)")
    p.add_argument("--stages", default=None,
                   help=f"comma-separated subset of {', '.join(stage_names())} (default: all but transfer, "
                        "policies and long-prompt, which take hours per model and run only when named)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--store", default=None, help="result store (default: DIR/store)")
    p.add_argument("--summary", nargs="+", default=None, metavar="DIR",
                   help="study folders to summarize (default: none, run the study of --model)")
    p.add_argument("--overwrite", action="store_true",
                   help="with --summary: replace summary files in --out that an earlier summary did not write")
