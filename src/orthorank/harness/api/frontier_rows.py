"""The frontier's rows: which methods and levels a frontier runs, each level's plan (a saved search's prefix, a
schedule built for the compute, or the preset's), and the tails its selecting rows may take (harness/api/frontier.py runs
them)."""

from __future__ import annotations

import dataclasses
import math

from orthorank.harness.api.common import expected_model_name, saved_plan_file
from orthorank.harness.api.options import FrontierOptions
from orthorank.errors import UserError, comma_items
from orthorank.harness.evaluation.compare import policy_plans
from orthorank.harness.evaluation.longctx import Row
from orthorank.method.cost import Arch, removal_sparsity
from orthorank.method.plan import Plan
from orthorank.method.policies import parse_variants
from orthorank.method.presets import Preset, load_preset, preset_plan
from orthorank.method.registry import get_method, is_reference, saved, scheduled
from orthorank.method.schedules import schedule_plan

# Methods whose rows also take --policies variants: those selecting by the paper's rule. A router row with its policy
# replaced would be the OrthoRank row of the same layers again, not a router.
VARIANT_BASES = ("orthorank", "depth")
SAVED_LEVELS = (0.2, 0.1)  # the saved plan whose order is read: the highest level there is


def methods_of(opts: FrontierOptions) -> list[str]:
    methods = comma_items(opts.methods)
    if not methods:
        raise UserError("--methods names no method")
    for m in methods:
        method = get_method(m, ["dense", *saved(), *scheduled()])
        if not (method.kind.dense or method.layers == "schedule" or method.kind.prefixes):
            raise UserError(f"the frontier takes levels of {m} from its search order; a {method.plan_kind} plan has "
                            "none: name dense, a pruning method, orthorank, router or a schedule "
                            f"({', '.join(scheduled())})")
    return methods


def parse_levels(text: str) -> list[float]:
    try:
        levels = sorted({float(x) for x in comma_items(text)})
    except ValueError:
        raise UserError(f"--levels must be comma-separated numbers in (0, 1), got {text!r}") from None
    if not levels or any(not 0.0 < s < 1.0 for s in levels):
        raise UserError(f"--levels must be comma-separated numbers in (0, 1), got {text!r}")
    return levels


def saved_order(opts: FrontierOptions, model_name: str, method: str, check: bool = True) -> Plan:
    """The saved plan of the highest level there is, whose provenance holds its search order."""
    for level in SAVED_LEVELS:
        try:
            plan = Plan.load(saved_plan_file(model_name, get_method(method).plan_label, level, opts.plans_dir,
                                             check=False))
        except UserError:
            continue
        if not plan.provenance.get("order"):
            raise UserError(f"the saved {method} plan at {level:g} records no search order, so lower levels cannot "
                            "be read from it")
        return plan
    raise UserError(f"no saved {method} plan at {' or '.join(f'{s:g}' for s in SAVED_LEVELS)} for {model_name}; "
                    f"run `orthorank calibrate --method {method}` first")


def level_rows(opts: FrontierOptions, lm, length: int, levels: list[float], log) -> list[Row]:
    """Dense, then every method at every level (and every policy variant of the selecting ones)."""
    arch = Arch.from_config(lm.config, lm.num_layers)
    L = arch.num_layers
    variants = parse_variants(opts.policies) if opts.policies else []
    rows = [Row("dense", "dense", None, Plan("dense", [], lm.name, lm.signature()))]
    saved = {m: saved_order(opts, lm.name, m) for m in methods_of(opts) if get_method(m).layers == "plan"}
    for plan in saved.values():
        plan.check_model(lm.name, lm.signature())
    for method in methods_of(opts):
        if is_reference(method):
            continue
        for s in levels:
            removed = min(L - 1, math.ceil(s * L - 1e-9))
            target = removal_sparsity(arch, length, removed)
            if get_method(method).layers == "schedule":
                try:
                    plan = schedule_plan(method, lm.name, lm.signature(), arch, target, length,
                                         start=opts.schedule_start, layer_types=getattr(lm.config, "layer_types", None),
                                         at_most_reach=True)
                except UserError as exc:  # this level is out of the schedule's reach: the others still run
                    log(f"frontier: {method} at {s:g} left out: {exc}")
                    continue
                if plan.provenance.get("at_most_reach"):  # the first level past local attention's reach: all of it
                    if any(r.method == method and r.plan.layers == plan.layers for r in rows):
                        log(f"frontier: {method} at {s:g} left out: past its reach, whose plan is already a row")
                        continue
                    log(f"frontier: {method} at {s:g} is past its reach: every full-attention layer it may use "
                        f"({len(plan.layers)}), skipping {plan.compute_sparsity(arch, length):.3f} of the compute")
                elif plan.attention is not None and plan.layers == schedule_plan(
                        method, lm.name, lm.signature(), arch, 1.0, length, start=opts.schedule_start,
                        layer_types=getattr(lm.config, "layer_types", None), at_most_reach=True).layers:
                    # reached exactly with every layer it may use: a preset's level is not bounded by this point
                    plan = dataclasses.replace(plan, provenance={**plan.provenance, "at_most_reach": True})
                label = f"{method} {s:g}"
            else:
                saved_plan = saved[method]
                try:
                    plan, skipped = saved_plan.kind.level_prefix(saved_plan, arch, length, removed, target)
                except UserError as exc:
                    log(f"frontier: {method} at {s:g} left out: {exc}")
                    continue
                if skipped < 0.9 * target:
                    log(f"frontier: {method} at {s:g}: its saved search's {len(saved_plan.provenance['order'])} "
                        f"layers skip {skipped:.3f} of the compute, short of {target:.3f}: left out")
                    continue
                label = f"{method} {s:g}"
            rows.append(Row(label, method, s, plan))
            if variants and plan.selection is not None and method in VARIANT_BASES:
                for spec, variant in policy_plans(plan, variants):
                    rows.append(Row(f"{label} {spec}", f"{method}{spec}", s, variant, variant=spec))
    if opts.preset:
        row = preset_row(opts, lm, arch, length, log)
        if row is not None:
            rows.append(row)
    return rows


def preset_row(opts: FrontierOptions, lm, arch: Arch, length: int, log) -> Row | None:
    """The preset's plan at this length, as `generate --preset` builds it (None where the preset is dense: its row
    would be dense's again)."""
    preset = load_preset(opts.preset)
    if is_reference(preset.method):
        log(f"frontier: the {preset.name} preset is dense here (no setting was free on every model and length it "
            "was chosen from): no extra row")
        return None
    saved_plan = saved_order(opts, lm.name, preset.method) if get_method(preset.method).layers == "plan" else None
    plan = preset_plan(preset, lm.name, lm.signature(), arch, length, saved_plan,
                       layer_types=getattr(lm.config, "layer_types", None))
    return Row(f"preset {preset.name}", f"preset:{preset.name}", preset.level, plan)


def checked_preset(opts: FrontierOptions) -> Preset | None:
    if not opts.preset:
        return None
    preset = load_preset(opts.preset)
    if get_method(preset.method).layers == "plan":
        saved_order(opts, expected_model_name(opts.model), preset.method)
    return preset


def parse_tails(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        tails = sorted({int(x) for x in comma_items(text)})
    except ValueError:
        raise UserError(f"--tails must be comma-separated whole numbers of tokens, got {text!r}") from None
    if any(w < 0 for w in tails) or len(tails) < 2:
        raise UserError(f"--tails needs at least two candidates >= 0 (e.g. 0,16,64,256), got {text!r}")
    return tails
