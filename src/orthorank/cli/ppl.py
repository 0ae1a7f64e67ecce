"""`orthorank ppl`: perplexity of a dense, OrthoRank or pruned model on WikiText-2, C4 or a text file."""

from __future__ import annotations

import argparse

from orthorank.cli.common import DATA_DIR_HELP, add_model_args, add_output_args, add_plan_args, positive_int
from orthorank.method.registry import saved


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ppl", help="perplexity on a text domain (wikitext2, c4, news, code) or a text file",
                       description="Perplexity the GPTQ/SLEB way: non-overlapping windows, mean token NLL.")
    add_model_args(p)
    p.add_argument("--dataset", default="wikitext2",
                   help="wikitext2, c4, news, code (docs/data.md), or a path to a UTF-8 text file (default "
                        "%(default)s)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--seq-len", type=positive_int, default=2048, help="tokens per window (default %(default)s)")
    p.add_argument("--max-windows", type=positive_int, default=None,
                   help="evaluate the first N windows (default: every window of the dataset)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="windows per forward (default %(default)s)")
    add_plan_args(p, methods=("dense", "prune", *saved()), saved=True)
    add_output_args(p)
