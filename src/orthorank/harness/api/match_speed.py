"""`orthorank match-speed`: a selection plan's keep ratio set to another plan's measured prefill speed-up.

Compute matching counts FLOPs (the router's included). Selection layers also spend time the FLOP model does not
count: scoring's float32 copies, gathers, the selected queries' attention above its share
(`bench --mode layer --profile`). Matching measured speed makes the plan pay for that time in kept tokens, so a
quality comparison then runs at equal cost as this machine measures it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from orthorank.errors import UserError
from orthorank.harness.api.common import load_model_from_options
from orthorank.harness.api.options.search import MatchSpeedOptions
from orthorank.harness.runtime.matching import match_speed, with_ratio
from orthorank.method.plan import Plan


def _check(opts: MatchSpeedOptions, plan: Plan, reference: Plan) -> None:
    if not plan.kind.one_selection:
        raise UserError(f"{opts.plan} is a {plan.method} plan: match-speed sets one keep ratio for every selection "
                        "layer, so it needs an orthorank plan (a router plan is one)")
    if reference.kind.dense:
        raise UserError(f"--to {opts.to} is a dense plan: nothing to match")
    if not opts.tolerance > 0:
        raise UserError(f"--tolerance must be above 0, got {opts.tolerance:g}")
    if not 0 < opts.min_ratio <= plan.selection.ratio:
        raise UserError(f"--min-ratio must be in (0, {plan.selection.ratio:g}] (the plan's keep ratio), got "
                        f"{opts.min_ratio:g}")
    out = Path(opts.out)
    if out.exists() and not opts.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")


def run(opts: MatchSpeedOptions) -> int:
    plan, reference = Plan.load(opts.plan), Plan.load(opts.to)
    _check(opts, plan, reference)
    lm = load_model_from_options(opts)
    for p in (plan, reference):
        p.check_model(lm.name, lm.signature())
    T = min(opts.seq_len, int(getattr(lm.config, "max_position_embeddings", None) or opts.seq_len))
    window = torch.randint(0, int(lm.config.vocab_size), (T,), generator=torch.Generator().manual_seed(opts.seed))

    def say(text: str) -> None:
        print(f"match-speed: {text}", file=sys.stderr, flush=True)

    say(f"{opts.plan} (keep ratio {plan.selection.ratio:g}) against {opts.to}: {T} tokens, {opts.repeats} rounds per "
        f"probe, {torch.get_num_threads()} thread(s)")
    found = match_speed(lm.model, lambda r: with_ratio(plan, r), reference, window, plan.selection.ratio,
                        opts.repeats, opts.max_probes, log=say, min_ratio=opts.min_ratio, tolerance=opts.tolerance)
    matched = with_ratio(plan, found["ratio"])
    about = {"seq_len": T, "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."),
             "threads": torch.get_num_threads(), "device": str(lm.device), "repeats": opts.repeats}
    matched = dataclasses.replace(matched, provenance={
        **{k: v for k, v in plan.provenance.items() if k != "measured"},
        "speed_matched": {"rule": "equal measured prefill speed-up", "knob": "one keep ratio for every selection "
                          "layer", "plan": str(opts.plan), "reference": str(opts.to),
                          "base_ratio": plan.selection.ratio, "ratio": found["ratio"],
                          "speedup": found["speedup"]["speedup"], "reference_speedup": found["reference"]["speedup"],
                          "difference": round(found["difference"], 4), "tolerance": opts.tolerance,
                          "within_tolerance": found["within_tolerance"], "noise_iqr": found["noise"],
                          "within_noise": found["within_noise"], "probes": found["probes"], **about}})
    path = matched.save(opts.out, overwrite=opts.overwrite)
    verdict = "matched" if found["within_tolerance"] else "NOT matched"
    say(f"keep ratio {found['ratio']:.4f}: {found['speedup']['speedup']:.3f}x against the reference's "
        f"{found['reference']['speedup']:.3f}x ({verdict} within {opts.tolerance:g}; per-round noise "
        f"{found['noise']:.3f}); compute sparsity "
        f"{matched.compute_sparsity() or 0:.4f} against the reference's {reference.compute_sparsity() or 0:.4f}; "
        f"wrote {path}")
    return 0
