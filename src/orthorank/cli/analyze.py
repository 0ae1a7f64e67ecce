"""`orthorank analyze`: does a model have the attention sink OrthoRank relies on? Plots and an HTML report."""

from __future__ import annotations

import argparse

from orthorank.cli.common import DATA_DIR_HELP, add_model_args, finite_float, positive_int
from orthorank.method.selection import CRITERIA


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze", help="per-layer sink statistics, plots and an HTML report",
        description="Per layer: cos(sink, token) of the normalized states, the sink's layer-to-layer stability, "
                    "hidden-state norms, the attention share of the sink, and which tokens OrthoRank would select. "
                    "Writes PNG figures, DIR/report.html (self-contained) and DIR/analysis.json.")
    add_model_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", default=None, help="wikitext2 (default), c4, or a path to a UTF-8 text file")
    src.add_argument("--text", default=None,
                     help="analyze this text instead of a dataset (split into --seq-len windows when longer; "
                          "default: none, --dataset is read)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--samples", type=positive_int, default=4, help="windows to average over (default 4)")
    p.add_argument("--seq-len", type=positive_int, default=512, help="tokens per window (default 512)")
    p.add_argument("--ratio", type=finite_float, default=0.33, help="selection ratio for the selection map (default %(default)s)")
    p.add_argument("--criterion", choices=CRITERIA, default="dot", help="selection score: |<x_sink,x_i>| (dot) or |cos| (default %(default)s)")
    p.add_argument("--sample-tokens", type=positive_int, default=48,
                   help="tokens of the first window shown in the selection map (default 48)")
    p.add_argument("--compare-json", action="append", default=[], metavar="FILE",
                   help="add a table from an `orthorank compare` JSON result (repeatable; default: none)")
    p.add_argument("--selection-map", action="append", default=[], metavar="FILE",
                   help="add the maps of an `orthorank selection-map` result (selection-map.json; repeatable; "
                        "default: none)")
    p.add_argument("--out", required=True, help="output folder for report.html, the PNGs and analysis.json")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report in --out")
