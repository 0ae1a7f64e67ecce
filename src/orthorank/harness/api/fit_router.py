"""`orthorank fit-router`: fit the router policy for a plan's selection layers on calibration text and write the plan
with the router inside it (harness/search/router_fit.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from orthorank.harness.api.calibration_options import check_calibration_source
from orthorank.harness.api.common import check_memory, load_model_from_options, store_from_options
from orthorank.harness.api.options import FitRouterOptions
from orthorank.errors import UserError, comma_items, number_list
from orthorank.method.cost import Arch, closest_count, selection_sparsity, hybrid_compute_sparsity
from orthorank.method.plan import DEFAULT_COST_SEQ_LEN, REMOVE, Plan, parse_layers
from orthorank.method.policies import get_policy
from orthorank.method.selection import keep_count
from orthorank.harness.search import router_fit  # called as router_fit.fit_router: tests patch it
from orthorank.harness.search.calibration import calibration_set
from orthorank.harness.search.router_fit import FitSettings, fit_key
from orthorank.harness.store import model_fingerprint


def rematch(plan: Plan, scoring: float, target: float | None = None, seq_len: int | None = None) -> Plan:
    """The plan with its keep ratios set so that its selection layers, each paying `scoring` FLOPs per token to
    choose, skip `target` (default: the compute share the plan had) at `seq_len` (default: its cost length): the
    closest whole number of kept tokens. An OrthoRank plan's one ratio moves; a hybrid plan's selection layers all
    keep the same number of tokens more (or fewer) than they did, each ratio staying inside (0, 1)."""
    arch = Arch(**plan.arch)
    seq_len = seq_len or int(plan.provenance.get("cost_seq_len", DEFAULT_COST_SEQ_LEN))
    target = plan.compute_sparsity(arch, seq_len) if target is None else target
    if plan.kind.one_selection:
        n = len(plan.layers)

        def skipped(k: int) -> float:
            return selection_sparsity(arch, seq_len, n, k / seq_len, scoring=scoring)

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


def _fit_settings(opts: FitRouterOptions) -> FitSettings:
    targets = comma_items(opts.targets)
    if opts.layers is not None and len(targets) != 1:
        raise UserError("--layers fits a router bank on the dense model, where every target gives the dense loss: "
                        "choose its target with one --targets (e.g. the one fit-router chose for your plan)")
    return FitSettings(targets=tuple(targets), alphas=tuple(number_list(opts.alphas, "--alphas")),
                       iterations=opts.iterations, fisher_samples=opts.fisher_samples, batch_size=opts.batch_size,
                       seed=opts.seed)


def _paper_rule_kept(source: Plan, opts: FitRouterOptions, matched: dict | None, cost_len: int) -> Plan:
    """The plan written when no router beat the paper's rule: the paper's rule on the same layers, its cheaper
    scoring re-matched to the same compute."""
    kept = dataclasses.replace(source, selection=dataclasses.replace(source.selection, policy="orthogonal",
                                                                     fitted=None))
    if not opts.keep_ratio and kept.arch:
        kept = rematch(kept, get_policy("orthogonal").scoring_flops(kept.arch["hidden"]),
                       None if matched is None else matched["compute"], cost_len)
    return kept


def run(opts: FitRouterOptions) -> int:
    out = Path(opts.json_out)
    if out.exists() and not opts.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    if out.parent.exists() and not out.parent.is_dir():
        raise UserError(f"cannot write {out}: {out.parent} is not a folder")
    plan = Plan.load(opts.plan)
    source_hash = plan.content_hash()  # before any re-matching: the plan the router was fitted for
    if not plan.kind.selects:
        raise UserError(f"{opts.plan} is a {plan.method} plan: it selects tokens in no layer, so there is no router "
                        "to fit")
    settings = _fit_settings(opts)
    check_calibration_source(opts.calib_data, opts.data_dir)
    other = Plan.load(opts.match_compute_of) if opts.match_compute_of else None  # read before the model loads
    if opts.layers is not None:
        L = plan.num_layers
        layers = list(range(1, L - 1)) if opts.layers == "inner" else parse_layers(opts.layers, L)
        plan = dataclasses.replace(plan, method="orthorank", layers=layers, actions=None,
                                   selection=dataclasses.replace(plan.selection, ratio=1.0))
        opts = dataclasses.replace(opts, keep_ratio=True)
    lm = load_model_from_options(opts)
    plan.check_model(lm.name, lm.signature())
    if lm.tokenizer is None:
        raise UserError("a router fit needs a real model with a tokenizer (calibration text)")
    check_memory(lm, opts.batch_size, opts.seq_len, "fit-router", loss=True)
    matched = None
    cost_len = opts.cost_seq_len or int(plan.provenance.get("cost_seq_len", DEFAULT_COST_SEQ_LEN))
    if other is not None:
        other.check_model(lm.name, lm.signature())
        matched = {"plan": opts.match_compute_of, "compute": other.compute_sparsity(seq_len=cost_len),
                   "seq_len": cost_len}
    source = plan
    if not opts.keep_ratio and plan.arch:
        plan = rematch(plan, get_policy("router").scoring_flops(plan.arch["hidden"]),
                       None if matched is None else matched["compute"], cost_len)
    selection = plan.selection
    base = dataclasses.replace(plan, selection=dataclasses.replace(selection, policy="orthogonal", fitted=None))
    calib = calibration_set(lm.tokenizer, opts.calib_data, opts.calib_samples, opts.seq_len, opts.seed,
                            opts.data_dir)

    def say(text: str) -> None:
        print(f"fit-router: {text}", file=sys.stderr, flush=True)

    ratios = sorted({round(c.ratio, 6) for c in plan.selection_layers.values()})
    say(f"{len(plan.selection_layers)} selection layers, ratio {', '.join(f'{r:g}' for r in ratios)}; calibration "
        f"{opts.calib_samples} x {opts.seq_len} tokens of {opts.calib_data} (seed {opts.seed})")
    t0 = time.perf_counter()
    checkpoint = None
    store = store_from_options(opts)
    if store is not None:  # each finished recording pass is kept: a killed fit resumes after it
        checkpoint = store.namespace("router-fit", fit_key(model_fingerprint(lm.model), base, calib.windows,
                                                           settings))
    result = router_fit.fit_router(lm.model, base, calib.windows, settings, calib.provenance, log=say,
                                   checkpoint=checkpoint)
    seconds = time.perf_counter() - t0
    nll = result.report["held_out_nll"]
    # a router that does not beat the paper's rule where it was chosen is not handed out by default: the plan keeps
    # the paper's rule (its cheaper scoring re-matched to the same compute), and says so
    keep_paper = (nll["router"] >= nll["orthogonal"] and not opts.always_route and opts.layers is None)
    kept = (_paper_rule_kept(source, opts, matched, cost_len) if keep_paper
            else dataclasses.replace(base, selection=dataclasses.replace(base.selection, policy="router",
                                                                         fitted=result.state)))
    selection = kept.selection
    routed = dataclasses.replace(
        kept, selection=selection,
        provenance={**{k: v for k, v in plan.provenance.items() if k != "measured"},
                    "router_of": {"plan": str(opts.plan), "content_hash": source_hash,
                                  "compute_matched_to": matched},
                    "router_fit": {**result.report, "seconds": round(seconds, 1), "device": str(lm.device),
                                   "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
                                   "kept": "orthogonal" if keep_paper else "router"}})
    if plan.provenance.get("search"):
        routed.provenance["search"] = f"{plan.provenance['search']}+router"
    out.parent.mkdir(parents=True, exist_ok=True)
    routed.save(out, overwrite=opts.overwrite)
    _tell(out, result.report, routed, seconds, say)
    return 0


def _tell(out: Path, report: dict, routed: Plan, seconds: float, say) -> None:
    """What was fitted and kept: a line on stderr, and the summary as one JSON line on stdout."""
    chosen, nll = report.get("chosen") or {}, report["held_out_nll"]
    say(f"chose target {chosen.get('target')} (pass {chosen.get('pass')}): held-out calibration NLL "
        f"{nll['router']:.4f} against the paper's rule's {nll['orthogonal']:.4f}; fitted in {seconds:.0f} s")
    if routed.selection.policy != "router":
        say(f"no router beat the paper's rule on the held-out calibration windows: {out} keeps the paper's rule "
            f"(keep ratio {routed.selection.ratio:g}); pass --always-route to write the router anyway")
    print(json.dumps({"plan": str(out), "target": chosen.get("target"), "held_out_nll": nll,
                      "kept": routed.selection.policy, "ratio": routed.selection.ratio, "seconds": round(seconds, 1)}))
