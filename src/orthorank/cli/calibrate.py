"""`orthorank calibrate`: choose the layers for a method at a sparsity on calibration text and write plans."""

from __future__ import annotations

from orthorank.models.loading import check_context

import argparse
import math
from pathlib import Path

import torch

from orthorank.baselines.calibration import calibration_windows
from orthorank.baselines.registry import get_search
from orthorank.methods import METHODS, searched
from orthorank.baselines.search import StackRunner
from orthorank.cli.common import (
    add_model_args, add_selection_args, finite_float, load_from_args, positive_int, selection_from_args,
)
from orthorank.errors import UserError
from orthorank.evaluation.data import load_calibration_text
from orthorank.method.apply import restore_dense
from orthorank.method.cost import Arch
from orthorank.method.plan import DEFAULT_COST_SEQ_LEN, MATCH_RULES, Plan, check_sparsity
from orthorank.method.plan_store import plan_file_method, sparsity_label
from orthorank.results import check_writable

# Default calibration: chosen from the calibration-spread study (benchmarks/calibration_spread.py, README).
DEFAULT_CALIB_SAMPLES = 8
DEFAULT_CALIB_SEQ_LEN = 256
DEFAULT_SCREEN_FRACTION = 1.0  # exhaustive; screening (e.g. 0.25) pays off for larger calibration sets


