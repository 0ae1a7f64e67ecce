"""The study's stages, each a few calls of the library functions the commands run (orthorank.harness.api), with options
built from the budget (nothing re-implemented, no command lines parsed).

A stage is finished when its output JSON exists; a stage that was killed runs again and its command resumes from
the result store (searches from their checkpoints, evaluations from their stored windows and items). Under torchrun
every process runs the same stages and the commands shard their work as they do alone.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from orthorank.harness import api
from orthorank.harness.api.options import (
    AnalyzeOptions,
    BenchOptions,
    CalibrateOptions,
    CompareOptions,
    FitRouterOptions,
    FrontierOptions,
    LongctxOptions,
    Options,
)
from orthorank.errors import UserError
from orthorank.method.plan import Plan
from orthorank.method.presets import available as presets_available
from orthorank.method.plan_store import sparsity_label
from orthorank.harness.results import atomic_write_text
from orthorank.harness.study import decode_router
from orthorank.harness.study.budgets import ZEROSHOT_TASKS, Budget
from orthorank.harness.study.context import StudyContext, compare_on_domains, finished_json, hybrid_cost_table
from orthorank.harness.study.headroom import finish_policies, policies_calls, policies_output
from orthorank.harness.study.transfer import after_command, render_matrix, transfer_calls, transfer_done, transfer_output

SEARCHED = ("sleb", "shortgpt", "shortened-ppl", "orthorank")  # every method's plan, at every budget level
THRESHOLD = "+decode=threshold"  # the plan's own policy with the threshold decode policy: one more OrthoRank row


@dataclass(frozen=True)
class Stage:
    name: str
    what: str  # one line for the log and the report
    output: Callable[[StudyContext], Path]  # the JSON that marks it finished
    calls: Callable[[StudyContext], Iterable[Options]]  # the commands it runs, in order, as their options
    applies: Callable[[Budget], bool] = lambda b: True
    # finished: by default its output exists; a stage whose command rewrites its output as it goes says more
    done: Callable[[Path], bool] = lambda path: path.is_file()
    finish: Callable[[StudyContext], object] | None = None  # after its commands: what they leave is gathered
    after_command: Callable[[StudyContext, Options], object] | None = None  # after each of them
    optional: bool = False  # runs only when --stages names it (hours per model)


def _missing_plans(ctx: StudyContext, method: str) -> list[float]:
    return [s for s in ctx.budget.levels if not (ctx.plans_dir / f"{method}-{sparsity_label(s)}.json").is_file()]


def _plans_calls(ctx: StudyContext) -> list[Options]:
    calls: list[Options] = []
    for method in SEARCHED:
        missing = _missing_plans(ctx, method)
        if missing:
            # compute matched at the length the perplexity stage evaluates (exact matching where it is measured)
            calls.append(ctx.options(CalibrateOptions, method=method, sparsity=ctx.levels(tuple(missing)),
                                     cost_seq_len=ctx.budget.ppl_seq_len, out=str(ctx.plans_dir),
                                     **ctx.budget.calibration))
    return calls


def _plans_output(ctx: StudyContext) -> Path:
    return ctx.out / "plans" / "plans.json"


def _ppl_calls(ctx: StudyContext) -> list[Options]:
    b = ctx.budget
    return [compare_on_domains(ctx, ["dense", *SEARCHED], b.levels, ctx.out / "perplexity", ablations=True,
                     ablation_levels=ctx.levels(b.claim_levels))]


def _zeroshot_calls(ctx: StudyContext) -> list[Options]:
    b = ctx.budget
    return [ctx.options(CompareOptions, methods=",".join(["dense", *SEARCHED]), sparsity=ctx.levels(b.claim_levels),
                        no_ppl=True, seq_len=b.ppl_seq_len, zeroshot=True, tasks=",".join(ZEROSHOT_TASKS),
                        limit=b.zeroshot_limit, plans_dir=str(ctx.plans_dir), out=str(ctx.out / "zeroshot"),
                        overwrite=True)]


def task_aligned_batch(samples: int, cap: int = 8) -> int:
    """The largest batch of at most `cap` prompts that divides the samples per task: the suite lists its items task
    by task, so every batch holds one task's prompts (one length, one answer length) and no row decodes past its own
    answer to wait for another task's. Batched generation equals one prompt at a time (left padding, tested), so
    the store's entries serve either."""
    return max(d for d in range(1, min(cap, samples) + 1) if samples % d == 0)


