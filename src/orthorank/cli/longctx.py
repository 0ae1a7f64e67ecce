"""`orthorank longctx` (offline RULER-style suite) and `orthorank longbench` (LongBench v1 files): long-context
accuracy of dense, layer pruning and OrthoRank under each decode policy, with intervals.

    orthorank longctx --methods dense,sleb,orthorank --sparsity 0.2 --lengths 1k,2k,4k --samples 50 --out DIR
    orthorank longbench --methods dense,sleb,orthorank --sparsity 0.2 --tasks multi_news --out DIR
"""

from __future__ import annotations

import argparse

from orthorank.cli.common import DATA_DIR_HELP, add_model_args, add_store_args, deprecated, finite_float, positive_int
from orthorank.evaluation.longctx_suite import CLASSIC_TASKS, LENGTHS, TASKS
from orthorank.method.policies import DECODE_MODES
from orthorank.method.registry import saved


def _add_common(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--methods", default="dense,sleb,orthorank",
                   help=f"comma-separated, from dense, {', '.join(saved())} (saved plans at --sparsity; default "
                        "%(default)s)")
    p.add_argument("--sparsity", type=finite_float, default=0.2,
                   help="the level of the saved plans (default %(default)s)")
    p.add_argument("--decode-modes", dest="decode_modes", default=",".join(DECODE_MODES), metavar="MODES",
                   help="OrthoRank decode policies, comma-separated, one row each (default: all: "
                        + ",".join(DECODE_MODES) + ")")
    p.add_argument("--policies", default=None, metavar="SPECS",
                   help="add OrthoRank rows with other selection policies on the same layers and ratio (equal "
                        "compute): comma-separated NAME[+recent=W][+first=W], e.g. orthogonal+recent=64 (default: "
                        "none)")
    p.add_argument("--plans-dir", default=None,
                   help="folder of <method>-<sparsity>.json plans (default: plans/<model>/ here or in the repository)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="prompts per generate call (left-padded; default %(default)s)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for <command>.json, .md and the plot")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    add_store_args(p)
    deprecated(p, "--decode-modes", "--decode")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("longctx", help="offline long-context suite (needles, variable tracking, common words)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    p.add_argument("--tasks", default=",".join(CLASSIC_TASKS),
                   help=f"comma-separated, from {', '.join(TASKS)} (default: %(default)s)")
    p.add_argument("--lengths", default="1k,2k,4k",
                   help=f"prompt lengths in tokens: {', '.join(LENGTHS)} or N (default %(default)s)")
    p.add_argument("--samples", type=positive_int, default=50,
                   help="samples per task and length (default %(default)s)")

    q = sub.add_parser("longbench", help="LongBench v1 from its files (prompts, truncation, metrics)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(q)
    q.add_argument("--tasks", default=None, help="task files (stems) in --data-dir (default: every file there)")
    q.add_argument("--limit", type=positive_int, default=None,
                   help="first N examples per task (default: every example)")
    q.add_argument("--max-length", type=positive_int, default=None,
                   help="prompt budget in tokens before middle truncation (default: context - max new tokens)")
    q.add_argument("--no-chat", action="store_true", help="never apply the chat template")
