"""`orthorank calibrate`: choose the layers for a method at a sparsity on calibration text and write plans."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import torch

from orthorank.harness import distributed as dist
from orthorank.harness.api.calibrate_hybrid import run_hybrid
from orthorank.harness.api.calibration_options import (
    calibration_samples,
    check_calibration_source,
    parse_sparsities,
    router_base,
    screen_batches,
)
from orthorank.harness.api.common import check_memory, load_model_from_options, selection_from_options, store_from_options
from orthorank.harness.api.options import CalibrateOptions
from orthorank.errors import UserError
from orthorank.method.apply import restore_dense
from orthorank.method.cost import Arch, removal_sparsity, selection_sparsity, ratio_to_match
from orthorank.method.plan import Plan, layers_for_sparsity
from orthorank.method.plan_store import plan_file_method, sparsity_label
from orthorank.method.registry import METHODS
from orthorank.method.selection import SelectionConfig
from orthorank.models.loading import LoadedModel, check_context
from orthorank.harness.results import check_writable
from orthorank.harness.runtime.costmodel import spread_layers
from orthorank.harness.runtime.matching import match_speed, measured_speedups, with_ratio
from orthorank.harness.search.calibration import CalibrationSet, calibration_set
from orthorank.harness.search.checkpoint import Checkpoint
from orthorank.harness.search.layer_search import SearchResult, StackRunner
from orthorank.harness.search.racing import ALPHA
from orthorank.harness.search.registry import SearchMethod, get_search


def run(opts: CalibrateOptions) -> int:
    if get_search(METHODS[opts.method].search).per_layer:
        return run_hybrid(opts)
    opts, search = _searched_options(opts)
    sparsities = parse_sparsities(opts.sparsity, search=True)
    if opts.json_out and len(sparsities) > 1:
        raise UserError("--json takes one sparsity; use --out DIR for several")
    selection = selection_from_options(opts, router_base(opts))
    jobs, outputs = _jobs(opts, search, selection, sparsities)
    samples = calibration_samples(opts)
    check_calibration_source(opts.calib_data, opts.data_dir)
    dist.init(opts.device)
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError("calibration needs a real model with a tokenizer")
    restore_dense(lm.model)
    L = lm.num_layers
    arch = Arch.from_config(lm.config, L)
    counts = [search.layer_count(s, L, selection.ratio, "nominal" if rule == "nominal" else "compute", arch,
                                 opts.cost_seq_len, selection.rule.scoring_flops(arch.hidden)) for rule, s in jobs]
    calib = calibration_set(lm.tokenizer, opts.calib_data, samples, opts.seq_len, opts.seed, opts.data_dir)
    check_context(lm.model, opts.seq_len)
    check_memory(lm, opts.batch_size, opts.seq_len, "calibrate", loss=True)
    runner = StackRunner(lm.model, calib.windows, opts.batch_size)
    screen = screen_batches(opts, len(runner.batches))
    say = print if dist.is_main() else (lambda *a, **k: None)
    greedy = search.greedy
    say(f"{opts.method}: " + (f"{max(counts)} greedy steps" if greedy else "one-shot scores") + f" over {L} layers, "
        f"calibration {samples} x {opts.seq_len} tokens from {opts.calib_data} (seed {opts.seed})"
        + ("" if not greedy else ", exhaustive" if screen is None else f", screening on {screen} of "
           f"{len(runner.batches)} batches and re-checking the contenders") + f", {dist.world_size()} process(es)")
    checkpoint = Checkpoint.open(store_from_options(opts), runner, opts.method,
                                 search.settings(selection, screen, opts.recheck))
    try:
        result = search.run(runner, max(counts), selection, True, screen_batches=screen, recheck=opts.recheck,
                            log=say, checkpoint=checkpoint)
    except KeyboardInterrupt:
        kept = checkpoint.resumed + checkpoint.written
        where = f"in {checkpoint.folder}" if checkpoint.folder is not None else "nowhere (--no-store)"
        print(f"orthorank calibrate: interrupted; {kept} finished {'step' if greedy else 'score'} entries kept "
              f"{where}; run the same command again to resume from there", file=sys.stderr)
        return 130
    say(f"{opts.method}: search took {result.seconds:.1f}s ({result.evaluations} candidate evaluations; dense "
        f"calibration loss {result.dense_loss:.4f})" + (f"; resumed {checkpoint.resumed} stored step(s)"
                                                       if checkpoint.resumed else ""))
    if not dist.is_main():
        return 0
    plans = [_plan(opts, search, lm, arch, selection, result, calib, screen, checkpoint, rule, s, n)
             for (rule, s), n in zip(jobs, counts)]
    if opts.measure_speed:
        _time_plans(lm, plans, jobs, counts, opts, selection.ratio, say)
    _save_plans(opts, plans, jobs, counts, outputs)
    return 0


def _searched_options(opts: CalibrateOptions) -> tuple[CalibrateOptions, SearchMethod]:
    """The options of a layer-count method (sleb, orthorank, ...) checked, with --method set to the search it runs
    (and --match to the rule an orthorank-nominal / -speed method names)."""
    if opts.sparsity is None:
        raise UserError(f"--method {opts.method} needs --sparsity")
    if opts.target_speedup is not None or opts.cost_table is not None or opts.ratios is not None:
        raise UserError("--target-speedup, --cost-table and --ratios belong to --method hybrid")
    method = METHODS[opts.method]
    if method.match != "compute":  # orthorank-nominal / -speed: the search of orthorank under that rule
        opts = dataclasses.replace(opts, match=[method.match])
    opts = dataclasses.replace(opts, method=method.search)
    return opts, get_search(method.search)


def _jobs(opts: CalibrateOptions, search: SearchMethod, selection: SelectionConfig,
          sparsities: list[float]) -> tuple[list[tuple[str, float]], list[Path]]:
    """One plan per --match rule and sparsity, and the file each is written to (checked writable before the model
    loads)."""
    if search.kind.one_selection and selection.ratio >= 1.0:
        raise UserError("ratio 1.0 skips no work; choose a ratio below 1")
    rules = opts.match if search.kind.one_selection else ["compute"]
    if "speed" in rules and opts.measure_speed < 3:
        raise UserError("--match speed times the plans: give --measure-speed N with N >= 3")
    if opts.measure_speed < 0:
        raise UserError(f"--measure-speed must be 0 or more, got {opts.measure_speed}")
    jobs = [(rule, s) for rule in rules for s in sparsities]
    if opts.json_out and len(jobs) > 1:
        raise UserError("--json takes one sparsity and one --match rule; use --out DIR for several")
    outputs = [Path(opts.json_out)] if opts.json_out else [
        Path(opts.out) / f"{plan_file_method(opts.method, rule)}-{sparsity_label(s)}.json" for rule, s in jobs]
    for path in outputs:
        check_writable(path, opts.overwrite)
    return jobs, outputs


def _compute_match(opts: CalibrateOptions, arch: Arch, selection: SelectionConfig, s: float,
                   n: int) -> tuple[SelectionConfig, dict]:
    """--match compute: the one keep ratio, raised from the given one, at which n selection layers skip the compute
    share that pruning's ceil(s L) removed layers skip; with the record of the match."""
    target = removal_sparsity(arch, opts.cost_seq_len, layers_for_sparsity(s, arch.num_layers, "prune"))
    scoring = selection.rule.scoring_flops(arch.hidden)  # a router's FLOPs count
    ratio = ratio_to_match(arch, opts.cost_seq_len, target, n, selection.ratio, scoring=scoring)
    got = selection_sparsity(arch, opts.cost_seq_len, n, ratio, scoring=scoring)
    matched = {"rule": "equal compute", "knob": "one keep ratio for every selection layer, raised from "
               f"{selection.ratio:g} until the plan skips pruning's compute share",
               "base_ratio": selection.ratio, "ratio": ratio, "target_compute": round(target, 6),
               "compute": round(got, 6), "relative_error": round(abs(got - target) / target, 6)}
    return dataclasses.replace(selection, ratio=ratio), matched


