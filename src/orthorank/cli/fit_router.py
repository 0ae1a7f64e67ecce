"""`orthorank fit-router`: fit the router policy for a plan's selection layers on calibration text and write the plan
with the router inside it (search/router_fit.py)."""

from __future__ import annotations

import argparse

from orthorank.cli.common import DATA_DIR_HELP, add_model_args, add_store_args, deprecated, positive_int
from orthorank.search.calibration import DEFAULT_CALIB_DATA
from orthorank.search.router_fit import DEFAULT_ALPHAS, DEFAULT_TARGETS, TARGETS

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