def _longctx_calls(ctx: StudyContext) -> list[Options]:
    b = ctx.budget
    # batched: a decode step on 2 cores costs about the same for 1 row as for 6 (it reads the weights once)
    return [ctx.options(LongctxOptions, methods="dense,sleb,orthorank", sparsity=level, lengths=b.longctx_lengths,
                        samples=b.longctx_samples, batch_size=task_aligned_batch(b.longctx_samples),
                        out=str(ctx.out / f"longctx-{sparsity_label(level)}"), overwrite=True)
            for level in b.claim_levels]


def _speed_calls(ctx: StudyContext) -> list[Options]:
    b = ctx.budget
    return [ctx.options(BenchOptions, methods=["dense", *SEARCHED], sparsity=level, mode=["prefill", "decode"],
                        seq_len=[b.speed_seq_len], repeats=b.speed_repeats, new_tokens=b.decode_tokens,
                        policies=THRESHOLD, json_out=str(ctx.out / "speed" / f"bench-{sparsity_label(level)}.json"),
                        overwrite=True)
            for level in b.claim_levels]


def _decode_calls(ctx: StudyContext) -> list[Options]:
    b = ctx.budget
    return [ctx.options(CompareOptions, methods="dense,sleb,orthorank", sparsity=ctx.levels(b.claim_levels),
                        datasets="wikitext2,c4", seq_len=b.ppl_seq_len, max_windows=b.ppl_windows,
                        batch_size=min(8, b.ppl_windows), continuation=True, policies=THRESHOLD,
                        plans_dir=str(ctx.plans_dir), out=str(ctx.out / "decode"), overwrite=True)]


def _hybrid_calls(ctx: StudyContext) -> list[Options]:
    b = ctx.budget
    table = ctx.out / "hybrid" / "cost-table.json"
    calls: list[Options] = []
    if not table.is_file():
        calls.append(hybrid_cost_table(ctx, table))
    missing = _missing_plans(ctx, "hybrid")
    if missing:
        calls.append(ctx.options(CalibrateOptions, method="hybrid", cost_table=str(table),
                                 sparsity=ctx.levels(tuple(missing)), out=str(ctx.plans_dir), **b.calibration))
    calls.append(compare_on_domains(ctx, ["dense", "sleb", "orthorank", "hybrid"], b.levels, ctx.out / "hybrid",
                          measure_speed=b.speed_repeats))
    return calls


ROUTER_POLICIES = "random,oracle"  # the headroom's two ends on the router's own layers and ratio


def _hybrid_levels_with_removals(ctx: StudyContext) -> list[float]:
    """Levels whose hybrid plan both removes layers and selects in others: there the router gets a second plan, the
    hybrid plan's layers (on Gemma 3 270M at 20% the paper's rule's own layers lose to SLEB whatever the rule, while
    the hybrid plan's selection layers, routed, win)."""
    out = []
    for level in ctx.budget.levels:
        path = ctx.plans_dir / f"hybrid-{sparsity_label(level)}.json"
        if path.is_file():
            plan = Plan.load(path)
            if plan.removed_layers and plan.selection_layers:
                out.append(level)
    return out