def _plan(opts: CalibrateOptions, search: SearchMethod, lm: LoadedModel, arch: Arch, selection: SelectionConfig,
          result: SearchResult, calib: CalibrationSet, screen: int | None, checkpoint: Checkpoint, rule: str,
          s: float, n: int) -> Plan:
    """The plan of one job: the first n layers of the search's order, with how they were found."""
    sel, matched = selection, None
    if search.kind.one_selection and rule == "compute":
        sel, matched = _compute_match(opts, arch, selection, s, n)
    return Plan(
        method=search.plan_method,
        layers=result.order[:n],
        model=lm.name,
        signature=lm.signature(),
        selection=sel if search.kind.one_selection else None,
        target_sparsity=s,
        arch=dict(arch.__dict__),
        provenance={
            "search": opts.method,
            "reference": search.reference,
            "match": rule if search.kind.one_selection else "removed ceil(s L)",
            **({"matched": matched} if matched else {}),
            "cost_seq_len": opts.cost_seq_len,
            "order": result.order[:n],
            "losses": [round(x, 6) for x in result.losses[:n]],
            "dense_loss": round(result.dense_loss, 6),
            "calibration": calib.provenance,
            "search_mode": "exhaustive" if screen is None else {"race": {"first_batches": screen,
                                                                         "keep": opts.recheck, "alpha": ALPHA}},
            "search_seconds": round(result.seconds, 2),
            "search_resumed_steps": checkpoint.resumed,
            "search_device": f"{lm.device} x {dist.world_size()}, dtype {str(lm.model.dtype).removeprefix('torch.')}, "
                             f"{torch.get_num_threads()} threads",
            "evaluations": result.evaluations,
        },
    )


