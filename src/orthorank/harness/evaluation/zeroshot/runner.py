"""Run zero-shot tasks through lm-evaluation-harness on a loaded model with a plan, and tabulate the results."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.harness.evaluation.zeroshot.convert import resolve_data_dir
from orthorank.harness.evaluation.zeroshot.registry import MAIN_TASKS, TASKS, check_task_files, resolve_tasks, tasks_dir
from orthorank.method.apply import restore_dense
from orthorank.method.plan import Plan
from orthorank.models.loading import LoadedModel

DEFAULT_BATCH_SIZE = 8  # dense and pruned plans; OrthoRank plans always run with 1 (see backend.effective_batch_size)
DEFAULT_BOOTSTRAP_ITERS = 1000  # only LAMBADA perplexity's stderr is bootstrapped; acc uses the closed form

# Warnings lm_eval logs on every run of this setup that say nothing about the results.
_EXPECTED_WARNINGS = (
    "Custom kwargs can be passed to `--metadata`",
    "`pretrained` model kwarg is not of type `str`",
    "Passed an already-initialized model through `pretrained`",
)


class _DropExpected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(text in msg for text in _EXPECTED_WARNINGS)


@contextmanager
def _quiet_harness():
    loggers = [logging.getLogger(n) for n in ("lm_eval.api.task", "lm_eval.models.huggingface")]
    flt = _DropExpected()
    for lg in loggers:
        lg.addFilter(flt)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(flt)


def require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401  lazily: whether the optional harness is installed
    except ImportError:
        raise UserError("zero-shot evaluation needs lm-evaluation-harness: pip install 'orthorank[eval]'") from None


def check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"limit must be a whole number of examples, at least 1; got {limit!r}")


def task_manager(data_dir: str | Path | None = None, include_defaults: bool = False):
    """A TaskManager that knows our offline tasks (orthorank_piqa, ..., tags orthorank_zeroshot[_all]); for
    `lm_eval.simple_evaluate(..., task_manager=task_manager())`. The harness's own tasks are left out by default
    (indexing its thousands of YAMLs takes seconds). `data_dir` reaches the tasks' custom_dataset hooks through
    the task metadata; without it they look for ../shared/data at load time."""
    from lm_eval.tasks import TaskManager  # lazily: optional dependency (orthorank[eval])

    metadata = {"data_dir": str(data_dir)} if data_dir is not None else {}
    return TaskManager(include_path=str(tasks_dir()), include_defaults=include_defaults, metadata=metadata)


def collect_results(raw: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """lm_eval's {"results": {"orthorank_piqa": {"acc,none": ..}}} -> {"piqa": {"acc": .., "acc_stderr": ..}}."""
    out: dict[str, dict[str, float]] = {}
    for name in names:
        row = raw["results"][TASKS[name].offline]
        metrics = {}
        for key, value in row.items():
            metric, _, filt = key.partition(",")
            if not filt or filt != "none" or isinstance(value, str):
                continue
            metrics[metric] = float(value) if value is not None else math.nan
        out[name] = metrics
    return out