def _router_calls(ctx: StudyContext) -> list[Options]:
    b, r = ctx.budget, ctx.budget.router
    calls: list[Options] = []
    for level in _missing_plans(ctx, "router"):
        s = sparsity_label(level)
        calls.append(ctx.options(FitRouterOptions, plan=str(ctx.plans_dir / f"orthorank-{s}.json"),
                                 json_out=str(ctx.plans_dir / f"router-{s}.json"), **r.fit_options()))
    hybrid_levels = _hybrid_levels_with_removals(ctx) if b.hybrid else []
    for level in hybrid_levels:
        s = sparsity_label(level)
        if not (ctx.plans_dir / f"router-hybrid-{s}.json").is_file():
            # the hybrid plan was matched to a measured speed-up; its router plan skips exactly SLEB's compute
            calls.append(ctx.options(FitRouterOptions, plan=str(ctx.plans_dir / f"hybrid-{s}.json"),
                                     json_out=str(ctx.plans_dir / f"router-hybrid-{s}.json"),
                                     match_compute_of=str(ctx.plans_dir / f"sleb-{s}.json"),
                                     cost_seq_len=b.ppl_seq_len, **r.fit_options()))
    calls.append(compare_on_domains(ctx, ["dense", "sleb", "orthorank", "router"], b.levels, ctx.out / "router",
                          policies=ROUTER_POLICIES, ablation_levels=ctx.levels(b.claim_levels)))
    if hybrid_levels:
        calls.append(compare_on_domains(ctx, ["sleb", "hybrid", "router-hybrid"], tuple(hybrid_levels),
                              ctx.out / "router" / "hybrid"))
    return calls


def _router_output(ctx: StudyContext) -> Path:
    """The last comparison the router stage runs (the hybrid plans' one where a hybrid plan removes layers)."""
    if ctx.budget.hybrid and _hybrid_levels_with_removals(ctx):
        return ctx.out / "router" / "hybrid" / "compare.json"
    return ctx.out / "router" / "compare.json"


def _top_level_output(folder: str, name: str) -> Callable[[StudyContext], Path]:
    """A per-level stage's last output: the file of the highest claim level (its commands run level by level)."""
    def output(ctx: StudyContext) -> Path:
        level = sparsity_label(ctx.budget.claim_levels[-1])
        return ctx.out / folder.format(level=level) / name.format(level=level)
    return output


STAGES: list[Stage] = [
    Stage("sink", "attention-sink analysis (sink similarity and drift per layer)",
          lambda ctx: ctx.out / "sink" / "analysis.json",
          lambda ctx: [ctx.options(AnalyzeOptions, dataset="wikitext2", samples=ctx.budget.sink_samples, seq_len=512,
                                   out=str(ctx.out / "sink"), overwrite=True)]),
    Stage("plans", "plans of every method at every level (searched once, kept under plans/<model>/)",
          _plans_output, _plans_calls, finish=lambda ctx: _write_plans_index(ctx)),
    Stage("perplexity", "perplexity on every domain, paired ratios, worst-domain ratios, the four ablations",
          lambda ctx: ctx.out / "perplexity" / "compare.json", _ppl_calls),
    Stage("zeroshot", "zero-shot accuracy on five tasks", lambda ctx: ctx.out / "zeroshot" / "compare.json",
          _zeroshot_calls),
    Stage("longctx", "the offline long-context suite", _top_level_output("longctx-{level}", "longctx.json"),
          _longctx_calls),
    Stage("speed", "prefill and decode speed with the saved plans",
          _top_level_output("speed", "bench-{level}.json"), _speed_calls,
          done=finished_json),
    Stage("decode", "decode policies: each window's second half decoded through the KV cache (dense and threshold "
          "decoding)", lambda ctx: ctx.out / "decode" / "compare.json", _decode_calls, lambda b: b.decode_policies),
    Stage("hybrid", "the hybrid frontier (remove / select / keep per layer under this machine's cost table): "
          "perplexity against the prefill speed-up measured side by side",
          lambda ctx: ctx.out / "hybrid" / "compare.json", _hybrid_calls, lambda b: b.hybrid),
    Stage("router", "the router policy: fitted on calibration text for OrthoRank's layers (and for a hybrid plan's "
          "selection layers where it removes layers too), against SLEB and the paper's rule on every domain at "
          "exactly SLEB's compute (router FLOPs counted)",
          _router_output, _router_calls, lambda b: b.router is not None),
    Stage("decode-router", "the causal router: thresholds fitted on calibration text for the router stage's plans, "
          "then perplexity against SLEB on every domain and batch-1 decode speed side by side: does it beat SLEB at "
          "SLEB's decode speed here?", decode_router.output, decode_router.calls, lambda b: b.router is not None,
          finish=decode_router.finish),
    Stage("transfer", "the transfer matrix: every method calibrated on several sources, evaluated on every domain",
          transfer_output, transfer_calls, lambda b: b.transfer is not None, transfer_done, finish=render_matrix,
          after_command=after_command, optional=True),
    Stage("policies", "selection policies on the study's plans: the oracle's headroom, perplexity, zero-shot and "
          "long inputs per rule, and the long-input fix decided from the intervals", policies_output, policies_calls,
          lambda b: b.policies is not None, finish=finish_policies, optional=True),
]


