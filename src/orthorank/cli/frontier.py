"""`orthorank frontier`: the retrieval frontier, measured prefill speed-up against long-context score per method and
level at each prompt length, with each method's free speed-up (api/frontier.py, evaluation/frontier.py)."""

from __future__ import annotations

import argparse

from orthorank.api import frontier
from orthorank.cli.common import DATA_DIR_HELP, add_model_args, add_store_args, finite_float, positive_int
from orthorank.evaluation.longctx_suite import LAYOUTS, LENGTHS, TASKS
from orthorank.method.registry import saved
from orthorank.method.schedules import DEFAULT_START, SCHEDULES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("frontier", help="prefill speed-up against long-context score per method and level",
                       description=frontier.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--methods", default="dense,sleb,shortgpt,orthorank,depth,progressive,local",
                   help=f"comma-separated, from dense, {', '.join(saved())} (levels from the saved search's order) "
                        f"and the schedules {', '.join(SCHEDULES)} (default %(default)s)")
    p.add_argument("--levels", default="0.05,0.1,0.15,0.2",
                   help="levels s: each plan skips about the compute of removing ceil(s L) layers at the length "
                        "(default %(default)s)")
    p.add_argument("--policies", default=None, metavar="SPECS",
                   help="extra rows on the orthorank and depth plans: NAME[+recent=W][+first=W][+window=W], "
                        "comma-separated, e.g. attention+window=64 (default: none)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="also a row for this preset (src/orthorank/presets/NAME.json, `generate --preset`) at each "
                        "length, to check it on this model (default: none)")
    p.add_argument("--schedule-start", type=finite_float, default=None,
                   help="share of the layers kept dense before a schedule selects (default: "
                        + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_START.items()) + ")")
    p.add_argument("--tails", default=None, metavar="W,W,...",
                   help="candidate tails: each selecting method also gets rows that always update the prompt's last W "
                        "tokens, W chosen on calibration prompts among these, e.g. 0,16,64,256 (default: none)")
    p.add_argument("--calib-samples", type=positive_int, default=8,
                   help="calibration prompts per task for choosing the tail (default %(default)s)")
    p.add_argument("--score-on", choices=("evaluation", "calibration"), default="evaluation",
                   help="the prompts rows are scored on: the offline suite's evaluation samples, or the same tasks "
                        "built from calibration text (checked to share no text with the evaluation samples), which "
                        "is what a preset is chosen on (python -m orthorank.study.presets) (default %(default)s)")
    p.add_argument("--lengths", default="4k,8k",
                   help=f"prompt lengths: {', '.join(LENGTHS)} or N tokens (default %(default)s)")
    p.add_argument("--tasks", default="niah_single,niah_multikey",
                   help=f"offline-suite tasks, from {', '.join(TASKS)} (default %(default)s)")
    p.add_argument("--layouts", default="last",
                   help="where the question goes, comma-separated: last (after the document, with the task's answer "
                        "prefix), first (before it, the prompt ending in 'Answer:'), long (last, after over 100 "
                        f"tokens of instructions); from {', '.join(LAYOUTS)} (default %(default)s)")
    p.add_argument("--chat", choices=("off", "on", "both"), default="off",
                   help="the tokenizer's chat template around each prompt: off, on or both (default %(default)s)")
    p.add_argument("--spans", default=None, metavar="H:W,...",
                   help="local attention rows also with these global spans: the prompt's first H tokens read by every "
                        "query, its last W tokens reading every key, e.g. 0:64,192:64 (default: the plan's own)")
    p.add_argument("--samples", type=positive_int, default=10,
                   help="samples per task, layout and chat mode (default %(default)s)")
    p.add_argument("--longbench", type=positive_int, default=None, metavar="N",
                   help="also score dense and each method's free point on the first N examples of a LongBench task "
                        "(default: none)")
    p.add_argument("--longbench-task", default="multi_news", help="that task (default %(default)s)")
    p.add_argument("--longbench-new-tokens", type=positive_int, default=None,
                   help="cap on its new tokens, said in the table (default: the task's own)")
    p.add_argument("--longbench-dir", default=None,
                   help="LongBench files (default: longbench/ in --data-dir or ../shared/data)")
    p.add_argument("--stop-after-loss", action="store_true",
                   help="score a method's levels from the lowest up and leave out the levels above one that already "
                        "lost against dense (paired interval below 0): scores fall with the level, so its free "
                        "speed-up cannot lie there; the table lists what was left out (default: score every level)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="interleaved timing rounds per length, after one warm-up round (default %(default)s)")
    p.add_argument("--plans-dir", default=None,
                   help="folder of saved <method>-<sparsity>.json plans (default: plans/<model>/)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="prompts per generate call when scoring (default %(default)s)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for frontier.{md,json} and one figure per length")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    add_store_args(p)
