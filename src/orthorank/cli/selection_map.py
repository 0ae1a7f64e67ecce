"""`orthorank selection-map`: which tokens of a long prompt each layer of a plan updates, with the instruction,
the needle(s) and the question marked. Writes DIR/selection-map.json and one PNG per map; `orthorank analyze
--selection-map DIR/selection-map.json` puts them in the analysis report.

    orthorank selection-map --method orthorank --sparsity 0.2 --prompts needle:2k,longbench:multi_news --out DIR
    orthorank selection-map --plan PLAN.json --policies orthogonal,orthogonal+recent=64 --out DIR
"""

from __future__ import annotations

import argparse

from orthorank.api.selection_map import MAP_JSON
from orthorank.cli.common import DATA_DIR_HELP, add_model_args, add_plan_args, positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selection-map", help="which tokens of a long prompt each layer of a plan updates",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_plan_args(p, methods=("orthorank", "orthorank-nominal", "orthorank-speed", "hybrid"), saved=True)
    p.add_argument("--prompts", default="needle:2k,longbench:multi_news",
                   help="comma-separated: needle:LENGTH[:INDEX] (the long-context suite's niah_single sample), "
                        "longbench:TASK[:INDEX] (without INDEX: the first example that fits --max-tokens "
                        "untruncated; default %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=2048,
                   help="longest LongBench prompt taken (default %(default)s)")
    p.add_argument("--policies", default=None, metavar="SPECS",
                   help="one map per policy variant on the plan's layers: NAME[+recent=W][+first=W], comma-separated "
                        "(default: one map, the plan's own policy)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--out", required=True, help=f"folder for {MAP_JSON} and the figures")
    p.add_argument("--overwrite", action="store_true")
