"""`orthorank study`: the paper's whole study for one model, and `--summary` across studies."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from orthorank import cpu_info  # called as cpu_info.cpu_multiplies_bf16: tests patch it
from orthorank import distributed as dist
from orthorank.cli.common import DATA_DIR_HELP, add_model_args, expected_model_name, load_from_args
from orthorank.cli.main import build_parser
from orthorank.errors import UserError
from orthorank.models.loading import default_device
from orthorank.results import atomic_write_text, environment, record_command
from orthorank.study.budgets import BUDGETS, get_budget
from orthorank.study.claims import claims_markdown, study_claims, tally
from orthorank.study.context import StudyContext
from orthorank.study.report import write_study_report, write_summary
from orthorank.study.stages import STAGES, run_stage, stage_names


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
                   help=f"comma-separated subset of {', '.join(stage_names())} (default: all but transfer and "
                        "policies, which take hours per model and run only when named)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--store", default=None, help="result store (default: DIR/store)")
    p.add_argument("--summary", nargs="+", default=None, metavar="DIR",
                   help="study folders to summarize (default: none, run the study of --model)")
    p.add_argument("--overwrite", action="store_true",
                   help="with --summary: replace summary files in --out that an earlier summary did not write")
    p.set_defaults(func=run)


def run_command(argv: list[str]) -> int:
    """One command in this process, without main()'s shutdown of the process group between stages."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed why
        return int(exc.code or 2)
    study_command = record_command(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"orthorank {args.command}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        record_command(study_command)


def run(args) -> int:
    if args.summary:
        path = write_summary([Path(d) for d in args.summary], Path(args.out), args.overwrite)
        print(Path(args.out) / "summary.md")
        print(path)
        return 0

    budget = get_budget(args.budget)
    wanted = stage_names(optional=False) if args.stages is None else [s.strip() for s in args.stages.split(",") if s.strip()]
    if not wanted:
        raise UserError(f"--stages {args.stages!r} names no stage; choose from {', '.join(stage_names())}")
    unknown = [s for s in wanted if s not in stage_names()]
    if unknown:
        raise UserError(f"unknown stage {', '.join(unknown)}; choose from {', '.join(stage_names())}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    dtype = study_dtype(args.dtype, args.device)
    common = ["--model", args.model, "--dtype", dtype, "--seed", str(args.seed)]
    for flag, value in (("--device", args.device), ("--threads", args.threads), ("--max-memory", args.max_memory),
                        ("--offload-dir", args.offload_dir)):
        if value is not None:
            common += [flag, str(value)]
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    # plans live in ./plans/<model>/: where compare is pointed and where longctx and bench look first
    ctx = StudyContext(args.model, expected_model_name(args.model), out, budget, common, data,
                       args.store or str(out / "store"), Path("plans"))
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
        took = run_stage(ctx, stage, run_command)
        _check_manifest(out, manifest, write=True)  # after a stage ran: the model spec has been loaded once
        if took is not None:
            seconds[stage.name] = round(took, 1)
            if dist.is_main():  # now, not at the end: a study resumed over sessions keeps every stage's time
                _record_seconds(ctx.out, {stage.name: seconds[stage.name]})
    if dist.is_main():
        _report(args, ctx, seconds, time.time() - started)
    return 0


def study_dtype(requested: str, device: str | None) -> str:
    """The study's dtype. `auto` on a CPU that multiplies bfloat16 natively is bfloat16: the quick study runs 2.2x
    faster (benchmarks/results/study-time) and bfloat16 moves perplexity by at most 0.5%, inside every interval
    (benchmarks/results/bf16-vs-fp32). Elsewhere `auto` is what every command takes it to be (float32 on a CPU,
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


def _report(args, ctx, seconds: dict[str, float], total: float) -> None:
    lm = load_from_args(args)
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
