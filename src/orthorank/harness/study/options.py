"""`orthorank study`'s options: beside the study, which sits above the library it calls (its budgets and stages name
the choices), built into the CLI like every command's (harness/cli/parser.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orthorank.harness.api.options import DataOptions, ModelOptions, OverwriteOptions, flag
from orthorank.harness.study.budgets import BUDGETS
from orthorank.harness.study.stages import stage_names


@dataclass(kw_only=True)
class StudyOptions(ModelOptions, DataOptions, OverwriteOptions):
    command: ClassVar[str] = "study"
    about: ClassVar[str] = "the paper's whole study for one model: one folder, one report"
    description: ClassVar[str] = (
        "Sink analysis, plans of every method at 10% and 20%, perplexity on every domain with the ablations, "
        "zero-shot, long inputs, speed, the router policy and (standard, full) the hybrid frontier, each by the "
        "command that does it; then DIR/report.html with the paper's claims tested. Resumable: run it again to go "
        "on. With --summary: one claims x models table from several study folders.")

    out: str = flag("--out", group="output", help="the study folder (with --summary: the summary's folder)")
    budget: str = flag("--budget", default="quick", choices=tuple(BUDGETS),
                       help="quick (a first run: minutes), standard (what the README reports), full (hours per "
                            "model), test (seconds on a tiny model: a smoke run of a new setup, no evidence) (default "
                            "%(default)s)")
    stages: str | None = flag("--stages", default=None,
                              help=f"comma-separated subset of {', '.join(stage_names())} (default: all but transfer, "
                                   "policies and long-prompt, which take hours per model and run only when named)")
    store: str | None = flag("--store", default=None, group="result store", help="result store (default: DIR/store)")
    summary: list[str] | None = flag("--summary", default=None, kind="several", metavar="DIR",
                                     help="study folders to summarize (default: none, run the study of --model)")
    overwrite: bool = flag("--overwrite", default=False, kind="switch", group="output",
                           help="with --summary: replace summary files in --out that an earlier summary did not "
                                "write")
