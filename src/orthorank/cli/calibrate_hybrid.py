"""`orthorank calibrate --method hybrid`: one greedy search over remove / select at a ratio / keep per layer, under
a measured cost table, to one or more predicted speed-up targets (orthorank.search.hybrid)."""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import torch

from orthorank.errors import UserError, number_list
from orthorank.search.racing import ALPHA


def parse_targets(text: str) -> list[float]:
    values = number_list(text, "--target-speedup")
    bad = [v for v in values if math.isnan(v) or math.isinf(v) or not v > 1.0]
    if bad:
        raise UserError(f"--target-speedup must be above 1 (1 is the dense model), got {bad[0]:g}")
    return sorted(set(values))


def target_label(target: float) -> str:
    return f"x{target:g}"


def run_hybrid(args) -> int:
    from orthorank import distributed as dist
    from orthorank.search.calibration import calibration_set
    from orthorank.search.hybrid import check_targets, hybrid_search
    from orthorank.search.layer_search import StackRunner
    from orthorank.bench.cost_table import CostTable, device_description, parse_ratios
    from orthorank.cli.calibration_options import parse_sparsities
    from orthorank.cli.common import load_from_args, selection_from_args
    from orthorank.method.apply import restore_dense
    from orthorank.method.cost import Arch
    from orthorank.method.plan import REMOVE, Plan
    from orthorank.method.plan_store import sparsity_label
    from orthorank.models.loading import check_context
    from orthorank.results import check_writable

    if args.cost_table is None:
        raise UserError("--method hybrid needs --cost-table FILE (measure it on the target device with "
                        "`orthorank bench --cost-table FILE`)")
    if (args.target_speedup is None) == (args.sparsity is None):
        raise UserError("--method hybrid takes either --target-speedup X (predicted speed-ups) or --sparsity S "
                        "(the speed-up of removing ceil(S L) layers), not both and not neither")
    if args.ratio is not None:
        raise UserError("--ratio is OrthoRank's one ratio; a hybrid search takes --ratios")
    if args.match != ["compute"]:
        raise UserError("--match applies to OrthoRank's layer count, not to hybrid searches")
    table = CostTable.load(args.cost_table)  # a missing or garbled table fails before the model loads
    ratios = parse_ratios(args.ratios) if args.ratios is not None else table.ratios
    for r in ratios:
        table.fraction(r)
    L = table.num_layers
    candidates = list(range(1, L - 1))  # first and last layer are never touched (as in SLEB and OrthoRank)
    if args.target_speedup is not None:
        targets = parse_targets(args.target_speedup)
        levels = {t: None for t in targets}
        names = {t: f"hybrid-{target_label(t)}.json" for t in targets}
    else:
        sparsities = parse_sparsities(args.sparsity)
        levels = {}
        for s in sparsities:
            removed = min(L, math.ceil(s * L - 1e-9))
            if removed == 0:
                raise UserError(f"sparsity {s:g} removes no layer of {L}; it names no speed-up")
            levels[table.predicted_speedup({i: REMOVE for i in range(removed)})] = s
        targets = sorted(levels)
        names = {t: f"hybrid-{sparsity_label(levels[t])}.json" for t in targets}
    check_targets(targets, table, candidates)
    if args.output and len(targets) > 1:
        raise UserError("-o takes one target; use --out-dir for several")
    outputs = {t: Path(args.output) if args.output else Path(args.out_dir) / names[t] for t in targets}
    for path in outputs.values():
        check_writable(path, args.overwrite)

    dist.init(args.device)
    from orthorank.cli.calibration_options import calibration_samples, check_calibration_source

    samples = calibration_samples(args)
    check_calibration_source(args.calib_data, args.data_dir)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("calibration needs a real model with a tokenizer")
    table.check_model(lm.name, lm.signature())
    table.check_device(device_description(lm.device))
    restore_dense(lm.model)
    arch = Arch.from_config(lm.config, lm.num_layers)
    selection = selection_from_args(args)
    calib = calibration_set(lm.tokenizer, args.calib_data, samples, args.seq_len, args.seed, args.data_dir)
    check_context(lm.model, args.seq_len)
    runner = StackRunner(lm.model, calib.windows, args.batch_size)
    if not 0.0 < args.screen_fraction <= 1.0:
        raise UserError(f"--screen-fraction must be in (0, 1], got {args.screen_fraction}")
    screen = max(1, math.ceil(args.screen_fraction * len(runner.batches) - 1e-9))
    screen = None if args.exhaustive or screen >= len(runner.batches) else screen
    say = print if dist.is_main() else (lambda *a, **k: None)
    say(f"hybrid: targets {', '.join(f'{t:.4f}x' for t in targets)} on {table.source} "
        f"({table.device.get('name')}, {table.dtype}, {table.batch} x {table.seq_len}); ratios "
        f"{', '.join(f'{r:g}' for r in ratios)}; calibration {samples} x {args.seq_len} tokens from "
        f"{args.calib_data} (seed {args.seed})" + (", exhaustive" if screen is None else
                                                  f", screening on {screen} of {len(runner.batches)} batches")
        + f", {dist.world_size()} process(es)")
    table_digest = hashlib.sha256(Path(args.cost_table).read_bytes()).hexdigest()[:16]

    made: dict[float, Plan] = {}

    def write(t: float, result) -> None:
        """Make the plan of target t as the search reaches it (they are saved together at the end, so a run
        killed midway leaves no plan file; its steps are in the checkpoint and a rerun resumes from them)."""
        if not dist.is_main():
            return
        actions = result.plans[t]
        n = result.reached[t]
        plan = Plan(
            method="hybrid", layers=[], model=lm.name, signature=lm.signature(), selection=selection,
            target_sparsity=levels[t], arch=dict(arch.__dict__), actions=actions,
            provenance={
                "search": "hybrid",
                "reference": "this project: greedy remove / select / keep per layer, lowest loss increase per unit "
                             "of predicted time saved (orthorank.search.hybrid)",
                "target_speedup": round(t, 6),
                "predicted_speedup": round(table.predicted_speedup(actions), 6),
                "level": ("the predicted speed-up of removing ceil(s L) layers" if levels[t] is not None
                          else "a predicted speed-up"),
                "cost_table": {"path": str(args.cost_table), "sha256": table_digest, "device": table.device,
                               "dtype": table.dtype, "batch": table.batch, "seq_len": table.seq_len,
                               "dense_layer_s": table.dense_layer_s, "rest_s": table.rest_s,
                               "selective_fraction": table.selective},
                "ratios": ratios,
                "cost_seq_len": args.cost_seq_len,
                "steps": [s.to_dict() for s in result.steps[:n]],
                "dense_loss": round(result.dense_loss, 6),
                "loss": round(result.steps[n - 1].loss, 6),
                "calibration": calib.provenance,
                "search_mode": "exhaustive" if screen is None else {"race": {"first_batches": screen,
                                                                             "keep": args.recheck, "alpha": ALPHA}},
                "search_seconds": round(result.seconds, 2),  # up to this target
                "search_device": f"{lm.device} x {dist.world_size()}, dtype "
                                 f"{str(lm.model.dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads",
                "evaluations": result.evaluations,
            },
        )
        made[t] = plan
        sel = {i: c.ratio for i, c in plan.selection_layers.items()}
        print(f"  target {t:.4f}x: predicted {plan.provenance['predicted_speedup']:.4f}x after {n} steps; removed "
              f"{plan.removed_layers}, selection {sel}; calibration loss {plan.provenance['loss']:.4f}",
              flush=True)

    from orthorank.search.checkpoint import Checkpoint
    from orthorank.cli.common import store_from_args

    settings = {"cost_table": table_digest, "targets": targets, "ratios": ratios, "candidates": candidates,
                "selection": selection.to_dict(), "screen_batches": screen,
                "recheck": None if screen is None else args.recheck, "race_alpha": None if screen is None else ALPHA}
    checkpoint = Checkpoint.open(store_from_args(args), runner, "hybrid", settings, code="hybrid-search")
    try:
        result = hybrid_search(runner, table, targets, ratios, candidates, selection, progress=True,
                               screen_batches=screen, recheck=args.recheck, log=say, on_reached=write,
                               checkpoint=checkpoint)
    except KeyboardInterrupt:
        where = f"in {checkpoint.folder}" if checkpoint.folder is not None else "nowhere (--no-store)"
        print(f"orthorank calibrate: interrupted; {checkpoint.resumed + checkpoint.written} finished step entries "
              f"kept {where}; run the same command again to resume from there", file=sys.stderr)
        return 130
    say(f"hybrid: search took {result.seconds:.1f}s, {len(result.steps)} steps ({result.evaluations} move "
        f"evaluations; dense calibration loss {result.dense_loss:.4f})"
        + (f"; resumed {checkpoint.resumed} stored step(s)" if checkpoint.resumed else ""))
    for t, plan in made.items():
        plan.save(outputs[t], overwrite=args.overwrite)
        print(f"  wrote {outputs[t]}")
    return 0
