"""`orthorank calibrate`: choose the layers for a method at a sparsity on calibration text and write plans."""

from __future__ import annotations

import argparse

from orthorank.api.calibration_options import match_rules, token_count
from orthorank.cli.common import (
    DATA_DIR_HELP,
    add_model_args,
    add_selection_args,
    add_store_args,
    deprecated,
    finite_float,
    positive_int,
)
from orthorank.method.plan import DEFAULT_COST_SEQ_LEN
from orthorank.method.registry import searched
from orthorank.search.calibration import (
    DEFAULT_CALIB_BATCH,
    DEFAULT_CALIB_DATA,
    DEFAULT_CALIB_SEQ_LEN,
    DEFAULT_CALIB_TOKENS,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="search the layers for a method at a sparsity; write plan files",
                       description="Greedy (orthorank, sleb) or one-shot (shortened-ppl, shortgpt) layer search "
                                   "on calibration text disjoint from the evaluation text.")
    add_model_args(p)
    p.add_argument("--method", required=True, choices=searched(),
                   help="orthorank-nominal is orthorank with --match nominal; hybrid needs --cost-table")
    p.add_argument("--sparsity", default=None, help="one value or a list, e.g. 0.1,0.2 (greedy runs once); for "
                   "hybrid: the predicted speed-up of removing ceil(s L) layers on the cost table (default: none; "
                   "every method needs it, hybrid needs it or --target-speedup)")
    p.add_argument("--target-speedup", default=None,
                   help="hybrid: predicted prefill speed-up(s) to reach, e.g. 1.1,1.25 (one search, one plan each; "
                        "default: none, --sparsity names the levels)")
    p.add_argument("--cost-table", default=None, metavar="FILE",
                   help="hybrid: this device's cost table, from `orthorank bench --cost-table FILE` (default: none; "
                        "--method hybrid needs it)")
    p.add_argument("--ratios", default=None,
                   help="hybrid: selection ratios the search may use (default: every ratio on the cost table)")
    add_selection_args(p)
    p.add_argument("--router", default=None, metavar="BANK",
                   help="with --policy router: a router bank (`orthorank fit-router --layers inner`) covering every "
                        "candidate layer; the plans found keep it, refit them on their own layers with fit-router "
                        "(default: none; --policy router needs it)")
    p.add_argument("--calib-data", default=DEFAULT_CALIB_DATA,
                   help="calibration text: a domain's held-out part (c4, wikitext2, news, code), mix (equal tokens "
                        "of c4, wikitext2, news and code) or mix:A+B, wikitext2-train (hub), or a text file "
                        "(default %(default)s: the source whose plans lose least on their worst evaluation domain, "
                        "docs/transfer.md)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--calib-samples", type=positive_int, default=None,
                   help="calibration windows of --seq-len (default: --calib-tokens / --seq-len)")
    p.add_argument("--calib-tokens", type=token_count, default=None,
                   help=f"calibration size in tokens, e.g. 8K or 32768 (sets --calib-samples to this / --seq-len; "
                        f"default {DEFAULT_CALIB_TOKENS // 1024}K)")
    p.add_argument("--seq-len", type=positive_int, default=DEFAULT_CALIB_SEQ_LEN,
                   help="calibration window length (default %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_CALIB_BATCH,
                   help="calibration windows per forward (default %(default)s)")
    p.add_argument("--match", default="compute", type=match_rules,
                   help="OrthoRank plans for a sparsity: compute (default: the fewest selection layers that reach "
                        "pruning's compute sparsity at --cost-seq-len, with the keep ratio raised until the two are "
                        "equal), speed (the same layers, keep ratio set so the measured prefill speed-up equals "
                        "pruning's on this machine) or nominal (the paper's round(s L / (1 - r)) layers); several "
                        "comma-separated")
    p.add_argument("--cost-seq-len", type=positive_int, default=DEFAULT_COST_SEQ_LEN,
                   help="sequence length at which compute sparsity is counted (the evaluation length; default "
                        "%(default)s)")
    p.add_argument("--screen-fraction", type=finite_float, default=None,
                   help="greedy searches race: every candidate is scored on this share of the calibration batches "
                        "first, those clearly worse than the leader (paired t-test per window) are dropped and the "
                        "rest see twice as many batches, until all are seen (default: the batches of the first "
                        "2K tokens; 1 = exhaustive)")
    p.add_argument("--exhaustive", action="store_true", help="score every candidate on every calibration batch")
    p.add_argument("--recheck", type=positive_int, default=1,
                   help="a race never drops the best N so far: they are always scored on every batch (default 1: "
                        "only the paired test drops candidates; each kept one costs a pass over every batch)")
    p.add_argument("--measure-speed", type=int, default=5, metavar="N",
                   help="time one prefill of --cost-seq-len tokens under each plan and dense, N interleaved repeats, "
                        "and record the measured speed-up in the plan (0: do not time; --match speed needs N >= 3; "
                        "default %(default)s)")
    add_store_args(p)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", metavar="DIR",
                     help="folder for <method>-<sparsity>.json, one per sparsity (required: --out or --json)")
    deprecated(p, "--out", "--out-dir")
    out.add_argument("--json", dest="json_out", metavar="FILE",
                     help="one plan file, for one sparsity (required: --out or --json)")
    deprecated(p, "--json", "-o", "--output")
    p.add_argument("--overwrite", action="store_true", help="replace existing plan files")