def _save_plans(opts: CalibrateOptions, plans: list[Plan], jobs: list[tuple[str, float]], counts: list[int],
                outputs: list[Path]) -> None:
    for plan, (rule, s), n, path in zip(plans, jobs, counts, outputs):
        plan.save(path, overwrite=opts.overwrite)
        m = plan.sparsity(seq_len=opts.cost_seq_len)
        measured = plan.provenance.get("measured", {}).get("speedup")
        print(f"  sparsity {s:g} ({rule}): {n} layers {sorted(plan.layers)}"
              + (f" at ratio {plan.selection.ratio:.4f}" if plan.kind.one_selection else "")
              + f" -> nominal {m['nominal']:.4f}, compute {m['compute']:.4f} at {opts.cost_seq_len} tokens"
              + (f", measured prefill speed-up {measured:.3f}x" if measured else "") + f"; wrote {path}")


def _time_plans(lm, plans: list[Plan], jobs, counts, opts, base_ratio: float, say) -> None:
    """Measured prefill speed-up of every plan (and, for --match speed, the keep ratio that equals pruning's)."""
    T = min(opts.cost_seq_len, int(getattr(lm.config, "max_position_embeddings", None) or opts.cost_seq_len))
    gen = torch.Generator().manual_seed(opts.seed)
    window = torch.randint(0, int(lm.config.vocab_size), (T,), generator=gen)
    about = {"seq_len": T, "dtype": str(lm.model.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
             "device": str(lm.device), "repeats": opts.measure_speed}
    for plan, (rule, s), n in zip(plans, jobs, counts):
        if rule != "speed":
            continue
        removed = math.ceil(s * lm.num_layers - 1e-9)
        reference = Plan("prune", spread_layers(removed, lm.num_layers), lm.name, lm.signature())
        say(f"  matching the measured speed-up of removing {removed} layers at {s:g} ({T} tokens, "
            f"{opts.measure_speed} repeats per probe)")
        found = match_speed(lm.model, lambda r, plan=plan: with_ratio(plan, r), reference, window,
                            base_ratio, opts.measure_speed, log=say)
        plan.selection = dataclasses.replace(plan.selection, ratio=found["ratio"])
        if not found["within_noise"]:
            say(f"  warning: at {s:g} the closest keep ratio found, {found['ratio']:.4f}, gives "
                f"{found['speedup']['speedup']:.3f}x against pruning's {found['reference']['speedup']:.3f}x, more "
                f"apart than the timing noise ({found['noise']:.3f}); the plan records it as not matched")
        plan.provenance["matched"] = {
            "rule": "equal measured prefill speed-up", "knob": "one keep ratio for every selection layer",
            "base_ratio": base_ratio,
            "ratio": found["ratio"], "reference": f"removal of {removed} evenly spread layers",
            "reference_speedup": found["reference"]["speedup"], "speedup": found["speedup"]["speedup"],
            "difference": round(found["difference"], 4), "noise_iqr": found["noise"],
            "within_noise": found["within_noise"], "probes": found["probes"], **about}
    for plan, m in zip(plans, measured_speedups(lm.model, plans, window, opts.measure_speed)):
        plan.provenance["measured"] = {**m, **about}