def _long_prompt_output(ctx: StudyContext) -> Path:
    return ctx.out / "long-prompt" / "frontier.json"


def _long_prompt_done(path: Path) -> bool:
    """Finished when the frontier holds every length the budget asks for (it is rewritten after each length)."""
    return finished_json(path)


def _long_prompt_calls(ctx: StudyContext) -> list[Options]:
    # the shipped long-prompt preset gets its own row, so a study of any model checks it there
    preset = "long-prompt" if "long-prompt" in presets_available() else None
    return [ctx.options(FrontierOptions, **ctx.budget.long_prompt.frontier_options(), plans_dir=str(ctx.plans_dir),
                        preset=preset, out=str(ctx.out / "long-prompt"), overwrite=True)]


STAGES.append(
    Stage("long-prompt", "the retrieval frontier: measured prefill speed-up against the needle score per method and "
          "level at long prompt lengths, each method's free speed-up", _long_prompt_output, _long_prompt_calls,
          lambda b: b.long_prompt is not None, _long_prompt_done, optional=True))


def stage_names(optional: bool = True) -> list[str]:
    """Every stage's name; optional=False: those a study runs when --stages is not given."""
    return [s.name for s in STAGES if optional or not s.optional]


def run_stage(ctx: StudyContext, stage: Stage) -> float | None:
    """Run one stage's commands unless its output exists; its wall time in seconds (None when it was done)."""
    if stage.done(stage.output(ctx)):
        ctx.log(f"study: {stage.name}: done before ({stage.output(ctx)})")
        return None
    started = time.time()
    ctx.log(f"study: {stage.name}: {stage.what}")
    for options in stage.calls(ctx):
        ctx.log("study: + orthorank " + shlex.join(options.argv()))
        try:
            api.call(options)
        except UserError as exc:
            raise UserError(f"stage {stage.name} stopped: orthorank {options.command}: {exc} (run the study again "
                            "to resume it)") from None
        if stage.after_command is not None:
            stage.after_command(ctx, options)
    if stage.finish is not None:
        stage.finish(ctx)
    return time.time() - started


def _write_plans_index(ctx: StudyContext) -> None:
    plans = {}
    for method in SEARCHED:
        for s in ctx.budget.levels:
            path = ctx.plans_dir / f"{method}-{sparsity_label(s)}.json"
            if not path.is_file():
                raise UserError(f"stage plans finished without {path}")
            plans[f"{method}-{sparsity_label(s)}"] = json.loads(path.read_text())
    atomic_write_text(_plans_output(ctx), json.dumps({"plans_dir": str(ctx.plans_dir), "plans": plans}, indent=1)
                      + "\n")
