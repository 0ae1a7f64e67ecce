"""`orthorank calibrate --method hybrid`: one greedy search over remove / select at a ratio / keep per layer, under
a measured cost table, to one or more predicted speed-up targets (orthorank.harness.search.hybrid)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path

import torch

from orthorank.harness import distributed as dist
from orthorank.harness.api.calibration_options import (
    calibration_samples,
    check_calibration_source,
    parse_sparsities,
    router_base,
    screen_batches,
)
from orthorank.harness.api.common import check_memory, load_model_from_options, selection_from_options, store_from_options
from orthorank.harness.api.options import CalibrateOptions
from orthorank.errors import UserError, number_list
from orthorank.method.apply import restore_dense
from orthorank.method.cost import Arch
from orthorank.method.plan import REMOVE, Plan
from orthorank.method.plan_store import sparsity_label
from orthorank.method.registry import METHODS
from orthorank.method.selection import SelectionConfig
from orthorank.models.loading import LoadedModel, check_context
from orthorank.harness.results import check_writable
from orthorank.harness.runtime.cost_table import CostTable, FlopCostTable, device_description, parse_ratios
from orthorank.harness.search.calibration import CalibrationSet, calibration_set
from orthorank.harness.search.checkpoint import Checkpoint
from orthorank.harness.search.hybrid import HybridResult, check_targets, match_exactly
from orthorank.harness.search.layer_search import StackRunner
from orthorank.harness.search.racing import ALPHA
from orthorank.harness.search.registry import get_search


def parse_targets(text: str) -> list[float]:
    values = number_list(text, "--target-speedup")
    bad = [v for v in values if math.isnan(v) or math.isinf(v) or not v > 1.0]
    if bad:
        raise UserError(f"--target-speedup must be above 1 (1 is the dense model), got {bad[0]:g}")
    return sorted(set(values))


def target_label(target: float) -> str:
    return f"x{target:g}"


def _table_targets(opts: CalibrateOptions, table, parse_ratios, parse_sparsities, check_targets, sparsity_label, REMOVE):
    """Ratios, levels, file names, targets and output paths of a hybrid search on a measured cost table."""
    ratios = parse_ratios(opts.ratios) if opts.ratios is not None else table.ratios
    for r in ratios:
        table.fraction(r)
    L = table.num_layers
    candidates = list(range(1, L - 1))
    if opts.target_speedup is not None:
        targets = parse_targets(opts.target_speedup)
        levels = {t: [None] for t in targets}
        names = {t: [f"hybrid-{target_label(t)}.json"] for t in targets}
    else:
        levels = {}
        for s in parse_sparsities(opts.sparsity, search=True):
            removed = min(L, math.ceil(s * L - 1e-9))
            if removed == 0:
                raise UserError(f"sparsity {s:g} removes no layer of {L}; it names no speed-up")
            levels.setdefault(table.predicted_speedup({i: REMOVE for i in range(removed)}), []).append(s)
        targets = sorted(levels)
        names = {t: [f"hybrid-{sparsity_label(s)}.json" for s in levels[t]] for t in targets}
    check_targets(targets, table, candidates)
    if opts.json_out and sum(len(v) for v in levels.values()) > 1:
        raise UserError("--json takes one level; use --out DIR for several")
    outputs = {t: [Path(opts.json_out)] if opts.json_out else [Path(opts.out) / n for n in names[t]]
               for t in targets}
    for paths in outputs.values():
        for path in paths:
            check_writable(path, opts.overwrite)
    return ratios, levels, names, targets, outputs


DEFAULT_LAYER_RATIOS = (0.25, 0.33, 0.5)


def run_hybrid(opts: CalibrateOptions) -> int:
    """`--method hybrid` (a measured cost table, removals allowed) and `--method orthorank-ratios` (the FLOP cost
    model, no removals, the last move's ratio set so that the compute equals pruning's exactly)."""
    ratios_mode = not get_search(METHODS[opts.method].search).removals  # orthorank-ratios: keep ratios only
    _check_hybrid_options(opts, ratios_mode)
    if ratios_mode:
        table = None
        ratios = parse_ratios(opts.ratios) if opts.ratios is not None else list(DEFAULT_LAYER_RATIOS)
        sparsities, names = _ratios_outputs(opts)
    else:
        table = CostTable.load(opts.cost_table)  # a missing or garbled table fails before the model loads
        ratios, levels, names, targets, outputs = _table_targets(opts, table, parse_ratios, parse_sparsities,
                                                                 check_targets, sparsity_label, REMOVE)

    base_router = router_base(opts)  # a missing or broken --router bank fails before the model loads
    dist.init(opts.device)
    samples = calibration_samples(opts)
    check_calibration_source(opts.calib_data, opts.data_dir)
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError("calibration needs a real model with a tokenizer")
    restore_dense(lm.model)
    arch = Arch.from_config(lm.config, lm.num_layers)
    if ratios_mode:  # targets: pruning's compute at each level, on the FLOP count at --cost-seq-len
        table = FlopCostTable.build(arch, opts.cost_seq_len, ratios, lm.name, lm.signature())
        levels, targets, outputs = _compute_targets(opts, table, ratios, sparsities, names)
    else:
        table.check_model(lm.name, lm.signature())
        table.check_device(device_description(lm.device))
    candidates = list(range(1, table.num_layers - 1))  # first and last layer are never touched (as in SLEB)
    selection = selection_from_options(opts, base_router)
    calib = calibration_set(lm.tokenizer, opts.calib_data, samples, opts.seq_len, opts.seed, opts.data_dir)
    check_context(lm.model, opts.seq_len)
    check_memory(lm, opts.batch_size, opts.seq_len, opts.method, loss=True)
    runner = StackRunner(lm.model, calib.windows, opts.batch_size)
    screen = screen_batches(opts, len(runner.batches))
    say = print if dist.is_main() else (lambda *a, **k: None)
    say(_announcement(opts, table, targets, ratios, samples, screen, len(runner.batches), ratios_mode))
    table_digest = (hashlib.sha256(json.dumps(table.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
                    if ratios_mode else hashlib.sha256(Path(opts.cost_table).read_bytes()).hexdigest()[:16])
    settings = {"cost_table": table_digest, "targets": targets, "ratios": ratios, "candidates": candidates,
                "selection": selection.key_dict(), "screen_batches": screen,
                "recheck": None if screen is None else opts.recheck, "race_alpha": None if screen is None else ALPHA}
    if ratios_mode:
        settings["remove"] = False
    checkpoint = Checkpoint.open(store_from_options(opts), runner, opts.method, settings, code="hybrid-search")
    writer = _PlanWriter(opts, lm, arch, table, table_digest, selection, ratios, levels, calib, screen, ratios_mode,
                         checkpoint)
    try:
        result = get_search(opts.method).run(runner, table, targets, ratios, candidates, selection, progress=True,
                                             screen_batches=screen, recheck=opts.recheck, log=say,
                                             on_reached=writer, checkpoint=checkpoint)
    except KeyboardInterrupt:
        where = f"in {checkpoint.folder}" if checkpoint.folder is not None else "nowhere (--no-store)"
        print(f"orthorank calibrate: interrupted; {checkpoint.resumed + checkpoint.written} finished step entries "
              f"kept {where}; run the same command again to resume from there", file=sys.stderr)
        return 130
    say(f"{opts.method}: search took {result.seconds:.1f}s, {len(result.steps)} steps ({result.evaluations} move "
        f"evaluations; dense calibration loss {result.dense_loss:.4f})"
        + (f"; resumed {checkpoint.resumed} stored step(s)" if checkpoint.resumed else ""))
    for t, plan in writer.made.items():
        for path, level in zip(outputs[t], levels[t]):  # levels that name the same target share its plan
            dataclasses.replace(plan, target_sparsity=level).save(path, overwrite=opts.overwrite)
            print(f"  wrote {path}")
    return 0


def _check_hybrid_options(opts: CalibrateOptions, ratios_mode: bool) -> None:
    """The options a per-layer search takes, checked before anything loads."""
    if ratios_mode:
        if opts.cost_table is not None or opts.target_speedup is not None:
            raise UserError("--method orthorank-ratios matches pruning's compute (the FLOP count); it takes "
                            "--sparsity, not --cost-table or --target-speedup")
        if opts.sparsity is None:
            raise UserError("--method orthorank-ratios needs --sparsity")
    elif opts.cost_table is None:
        raise UserError("--method hybrid needs --cost-table FILE (measure it on the target device with "
                        "`orthorank bench --cost-table FILE`)")
    if (opts.target_speedup is None) == (opts.sparsity is None):
        raise UserError("--method hybrid takes either --target-speedup X (predicted speed-ups) or --sparsity S "
                        "(the speed-up of removing ceil(S L) layers), not both and not neither")
    if opts.ratio is not None:
        raise UserError(f"--ratio is OrthoRank's one ratio; a {opts.method} search takes --ratios")
    if opts.match != ["compute"]:
        raise UserError(f"--match applies to OrthoRank's layer count, not to {opts.method} searches")


def _ratios_outputs(opts: CalibrateOptions) -> tuple[list[float], dict[float, str]]:
    """orthorank-ratios' sparsities and their plan file names, the outputs checked writable before the model loads
    (the targets need the model's shape: `_compute_targets`)."""
    sparsities = parse_sparsities(opts.sparsity, search=True)
    names = {s: f"orthorank-ratios-{sparsity_label(s)}.json" for s in sparsities}
    if opts.json_out and len(sparsities) > 1:
        raise UserError("--json takes one sparsity; use --out DIR for several")
    for s in sparsities:
        check_writable(Path(opts.json_out) if opts.json_out else Path(opts.out) / names[s], opts.overwrite)
    return sparsities, names


def _compute_targets(opts: CalibrateOptions, table: FlopCostTable, ratios: list[float], sparsities: list[float],
                     names: dict[float, str]
                     ) -> tuple[dict[float, list[float]], list[float], dict[float, list[Path]]]:
    """orthorank-ratios' targets: pruning's compute at each sparsity on the FLOP table (levels that remove the same
    number of layers share a target), with the sparsities and output paths of each."""
    L = table.num_layers
    levels: dict[float, list[float]] = {}
    for s in sparsities:
        removed = min(L, math.ceil(s * L - 1e-9))
        if removed == 0:
            raise UserError(f"sparsity {s:g} removes no layer of {L}; it names no compute target")
        levels.setdefault(table.predicted_speedup({i: REMOVE for i in range(removed)}), []).append(s)
    targets = sorted(levels)
    outputs = {t: [Path(opts.json_out)] if opts.json_out else [Path(opts.out) / names[s] for s in levels[t]]
               for t in targets}
    check_targets(targets, table, list(range(1, L - 1)), ratios, remove=False)
    return levels, targets, outputs


def _announcement(opts: CalibrateOptions, table: CostTable, targets: list[float], ratios: list[float], samples: int,
                  screen: int | None, batches: int, ratios_mode: bool) -> str:
    """The line a search starts with: its targets, table, ratios, calibration and racing."""
    return (f"{opts.method}: targets {', '.join(f'{t:.4f}x' for t in targets)} on {table.source} "
            + ("" if ratios_mode else f"({table.device.get('name')}, {table.dtype}, {table.batch} x {table.seq_len})")
            + "; ratios "
            f"{', '.join(f'{r:g}' for r in ratios)}; calibration {samples} x {opts.seq_len} tokens from "
            f"{opts.calib_data} (seed {opts.seed})" + (", exhaustive" if screen is None else
                                                      f", screening on {screen} of {batches} batches")
            + f", {dist.world_size()} process(es)")


@dataclasses.dataclass
class _PlanWriter:
    """Makes the plan of each target as the search reaches it (`on_reached`). They are saved together at the end,
    so a run killed midway leaves no plan file; its steps are in the checkpoint and a rerun resumes from them."""

    opts: CalibrateOptions
    lm: LoadedModel
    arch: Arch
    table: CostTable  # a FlopCostTable in ratios mode
    table_digest: str
    selection: SelectionConfig
    ratios: list[float]
    levels: dict[float, list[float | None]]
    calib: CalibrationSet
    screen: int | None
    ratios_mode: bool
    checkpoint: Checkpoint
    made: dict[float, Plan] = dataclasses.field(default_factory=dict)

    def __call__(self, t: float, result: HybridResult) -> None:
        if not dist.is_main():
            return
        n = result.reached[t]
        actions, basis = self._exact_match(t, result, n) if self.ratios_mode else self._on_table(t, result)
        lm, opts, screen = self.lm, self.opts, self.screen
        plan = Plan(
            method="hybrid", layers=[], model=lm.name, signature=lm.signature(), selection=self.selection,
            target_sparsity=self.levels[t][0], arch=dict(self.arch.__dict__), actions=actions,
            provenance={
                **basis,
                "ratios": self.ratios,
                "cost_seq_len": opts.cost_seq_len,
                "steps": [s.to_dict() for s in result.steps[:n]],
                "dense_loss": round(result.dense_loss, 6),
                "loss": round(result.steps[n - 1].loss, 6),
                "calibration": self.calib.provenance,
                "search_mode": "exhaustive" if screen is None else {"race": {"first_batches": screen,
                                                                             "keep": opts.recheck, "alpha": ALPHA}},
                # up to this target, over every run of a resumed search (None: steps stored before per-step timing)
                "search_seconds": _rounded(self.checkpoint.seconds_at(n)),
                "search_resumed_steps": self.checkpoint.resumed,
                "search_device": f"{lm.device} x {dist.world_size()}, dtype "
                                 f"{str(lm.model.dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads",
                "evaluations": result.evaluations,
            },
        )
        self.made[t] = plan
        sel = {i: round(c.ratio, 4) for i, c in plan.selection_layers.items()}
        p = plan.provenance
        reach = (f"compute {p['compute_sparsity']:.4f} (target {p['target_compute_sparsity']:.4f})"
                 if self.ratios_mode else f"predicted {p['predicted_speedup']:.4f}x")
        print(f"  target {t:.4f}x: {reach} after {n} steps; removed {plan.removed_layers}, selection {sel}; "
              f"calibration loss {p['loss']:.4f}" + (" (before the exact match)" if self.ratios_mode else ""),
              flush=True)

    def _exact_match(self, t: float, result: HybridResult, n: int) -> tuple[dict[int, str | float], dict]:
        """orthorank-ratios: the last move overshot the compute target, so its layer keeps a few more tokens."""
        table = self.table
        searched = result.plans[t]
        layer = result.steps[n - 1].layer
        actions = match_exactly(searched, layer, t, table)
        basis = {"search": "orthorank-ratios",
                 "reference": "this project: OrthoRank with a keep ratio per layer, greedy over (layer, ratio), "
                              "lowest loss increase per unit of compute saved (orthorank.harness.search.hybrid without "
                              "removals), the last move's ratio then set to match pruning's compute exactly",
                 "target_compute_sparsity": round(1 - 1 / t, 6),
                 "compute_sparsity": round(table.compute_sparsity(actions), 6),
                 "exact_match": {"layer": layer, "searched_ratio": searched[layer], "ratio": actions[layer],
                                 "seq_len": table.seq_len},
                 "level": "the compute sparsity of removing ceil(s L) layers"}
        return actions, basis

    def _on_table(self, t: float, result: HybridResult) -> tuple[dict[int, str | float], dict]:
        """hybrid: the searched actions as they are, with the measured cost table they were chosen on."""
        table = self.table
        actions = result.plans[t]
        basis = {"search": "hybrid",
                 "reference": "this project: greedy remove / select / keep per layer, lowest loss increase per "
                              "unit of predicted time saved (orthorank.harness.search.hybrid)",
                 "target_speedup": round(t, 6),
                 "predicted_speedup": round(table.predicted_speedup(actions), 6),
                 "level": ("the predicted speed-up of removing ceil(s L) layers" if self.levels[t][0] is not None
                           else "a predicted speed-up"),
                 "cost_table": {"path": str(self.opts.cost_table), "sha256": self.table_digest,
                                "device": table.device, "dtype": table.dtype, "batch": table.batch,
                                "seq_len": table.seq_len, "dense_layer_s": table.dense_layer_s,
                                "rest_s": table.rest_s, "selective_fraction": table.selective}}
        return actions, basis


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 2)