def run_zeroshot(
    lm: LoadedModel,
    plan: Plan,
    tasks: Sequence[str] | str,
    limit: int | None = None,
    data_dir: str | Path | None = None,
    batch_size: int | str | None = DEFAULT_BATCH_SIZE,
    *,
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS,
    info: dict | None = None,
) -> dict[str, dict[str, float]]:
    """Zero-shot accuracy of `lm` with `plan` applied, through the harness's HF backend and our offline copies of
    the harness tasks. The plan is applied in place for the run and the model is restored to dense afterwards.

    tasks: harness names (piqa, winogrande, hellaswag, arc_easy, arc_challenge, boolq, openbookqa,
    lambada_openai), a comma list, "main" or "all". limit: the first N examples of each task.
    Returns {task: {metric: value}} with the harness's metrics and their stderrs, e.g.
    {"piqa": {"acc": 0.61, "acc_stderr": 0.011, "acc_norm": 0.62, "acc_norm_stderr": 0.011}}; LAMBADA gives
    "perplexity" and "acc". Fills `info`, when given, with per-task example counts, batch size and seconds.
    """
    require_lm_eval()
    names = resolve_tasks(tasks)
    check_limit(limit)
    root = resolve_data_dir(data_dir)
    check_task_files(names, root)
    if lm.tokenizer is None:
        raise UserError(f"{lm.name} is a random-weight shape without a tokenizer; zero-shot needs a real model")
    plan.check_model(lm.name, lm.signature())

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lm_eval import simple_evaluate  # lazily: optional dependency (orthorank[eval])

    from orthorank.harness.evaluation.zeroshot.backend import OrthoRankLM  # lazily: backend imports lm_eval (optional)

    start = time.perf_counter()
    try:
        with _quiet_harness():
            backend = OrthoRankLM(lm, plan=plan, batch_size=batch_size)  # applies the plan
            raw = simple_evaluate(
                model=backend,
                tasks=[TASKS[n].offline for n in names],
                limit=limit,
                task_manager=task_manager(root),
                bootstrap_iters=bootstrap_iters,
                log_samples=False,
            )
    finally:
        restore_dense(lm.model)
    seconds = time.perf_counter() - start
    if raw is None:  # only non-zero ranks of a distributed run get None
        raise UserError("lm_eval returned no results")
    results = collect_results(raw, names)
    if info is not None:
        info.update({
            "examples": {n: int(raw.get("n-samples", {}).get(TASKS[n].offline, {}).get("effective", 0))
                         for n in names},
            "batch_size": backend.batch_size,
            "limit": limit,
            "data_dir": str(root),
            "seconds": round(seconds, 3),
            "tasks": {n: TASKS[n].offline for n in names},
        })
    return results


def _metric_for(task: str, metric: str) -> str:
    available = TASKS[task].metrics if task in TASKS else (metric,)
    return metric if metric in available else "acc"


def format_table(
    rows: Mapping[str, Mapping[str, Mapping[str, float]]],
    tasks: Sequence[str] | None = None,
    metric: str = "acc",
    percent: bool = True,
    digits: int = 2,
    label: str = "Method",
) -> str:
    """A Markdown table like the paper's: one row per run (e.g. "dense", "SLEB 20%"), one column per task, and the
    mean over those tasks. `rows`: {row label: run_zeroshot result}. `metric`: acc (default) or acc_norm; tasks
    without it (WinoGrande, BoolQ) show acc, marked with *. LAMBADA perplexity is not averaged (its acc is).
    A task missing from a row shows "-" and that row's mean is left out ("-")."""
    rows = dict(rows)
    if tasks is None:
        seen: list[str] = []
        for res in rows.values():
            seen += [t for t in res if t not in seen]
        order = [t for t in dict.fromkeys((*MAIN_TASKS, *TASKS)) if t in seen]
        tasks = order + [t for t in seen if t not in order]
    tasks = list(tasks)
    scale = 100.0 if percent else 1.0
    heads = []
    for t in tasks:
        title = TASKS[t].title if t in TASKS else t
        heads.append(title + ("*" if metric != "acc" and _metric_for(t, metric) != metric else ""))
    lines = [f"| {label} | " + " | ".join(heads) + " | Mean |", "|---|" + "---:|" * (len(tasks) + 1)]
    for name, res in rows.items():
        cells, values = [], []
        for t in tasks:
            value = res.get(t, {}).get(_metric_for(t, metric))
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("-")
                values.append(None)
            else:
                cells.append(f"{value * scale:.{digits}f}")
                values.append(value)
        mean = f"{sum(values) / len(values) * scale:.{digits}f}" if values and None not in values else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean} |")
    unit = "accuracy (%)" if percent else "accuracy"
    note = f"{metric} {unit}, zero-shot, lm-evaluation-harness"
    if metric != "acc" and any(h.endswith("*") for h in heads):
        note += "; * acc (the harness defines no " + metric + " for that task)"
    return "\n".join(lines) + f"\n\n{note}\n"
