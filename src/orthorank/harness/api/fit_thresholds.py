"""`orthorank fit-thresholds`: a router plan made causal, a threshold per selection layer fitted on calibration text
(harness/search/thresholds.py), so that prefill and decoding decide each token alike."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from orthorank.errors import UserError
from orthorank.harness.api.calibration_options import check_calibration_source
from orthorank.harness.api.common import check_memory, load_model_from_options
from orthorank.harness.api.options import FitThresholdsOptions
from orthorank.harness.search.calibration import calibration_set
from orthorank.harness.search.thresholds import fit_thresholds
from orthorank.method.plan import Plan
from orthorank.method.policies import FITTED


def _check(opts: FitThresholdsOptions, plan: Plan) -> None:
    out = Path(opts.out)
    if out.exists() and not opts.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    if out.parent.exists() and not out.parent.is_dir():
        raise UserError(f"cannot write {out}: {out.parent} is not a folder")
    sel = plan.selection
    if not plan.kind.selects or sel is None or FITTED not in sel.rule.needs or sel.fitted is None:
        raise UserError(f"{opts.plan} is not a router plan: fit its router first (`orthorank fit-router --plan "
                        f"{opts.plan} --out ROUTER_PLAN`), then fit the thresholds of ROUTER_PLAN")
    if opts.keep is not None:
        if not 0 < opts.keep <= 1:
            raise UserError(f"--keep must be a share in (0, 1], got {opts.keep:g}")
        if not plan.kind.one_selection:
            raise UserError(f"{opts.plan} is a {plan.method} plan with a keep ratio per layer: --keep sets one share "
                            "for every layer, so it needs an orthorank plan (a router plan is one)")
    if opts.calib_samples < 2:
        raise UserError("--calib-samples must be at least 2: a quarter of the windows is held out")


def run(opts: FitThresholdsOptions) -> int:
    plan = Plan.load(opts.plan)
    source_hash = plan.content_hash()
    _check(opts, plan)
    check_calibration_source(opts.calib_data, opts.data_dir)
    lm = load_model_from_options(opts)
    plan.check_model(lm.name, lm.signature())
    if lm.tokenizer is None:
        raise UserError("fitting thresholds needs a real model with a tokenizer (calibration text)")
    check_memory(lm, opts.batch_size, opts.seq_len, "fit-thresholds")
    calib = calibration_set(lm.tokenizer, opts.calib_data, opts.calib_samples, opts.seq_len, opts.seed,
                            opts.data_dir)

    def say(text: str) -> None:
        print(f"fit-thresholds: {text}", file=sys.stderr, flush=True)

    say(f"{len(plan.selection_layers)} selection layers; calibration {opts.calib_samples} x {opts.seq_len} tokens of "
        f"{opts.calib_data} (seed {opts.seed}), a quarter held out")
    if opts.keep is not None:
        plan = dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, ratio=opts.keep))
    t0 = time.perf_counter()
    causal, report = fit_thresholds(lm.model, plan, calib.windows, opts.batch_size, log=say)
    seconds = time.perf_counter() - t0
    causal = dataclasses.replace(causal, provenance={
        **{k: v for k, v in plan.provenance.items() if k != "measured"},
        "thresholds_of": {"plan": str(opts.plan), "content_hash": source_hash, "keep": opts.keep},
        "thresholds_fit": {**report, "calibration": calib.provenance, "seconds": round(seconds, 1),
                           "device": str(lm.device),
                           "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch.")}})
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    causal.save(out, overwrite=opts.overwrite)
    say(f"wrote {out} ({seconds:.0f} s)")
    print(json.dumps({"plan": str(out), **report, "seconds": round(seconds, 1)}))
    return 0
