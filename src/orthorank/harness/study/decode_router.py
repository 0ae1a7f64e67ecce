"""The decode-router stage (issue 58): does a causal router, deciding each token by a fitted threshold, beat SLEB at
SLEB's decode speed on this model and text?

Per claim level, on the router stage's plan (router-<s>.json): thresholds fitted on calibration text
(fit-thresholds: router-causal-<s>.json); where the router fit declined the router for that level, a router is
fitted on the same layers anyway first (fit-router --always-route: router-forced-<s>.json), since the paper's top-K
rule is not causal. Then perplexity on the perplexity stage's windows against dense, SLEB and the top-K router, and
decode speed at batch 1 on prompts of calibration text (a causal router's skips depend on what it reads) against
dense and SLEB, in two runs (the first and a replicate). The answer follows harness/reports/decode_router.py's rule, fixed before any run.
"""

from __future__ import annotations

import json
from pathlib import Path

from orthorank.errors import UserError
from orthorank.harness.api.options import BenchOptions, FitRouterOptions, FitThresholdsOptions, Options
from orthorank.harness.reports.decode_router import CAPTION, REPLICATE, Speed, folder_lines, level_evidence
from orthorank.harness.results import atomic_write_text
from orthorank.harness.study.context import StudyContext, compare_on_domains, finished_json
from orthorank.method.plan_store import sparsity_label

FOLDER = "decode-router"
PROMPTS = "mix"  # decode prompts: the calibration mix's held-out parts, never evaluation windows


def output(ctx: StudyContext) -> Path:
    return ctx.out / FOLDER / "decode-router.json"


def _is_router(path: Path) -> bool:
    return json.loads(path.read_text()).get("selection", {}).get("policy") == "router"


def _layers(path: Path) -> list[int]:
    return list(json.loads(path.read_text())["layers"])


def _check_layers(plan: Path, base: Path) -> None:
    """A plan this stage would reuse must sit on its base plan's layers: another script's plan of the same name
    (studies/decode-router/run.sh forced a router on the searched layers) would answer for the wrong plan."""
    if plan.is_file() and base.is_file() and _layers(plan) != _layers(base):
        raise UserError(f"{plan} selects in layers {_layers(plan)}, not in {base.name}'s {_layers(base)}: it was "
                        f"made from another plan; move it away so that the decode-router stage fits its own")


def _causal_plan_calls(ctx: StudyContext, s: str) -> list[Options]:
    r = ctx.budget.router
    calls: list[Options] = []
    causal = ctx.plans_dir / f"router-causal-{s}.json"
    base = ctx.plans_dir / f"router-{s}.json"
    _check_layers(causal, base)
    if causal.is_file():
        return calls
    # a plan the router fit declined keeps the paper's rule: written only after the router stage, so read it then
    if base.is_file() and not _is_router(base):
        orthorank, base = base, ctx.plans_dir / f"router-forced-{s}.json"
        _check_layers(base, orthorank)
        if not base.is_file():
            calls.append(ctx.options(FitRouterOptions, plan=str(ctx.plans_dir / f"orthorank-{s}.json"),
                                     always_route=True, json_out=str(base), **r.fit_options()))
    calls.append(ctx.options(FitThresholdsOptions, plan=str(base), out=str(causal), calib_samples=r.calib_samples,
                             seq_len=r.calib_seq_len))
    return calls


def calls(ctx: StudyContext) -> list[Options]:
    b = ctx.budget
    out: list[Options] = []
    for level in b.claim_levels:
        s = sparsity_label(level)
        out += _causal_plan_calls(ctx, s)
        out.append(compare_on_domains(ctx, ["dense", "sleb", "router", "router-causal"], (level,),
                                      ctx.out / FOLDER / f"compare-{s}"))
        # the answer needs batch 1 level with SLEB or faster in every run: a first run and a replicate, each timed
        # once (a finished bench is kept when a stopped stage resumes: timings are not in the result store)
        for folder in (ctx.out / FOLDER, ctx.out / FOLDER / REPLICATE):
            path = folder / f"bench-decode-{s}-b1-n{b.decode_tokens}.json"
            if not finished_json(path):
                out.append(ctx.options(BenchOptions, methods=["dense", "sleb", "router-causal"], sparsity=level,
                                       mode=["decode"], batch=[1], seq_len=[b.speed_seq_len],
                                       new_tokens=b.decode_tokens, repeats=b.speed_repeats, prompt_text=PROMPTS,
                                       json_out=str(path), overwrite=True))
    return out


def finish(ctx: StudyContext) -> None:
    """decode-router.json (the answer per level) and summary.md (the report's section)."""
    folder = ctx.out / FOLDER
    levels = []
    for level in ctx.budget.claim_levels:
        ev = level_evidence(folder, folder / f"compare-{sparsity_label(level)}" / "compare.json")
        if ev is not None:
            levels.append({"level": ev["level"], "method": ev["method"], "answer": ev["answer"],
                           "worst_domain": ev["worst"],
                           "decode": [{k: (v.to_json() if isinstance(v, Speed) else v) for k, v in d.items()}
                                      for d in ev["decode"]]})
    atomic_write_text(folder / "summary.md", "\n".join([CAPTION, "", *folder_lines(folder, ctx.model_name)]).rstrip()
                      + "\n")
    atomic_write_text(output(ctx), json.dumps({"model": ctx.model_name, "levels": levels}, indent=1) + "\n")