def parse_sparsities(text: str) -> list[float]:
    try:
        values = [float(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise UserError(f"--sparsity must be comma-separated numbers, got {text!r}") from None
    if not values:
        raise UserError("--sparsity is empty")
    for v in values:
        check_sparsity(v)
    return sorted(set(values))


def _match_rules(text: str) -> list[str]:
    rules = [r.strip() for r in text.split(",") if r.strip()]
    bad = [r for r in rules if r not in MATCH_RULES]
    if bad or not rules:
        raise argparse.ArgumentTypeError(f"--match takes {', '.join(MATCH_RULES)} or both, got {text!r}")
    return list(dict.fromkeys(rules))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="search the layers for a method at a sparsity; write plan files",
                       description="Greedy (orthorank, sleb) or one-shot (shortened-ppl, shortgpt) layer search "
                                   "on calibration text disjoint from the evaluation text.")
    add_model_args(p)
    p.add_argument("--method", required=True, choices=searched(),
                   help="orthorank-nominal is orthorank with --match nominal; hybrid needs --cost-table")
    p.add_argument("--sparsity", default=None, help="one value or a list, e.g. 0.1,0.2 (greedy runs once); for "
                   "hybrid: the predicted speed-up of removing ceil(s L) layers on the cost table")
    p.add_argument("--target-speedup", default=None,
                   help="hybrid: predicted prefill speed-up(s) to reach, e.g. 1.1,1.25 (one search, one plan each)")
    p.add_argument("--cost-table", default=None, metavar="FILE",
                   help="hybrid: this device's cost table, from `orthorank bench --cost-table FILE`")
    p.add_argument("--ratios", default=None,
                   help="hybrid: selection ratios the search may use (default: every ratio on the cost table)")
    add_selection_args(p)
    p.add_argument("--calib-data", default="c4", help="c4 (sample documents not used for evaluation), "
                   "wikitext2-train (hub), or a text file")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--calib-samples", type=positive_int, default=DEFAULT_CALIB_SAMPLES)
    p.add_argument("--seq-len", type=positive_int, default=DEFAULT_CALIB_SEQ_LEN, help="calibration window length")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--match", default="compute", type=_match_rules,
                   help="OrthoRank layer count for a sparsity: compute (default: FLOPs skipped at --cost-seq-len at "
                        "least pruning's) or nominal (the paper's round(s L / (1 - r)))")
    p.add_argument("--cost-seq-len", type=positive_int, default=DEFAULT_COST_SEQ_LEN,
                   help="sequence length at which compute sparsity is counted (the evaluation length)")
    p.add_argument("--screen-fraction", type=finite_float, default=DEFAULT_SCREEN_FRACTION,
                   help="greedy searches score every candidate on this share of the calibration batches first and "
                        "re-check the --recheck best on all of them (default %(default)s; 1 = exhaustive)")
    p.add_argument("--exhaustive", action="store_true", help="score every candidate on every calibration batch")
    p.add_argument("--recheck", type=positive_int, default=3)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", help="plan file (one sparsity)")
    out.add_argument("--out-dir", help="folder for <method>-<sparsity>.json, one per sparsity")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.method == "hybrid":
        from orthorank.cli.calibrate_hybrid import run_hybrid

        return run_hybrid(args)
    if args.sparsity is None:
        raise UserError(f"--method {args.method} needs --sparsity")
    if args.target_speedup is not None or args.cost_table is not None or args.ratios is not None:
        raise UserError("--target-speedup, --cost-table and --ratios belong to --method hybrid")
    method = METHODS[args.method]
    if method.match != "compute":  # orthorank-nominal: the search of orthorank under the nominal rule
        args.match = [method.match]
    args.method = method.search
    search = get_search(method.search)
    sparsities = parse_sparsities(args.sparsity)
    if args.output and len(sparsities) > 1:
        raise UserError("-o takes one sparsity; use --out-dir for several")
    selection = selection_from_args(args)
    if search.plan_method == "orthorank" and selection.ratio >= 1.0:
        raise UserError("ratio 1.0 skips no work; choose a ratio below 1")
    rules = args.match if search.plan_method == "orthorank" else ["compute"]
    jobs = [(rule, s) for rule in rules for s in sparsities]
    if args.output and len(jobs) > 1:
        raise UserError("-o takes one sparsity and one --match rule; use --out-dir for several")
    outputs = [Path(args.output)] if args.output else [
        Path(args.out_dir) / f"{plan_file_method(args.method, rule)}-{sparsity_label(s)}.json" for rule, s in jobs]
    for path in outputs:
        check_writable(path, args.overwrite)

    from orthorank import distributed as dist

    dist.init(args.device)
    text = load_calibration_text(args.calib_data, args.data_dir)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("calibration needs a real model with a tokenizer")
    restore_dense(lm.model)
    L = lm.num_layers
    arch = Arch.from_config(lm.config, L)
    counts = [search.layer_count(s, L, selection.ratio, rule, arch, args.cost_seq_len) for rule, s in jobs]
    windows = calibration_windows(lm.tokenizer, text, args.calib_samples, args.seq_len, args.seed)
    check_context(lm.model, args.seq_len)
    runner = StackRunner(lm.model, windows, args.batch_size)
    if not 0.0 < args.screen_fraction <= 1.0:
        raise UserError(f"--screen-fraction must be in (0, 1], got {args.screen_fraction}")
    screen = max(1, math.ceil(args.screen_fraction * len(runner.batches) - 1e-9))
    screen = None if args.exhaustive or screen >= len(runner.batches) else screen
    say = print if dist.is_main() else (lambda *a, **k: None)
    greedy = args.method in ("orthorank", "sleb")
    say(f"{args.method}: " + (f"{max(counts)} greedy steps" if greedy else "one-shot scores") + f" over {L} layers, "
        f"calibration {args.calib_samples} x {args.seq_len} tokens from {args.calib_data} (seed {args.seed})"
        + ("" if not greedy else ", exhaustive" if screen is None else f", screening on {screen} of "
           f"{len(runner.batches)} batches and re-checking the contenders") + f", {dist.world_size()} process(es)")
    result = search.run(runner, max(counts), selection, True, screen_batches=screen, recheck=args.recheck, log=say)
    say(f"{args.method}: search took {result.seconds:.1f}s ({result.evaluations} candidate evaluations; dense "
        f"calibration loss {result.dense_loss:.4f})")
    if not dist.is_main():
        return 0
    for (rule, s), n, path in zip(jobs, counts, outputs):
        plan = Plan(
            method=search.plan_method,
            layers=result.order[:n],
            model=lm.name,
            signature=lm.signature(),
            selection=selection if search.plan_method == "orthorank" else None,
            target_sparsity=s,
            arch=dict(arch.__dict__),
            provenance={
                "search": args.method,
                "reference": search.reference,
                "match": rule if search.plan_method == "orthorank" else "removed ceil(s L)",
                "cost_seq_len": args.cost_seq_len,
                "order": result.order[:n],
                "losses": [round(x, 6) for x in result.losses[:n]],
                "dense_loss": round(result.dense_loss, 6),
                "calibration": {"data": args.calib_data, "samples": args.calib_samples, "seq_len": args.seq_len,
                                "seed": args.seed},
                "search_mode": "exhaustive" if screen is None else {"screen_batches": screen,
                                                                    "recheck": args.recheck},
                "search_seconds": round(result.seconds, 2),
                "search_device": f"{lm.device} x {dist.world_size()}, dtype {str(lm.model.dtype).removeprefix('torch.')}, "
                                 f"{torch.get_num_threads()} threads",
                "evaluations": result.evaluations,
            },
        )
        plan.save(path, overwrite=args.overwrite)
        m = plan.sparsity(seq_len=args.cost_seq_len)
        print(f"  sparsity {s:g}: {n} layers {sorted(plan.layers)} -> nominal {m['nominal']:.4f}, compute "
              f"{m['compute']:.4f} at {args.cost_seq_len} tokens; wrote {path}")
    return 0
