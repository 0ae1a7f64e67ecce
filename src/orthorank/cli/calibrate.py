"""`orthorank calibrate`: choose the layers for a method at a sparsity on calibration text and write plans."""

from __future__ import annotations

import argparse
from pathlib import Path

from orthorank.baselines.calibration import calibration_windows
from orthorank.baselines.registry import SEARCH_METHODS, get_search
from orthorank.baselines.search import StackRunner
from orthorank.cli.common import add_model_args, add_selection_args, load_from_args, positive_int, selection_from_args
from orthorank.errors import UserError
from orthorank.evaluation.data import load_calibration_text
from orthorank.method.apply import restore_dense
from orthorank.method.plan import Plan, check_sparsity
from orthorank.method.plan_store import sparsity_label
from orthorank.results import check_writable


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


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="search the layers for a method at a sparsity; write plan files",
                       description="Greedy (orthorank, sleb) or one-shot (shortened-ppl, shortgpt) layer search "
                                   "on calibration text disjoint from the evaluation text.")
    add_model_args(p)
    p.add_argument("--method", required=True, choices=list(SEARCH_METHODS))
    p.add_argument("--sparsity", required=True, help="one value or a list, e.g. 0.1,0.2 (greedy runs once)")
    add_selection_args(p)
    p.add_argument("--calib-data", default="c4", help="c4 (sample documents not used for evaluation), "
                   "wikitext2-train (hub), or a text file")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--calib-samples", type=positive_int, default=32)
    p.add_argument("--seq-len", type=positive_int, default=512)
    p.add_argument("--batch-size", type=positive_int, default=4)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", help="plan file (one sparsity)")
    out.add_argument("--out-dir", help="folder for <method>-<sparsity>.json, one per sparsity")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    search = get_search(args.method)
    sparsities = parse_sparsities(args.sparsity)
    if args.output and len(sparsities) > 1:
        raise UserError("-o takes one sparsity; use --out-dir for several")
    selection = selection_from_args(args)
    if search.plan_method == "orthorank" and selection.ratio >= 1.0:
        raise UserError("ratio 1.0 skips no work; choose a ratio below 1")
    outputs = [Path(args.output)] if args.output else [Path(args.out_dir) / f"{args.method}-{sparsity_label(s)}.json"
                                                      for s in sparsities]
    for path in outputs:
        check_writable(path, args.overwrite)

    text = load_calibration_text(args.calib_data, args.data_dir)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("calibration needs a real model with a tokenizer")
    restore_dense(lm.model)
    L = lm.num_layers
    counts = [search.layer_count(s, L, selection.ratio) for s in sparsities]
    windows = calibration_windows(lm.tokenizer, text, args.calib_samples, args.seq_len, args.seed)
    runner = StackRunner(lm.model, windows, args.batch_size)
    result = search.run(runner, max(counts), selection, True)
    print(f"{args.method}: search over {L} layers took {result.seconds:.1f}s ({result.evaluations} candidate "
          f"evaluations, calibration {args.calib_samples} x {args.seq_len} tokens from {args.calib_data}; "
          f"dense calibration loss {result.dense_loss:.4f})")
    for s, n, path in zip(sparsities, counts, outputs):
        plan = Plan(
            method=search.plan_method,
            layers=result.order[:n],
            model=lm.name,
            signature=lm.signature(),
            selection=selection if search.plan_method == "orthorank" else None,
            nominal_sparsity=s,
            provenance={
                "search": args.method,
                "reference": search.reference,
                "order": result.order[:n],
                "losses": [round(x, 6) for x in result.losses[:n]],
                "dense_loss": round(result.dense_loss, 6),
                "calibration": {"data": args.calib_data, "samples": args.calib_samples, "seq_len": args.seq_len,
                                "seed": args.seed},
                "search_seconds": round(result.seconds, 2),
                "evaluations": result.evaluations,
            },
        )
        plan.save(path, overwrite=args.overwrite)
        print(f"  sparsity {s:g}: {n} layers {sorted(plan.layers)} -> effective sparsity "
              f"{plan.effective_sparsity:.4f}; wrote {path}")
    return 0
