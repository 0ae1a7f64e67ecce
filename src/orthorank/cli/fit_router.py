"""`orthorank fit-router`: fit the router policy for a plan's selection layers on calibration text and write the plan
with the router inside it (search/router_fit.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from orthorank.cli.calibration_options import check_calibration_source
from orthorank.cli.common import (
    DATA_DIR_HELP, add_model_args, add_store_args, check_memory, deprecated, load_from_args, positive_int,
    store_from_args,
)
from orthorank.errors import UserError, comma_items, number_list
from orthorank.method.cost import Arch, closest_count, compute_sparsity, hybrid_compute_sparsity
from orthorank.method.plan import DEFAULT_COST_SEQ_LEN, REMOVE, Plan, parse_layers
from orthorank.method.policies import get_policy
from orthorank.method.selection import keep_count
from orthorank.search import router_fit  # called as router_fit.fit_router: tests patch it
from orthorank.search.calibration import DEFAULT_CALIB_DATA, calibration_set
from orthorank.search.router_fit import DEFAULT_ALPHAS, DEFAULT_TARGETS, TARGETS, FitSettings, fit_key
from orthorank.store import model_fingerprint

DEFAULT_SAMPLES = 32
DEFAULT_SEQ_LEN = 512


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit-router", help="fit the router policy for a plan's selection layers; write a router plan",
                       description="Fit a linear router per selection layer of PLAN on calibration text (never "
                                   "evaluation text), choose its target and regularisation on held-out calibration "
                                   "windows, and write PLAN's layers with policy router and the fitted state. An "
                                   "OrthoRank plan's keep ratio is re-matched so that its compute, router included, "
                                   "equals what the plan was matched to.")
    add_model_args(p)
    p.add_argument("--plan", required=True, help="the plan whose selection layers get a router (orthorank or hybrid)")
    out = p.add_mutually_exclusive_group(required=True)  # a group, so that the old --out satisfies it too
    out.add_argument("--json", dest="json_out", metavar="FILE", help="the router plan file to write (required)")
    deprecated(p, "--json", "--out")
    p.add_argument("--calib-data", default=DEFAULT_CALIB_DATA,
                   help="calibration text: a domain's held-out part (c4, wikitext2, news, code), mix, mix:A+B, or a "
                        "text file (default %(default)s)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--calib-samples", type=positive_int, default=DEFAULT_SAMPLES,
                   help="calibration windows (default %(default)s; a quarter is held out)")
    p.add_argument("--seq-len", type=positive_int, default=DEFAULT_SEQ_LEN,
                   help="calibration window length (default %(default)s)")
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                   help="candidate targets, the best on held-out windows kept: " + "; ".join(
                       f"{k}: {v}" for k, v in TARGETS.items()) + " (default %(default)s)")
    p.add_argument("--alphas", default=",".join(f"{a:g}" for a in DEFAULT_ALPHAS),
                   help="ridge penalties to choose from on held-out windows (default %(default)s)")
    p.add_argument("--iterations", type=positive_int, default=2,
                   help="recording passes (the paper's rule selects in the first, the router after; default "
                        "%(default)s)")
    p.add_argument("--fisher-samples", type=positive_int, default=2,
                   help="sampled next-token sequences per window for the fisher target (default %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=4, help="windows per forward (default %(default)s)")
    p.add_argument("--keep-ratio", action="store_true",
                   help="keep the plan's ratio (default: re-match an OrthoRank plan's compute with the router's cost)")
    p.add_argument("--match-compute-of", default=None, metavar="PLAN",
                   help="set the keep ratios so that the router plan skips exactly this plan's compute (e.g. SLEB's "
                        "at the same level; default: the compute the plan itself skipped)")
    p.add_argument("--cost-seq-len", type=positive_int, default=None,
                   help="sequence length of the compute match (default: the plan's own cost length)")
    p.add_argument("--layers", default=None, metavar="LIST|inner",
                   help="fit a router bank for these layers instead of the plan's (inner: every layer but the first "
                        "and last), recorded on the dense model (ratio 1.0), for `calibrate --policy router --router "
                        "BANK` to search layers under the router; give one --targets (default: the plan's own "
                        "selection layers)")
    p.add_argument("--always-route", action="store_true",
                   help="write the router plan even when no router beat the paper's rule on the held-out calibration "
                        "windows (default: the plan then keeps the paper's rule, re-matched to the same compute)")
    add_store_args(p)
    p.add_argument("--overwrite", action="store_true", help="replace --json FILE if it exists")
    p.set_defaults(func=run)


def rematch(plan: Plan, scoring: float, target: float | None = None, seq_len: int | None = None) -> Plan:
    """The plan with its keep ratios set so that its selection layers, each paying `scoring` FLOPs per token to
    choose, skip `target` (default: the compute share the plan had) at `seq_len` (default: its cost length): the
    closest whole number of kept tokens. An OrthoRank plan's one ratio moves; a hybrid plan's selection layers all
    keep the same number of tokens more (or fewer) than they did, each ratio staying inside (0, 1)."""
    arch = Arch(**plan.arch)
    seq_len = seq_len or int(plan.provenance.get("cost_seq_len", DEFAULT_COST_SEQ_LEN))
    target = plan.compute_sparsity(arch, seq_len) if target is None else target
    if plan.method == "orthorank":
        n = len(plan.layers)

        def skipped(k: int) -> float:
            return compute_sparsity(arch, seq_len, "orthorank", n, k / seq_len, scoring=scoring)

        ratio = closest_count(skipped, 1, seq_len, target) / seq_len
        return dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, ratio=ratio))
    kept = {i: keep_count(seq_len, float(a)) for i, a in plan.actions.items() if a != REMOVE}
    removed = len(plan.removed_layers)
    lo, hi = -min(kept.values()) + 1, seq_len - 1 - max(kept.values())

    def shifted(d: int) -> list[float]:
        return [(k + d) / seq_len for k in kept.values()]

    def skipped_h(j: int) -> float:  # j = d - lo >= 0, decreasing in j as closest_count needs
        return hybrid_compute_sparsity(arch, seq_len, removed, shifted(j + lo), scoring=scoring)

    if not (skipped_h(0) >= target >= skipped_h(hi - lo)):
        raise UserError(f"no keep ratios of this hybrid plan's {len(kept)} selection layers reach compute "
                        f"sparsity {target:.4f} at {seq_len} tokens (they span {skipped_h(hi - lo):.4f}-"
                        f"{skipped_h(0):.4f})")
    d = closest_count(skipped_h, 0, hi - lo, target) + lo
    actions = {i: (a if a == REMOVE else (kept[i] + d) / seq_len) for i, a in plan.actions.items()}
    return dataclasses.replace(plan, actions=actions)


def run(args) -> int:
    out = Path(args.json_out)
    if out.exists() and not args.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    if out.parent.exists() and not out.parent.is_dir():
        raise UserError(f"cannot write {out}: {out.parent} is not a folder")
    plan = Plan.load(args.plan)
    source_hash = plan.content_hash()  # before any re-matching: the plan the router was fitted for
    if plan.method not in ("orthorank", "hybrid"):
        raise UserError(f"{args.plan} is a {plan.method} plan: it selects tokens in no layer, so there is no router "
                        "to fit")
    targets = comma_items(args.targets)
    alphas = tuple(number_list(args.alphas, "--alphas"))
    settings = FitSettings(targets=tuple(targets), alphas=alphas, iterations=args.iterations,
                           fisher_samples=args.fisher_samples, batch_size=args.batch_size, seed=args.seed)
    if args.layers is not None and len(targets) != 1:
        raise UserError("--layers fits a router bank on the dense model, where every target gives the dense loss: "
                        "choose its target with one --targets (e.g. the one fit-router chose for your plan)")
    check_calibration_source(args.calib_data, args.data_dir)
    other = Plan.load(args.match_compute_of) if args.match_compute_of else None  # read before the model loads
    if args.layers is not None:
        L = plan.num_layers
        layers = list(range(1, L - 1)) if args.layers == "inner" else parse_layers(args.layers, L)
        plan = dataclasses.replace(plan, method="orthorank", layers=layers, actions=None,
                                   selection=dataclasses.replace(plan.selection, ratio=1.0))
        args.keep_ratio = True
    lm = load_from_args(args)
    plan.check_model(lm.name, lm.signature())
    if lm.tokenizer is None:
        raise UserError("a router fit needs a real model with a tokenizer (calibration text)")
    check_memory(lm, args.batch_size, args.seq_len, "fit-router", loss=True)
    matched = None
    cost_len = args.cost_seq_len or int(plan.provenance.get("cost_seq_len", DEFAULT_COST_SEQ_LEN))
    if other is not None:
        other.check_model(lm.name, lm.signature())
        matched = {"plan": args.match_compute_of, "compute": other.compute_sparsity(seq_len=cost_len),
                   "seq_len": cost_len}
    source = plan
    if not args.keep_ratio and plan.arch:
        plan = rematch(plan, get_policy("router").scoring_flops(plan.arch["hidden"]),
                       None if matched is None else matched["compute"], cost_len)
    selection = plan.selection
    base = dataclasses.replace(plan, selection=dataclasses.replace(selection, policy="orthogonal", fitted=None))
    calib = calibration_set(lm.tokenizer, args.calib_data, args.calib_samples, args.seq_len, args.seed,
                            args.data_dir)

    def say(text: str) -> None:
        print(f"fit-router: {text}", file=sys.stderr, flush=True)

    ratios = sorted({round(c.ratio, 6) for c in plan.selection_layers.values()})
    say(f"{len(plan.selection_layers)} selection layers, ratio {', '.join(f'{r:g}' for r in ratios)}; calibration "
        f"{args.calib_samples} x {args.seq_len} tokens of {args.calib_data} (seed {args.seed})")
    t0 = time.perf_counter()
    checkpoint = None
    store = store_from_args(args)
    if store is not None:  # each finished recording pass is kept: a killed fit resumes after it
        checkpoint = store.namespace("router-fit", fit_key(model_fingerprint(lm.model), base, calib.windows,
                                                           settings))
    result = router_fit.fit_router(lm.model, base, calib.windows, settings, calib.provenance, log=say,
                                   checkpoint=checkpoint)
    seconds = time.perf_counter() - t0
    nll = result.report["held_out_nll"]
    # a router that does not beat the paper's rule where it was chosen is not handed out by default: the plan keeps
    # the paper's rule (its cheaper scoring re-matched to the same compute), and says so
    keep_paper = (nll["router"] >= nll["orthogonal"] and not args.always_route and args.layers is None)
    if keep_paper:
        kept = dataclasses.replace(source, selection=dataclasses.replace(source.selection, policy="orthogonal",
                                                                         fitted=None))
        if not args.keep_ratio and kept.arch:
            kept = rematch(kept, get_policy("orthogonal").scoring_flops(kept.arch["hidden"]),
                           None if matched is None else matched["compute"], cost_len)
        selection = kept.selection
    else:
        kept = base
        selection = dataclasses.replace(base.selection, policy="router", fitted=result.state)
    routed = dataclasses.replace(
        kept, selection=selection,
        provenance={**{k: v for k, v in plan.provenance.items() if k != "measured"},
                    "router_of": {"plan": str(args.plan), "content_hash": source_hash,
                                  "compute_matched_to": matched},
                    "router_fit": {**result.report, "seconds": round(seconds, 1), "device": str(lm.device),
                                   "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
                                   "kept": "orthogonal" if keep_paper else "router"}})
    if plan.provenance.get("search"):
        routed.provenance["search"] = f"{plan.provenance['search']}+router"
    out.parent.mkdir(parents=True, exist_ok=True)
    routed.save(out, overwrite=args.overwrite)
    chosen = result.report.get("chosen") or {}
    say(f"chose target {chosen.get('target')} (pass {chosen.get('pass')}): held-out calibration NLL "
        f"{nll['router']:.4f} against the paper's rule's {nll['orthogonal']:.4f}; fitted in {seconds:.0f} s")
    if keep_paper:
        say(f"no router beat the paper's rule on the held-out calibration windows: {out} keeps the paper's rule "
            f"(keep ratio {routed.selection.ratio:g}); pass --always-route to write the router anyway")
    print(json.dumps({"plan": str(out), "target": chosen.get("target"), "held_out_nll": nll,
                      "kept": routed.selection.policy, "ratio": routed.selection.ratio, "seconds": round(seconds, 1)}))
    return 0
