"""The library behind every command: typed options (options.py) and one function per command (`run(options)` in the
module named after it). The CLI parses a command line into options and calls the function; the study builds options
from its budget and calls the same function (`call`)."""

from __future__ import annotations

import importlib
from typing import Callable

from orthorank.harness.api.options import Options
from orthorank.harness.results import record_command

# command -> "module:function". Looked up by name so that a command imports only its own dependencies (zero-shot
# needs lm-eval; bench must start on a bare GPU machine that lacks the others).
JOBS: dict[str, str] = {
    "ppl": "orthorank.harness.api.ppl:run",
    "bench": "orthorank.harness.api.bench:run",
    "analyze": "orthorank.harness.api.analyze:run",
    "selection-map": "orthorank.harness.api.selection_map:run",
    "calibrate": "orthorank.harness.api.calibrate:run",
    "fit-router": "orthorank.harness.api.fit_router:run",
    "fit-thresholds": "orthorank.harness.api.fit_thresholds:run",
    "match-speed": "orthorank.harness.api.match_speed:run",
    "compare": "orthorank.harness.api.compare:run",
    "zeroshot": "orthorank.harness.api.zeroshot:run",
    "generate": "orthorank.harness.api.generate:run",
    "longctx": "orthorank.harness.api.longctx:run_suite",
    "longbench": "orthorank.harness.api.longctx:run_longbench",
    "frontier": "orthorank.harness.api.frontier:run",
}


def job(command: str, jobs: dict[str, str] = JOBS) -> Callable[[Options], int]:
    module, name = jobs[command].split(":")
    return getattr(importlib.import_module(module), name)


def call(options: Options) -> int:
    """Run one command in this process, as `orthorank <options.argv()>` would after parsing; the result files it
    writes record that command line. Returns its exit status (0); a bad input raises UserError."""
    previous = record_command(options.argv())
    try:
        return int(job(options.command)(options) or 0)
    finally:
        record_command(previous)
