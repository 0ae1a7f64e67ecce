"""The study runner: the paper's whole study for one model (its stages in harness/study/stages.py), and the summary
across studies."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from orthorank.harness import cpu_info  # called as cpu_info.cpu_multiplies_bf16: tests patch it
from orthorank.harness import distributed as dist
from orthorank.harness.api.common import expected_model_name, load_model_from_options
from orthorank.harness.api.options import ModelOptions
from orthorank.harness.study.options import StudyOptions
from orthorank.errors import UserError
from orthorank.models.loading import default_device
from orthorank.harness.results import atomic_write_text, environment
from orthorank.harness.study.budgets import get_budget
from orthorank.harness.evaluation.claims import claims_markdown, study_claims, tally
from orthorank.harness.study.context import StudyContext
from orthorank.harness.reports.study import write_study_report, write_summary
from orthorank.harness.study.stages import STAGES, run_stage, stage_names


def run(opts: StudyOptions) -> int:
    """`orthorank study`: run the stages a budget asks for (each resumes where it stopped), then the report; with
    `summary`, the claims x models table of finished studies."""
    if opts.summary:
        path = write_summary([Path(d) for d in opts.summary], Path(opts.out), opts.overwrite)
        print(Path(opts.out) / "summary.md")
        print(path)
        return 0

    budget = get_budget(opts.budget)
    wanted = stage_names(optional=False) if opts.stages is None else [s.strip() for s in opts.stages.split(",") if s.strip()]
    if not wanted:
        raise UserError(f"--stages {opts.stages!r} names no stage; choose from {', '.join(stage_names())}")
    unknown = [s for s in wanted if s not in stage_names()]
    if unknown:
        raise UserError(f"unknown stage {', '.join(unknown)}; choose from {', '.join(stage_names())}")
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    dtype = study_dtype(opts.dtype, opts.device)
    model = {f.name: getattr(opts, f.name) for f in dataclasses.fields(ModelOptions)} | {"dtype": dtype}
    # plans live in ./plans/<model>/: where compare is pointed and where longctx and bench look first
    ctx = StudyContext(opts.model, expected_model_name(opts.model), out, budget, model, opts.data_dir,
                       opts.store or str(out / "store"), Path("plans"))
    manifest = {"model": ctx.model_name, "budget": budget.name, "dtype": dtype}
    _check_manifest(out, manifest, write=False)
    started = time.time()
    seconds = {}
    for stage in STAGES:
        if stage.name not in wanted:
            continue
        if not stage.applies(budget):
            ctx.log(f"study: {stage.name}: not part of budget {budget.name}")
            continue
        took = run_stage(ctx, stage)
        _check_manifest(out, manifest, write=True)  # after a stage ran: the model spec has been loaded once
        if took is not None:
            seconds[stage.name] = round(took, 1)
            if dist.is_main():  # now, not at the end: a study resumed over sessions keeps every stage's time
                _record_seconds(ctx.out, {stage.name: seconds[stage.name]})
    if dist.is_main():
        _report(opts, ctx, seconds, time.time() - started)
    return 0


def study_dtype(requested: str, device: str | None) -> str:
    """The study's dtype. `auto` on a CPU that multiplies bfloat16 natively is bfloat16: the quick study runs 2.2x
    faster (scripts/results/study-time) and bfloat16 moves perplexity by at most 0.5%, inside every interval
    (scripts/results/bf16-vs-fp32). Elsewhere `auto` is what every command takes it to be (float32 on a CPU,
    bfloat16 on a GPU). A study folder records the dtype it ran in."""
    on_cpu = (torch.device(device) if device else default_device()).type == "cpu"
    if requested == "auto" and on_cpu and cpu_info.cpu_multiplies_bf16():
        print("study: dtype auto -> bfloat16 (this CPU multiplies bfloat16 natively; --dtype float32 for float32)",
              file=sys.stderr)
        return "bfloat16"
    return requested


def _check_manifest(out: Path, manifest: dict, write: bool) -> None:
    """A study folder holds one model at one budget and dtype: a rerun with others would mark every stage done and
    report the old numbers under the new name."""
    path = out / "study-manifest.json"
    if path.is_file():
        old = json.loads(path.read_text())
        diff = [f"{k} {old.get(k)!r}" for k in manifest if old.get(k) != manifest[k]]
        if diff:
            raise UserError(f"{out} holds a study of {', '.join(diff)}; use another --out for "
                            + ", ".join(f"{k} {manifest[k]!r}" for k in manifest if old.get(k) != manifest[k]))
    elif write and dist.is_main():
        atomic_write_text(path, json.dumps(manifest, indent=1) + "\n")


def _record_seconds(out: Path, seconds: dict[str, float]) -> dict[str, float]:
    """Merge stage seconds into DIR/stage-seconds.json (a stage run again replaces its earlier time)."""
    timing_file = out / "stage-seconds.json"
    earlier = json.loads(timing_file.read_text()) if timing_file.is_file() else {}
    merged = {**earlier, **seconds}
    atomic_write_text(timing_file, json.dumps(merged, indent=1) + "\n")
    return merged


def _report(opts: StudyOptions, ctx: StudyContext, seconds: dict[str, float], total: float) -> None:
    lm = load_model_from_options(opts)
    claims = [c.to_json() for c in study_claims(ctx.out, ctx.budget)]
    all_seconds = _record_seconds(ctx.out, seconds)
    finished = [s.name for s in STAGES if s.done(s.output(ctx))]
    study = {"model": ctx.model_name, "spec": ctx.model, "loaded": lm.description(), "budget": ctx.budget.to_json(),
             "budget_caption": ctx.budget.caption(), "finished": finished,
             "skipped": [s.name for s in STAGES if s.name not in finished], "claims": claims, "tally": tally(claims),
             "stage_seconds": all_seconds, "seconds_this_run": round(total, 1), "plans_dir": str(ctx.plans_dir),
             "environment": environment(lm.device)}
    page = write_study_report(ctx.out, study)
    print(claims_markdown(claims))
    print(f"\n{page}  ({total:.0f} s this run)")
