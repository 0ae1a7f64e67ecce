"""Options of the long-input commands: `longctx` (the offline suite), `longbench` (LongBench v1 files) and `frontier`
(prefill speed-up against long-context score per method and level)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orthorank.harness.api.options.base import finite_float, flag, positive_int
from orthorank.harness.api.options.groups import DataOptions, ModelOptions, OverwriteOptions, SavedPlansOptions, StoreOptions
from orthorank.harness.evaluation.longctx_suite import CLASSIC_TASKS, LAYOUTS, LENGTHS, TASKS
from orthorank.method.policies import DECODE_MODES
from orthorank.method.registry import default_methods, saved, scheduled
from orthorank.method.schedules import DEFAULT_START

LONG_INPUTS = """\
`orthorank longctx` (offline RULER-style suite) and `orthorank longbench` (LongBench v1 files): long-context
accuracy of dense, layer pruning and OrthoRank under each decode policy, with intervals.

    orthorank longctx --methods dense,sleb,orthorank --sparsity 0.2 --lengths 1k,2k,4k --samples 50 --out DIR
    orthorank longbench --methods dense,sleb,orthorank --sparsity 0.2 --tasks multi_news --out DIR
"""


@dataclass(kw_only=True)
class LongInputOptions(ModelOptions, SavedPlansOptions, DataOptions, StoreOptions, OverwriteOptions):
    """What `longctx` and `longbench` share."""

    description: ClassVar[str] = LONG_INPUTS
    examples: ClassVar[bool] = True

    methods: str = flag("--methods", default=default_methods("longctx"),
                        help=f"comma-separated, from dense, {', '.join(saved())} (saved plans at --sparsity; default "
                             "%(default)s)")
    sparsity: float = flag("--sparsity", default=0.2, type=finite_float,
                           help="the level of the saved plans (default %(default)s)")
    # the paper rule's decode policies (causal decoding belongs to a router plan with thresholds, its own method)
    decode_modes: str = flag("--decode-modes", default=",".join(m for m in DECODE_MODES if m != "causal"),
                             metavar="MODES", deprecated=("--decode",),
                             help="OrthoRank decode policies, comma-separated, one row each (default: "
                                  "%(default)s; causal needs a router plan with thresholds; own: each plan under the policy it was "
                                  "saved with)")
    policies: str | None = flag("--policies", default=None, metavar="SPECS",
                                help="add OrthoRank rows with other selection policies on the same layers and ratio "
                                     "(equal compute): comma-separated NAME[+recent=W][+first=W], e.g. "
                                     "orthogonal+recent=64 (default: none)")
    batch_size: int = flag("--batch-size", default=1, type=positive_int,
                           help="prompts per generate call (left-padded; default %(default)s)")
    out: str = flag("--out", metavar="DIR", group="output", help="folder for <command>.json, .md and the plot")


@dataclass(kw_only=True)
class LongctxOptions(LongInputOptions):
    command: ClassVar[str] = "longctx"
    about: ClassVar[str] = "offline long-context suite (needles, variable tracking, common words)"

    tasks: str = flag("--tasks", default=",".join(CLASSIC_TASKS),
                      help=f"comma-separated, from {', '.join(TASKS)} (default: %(default)s)")
    lengths: str = flag("--lengths", default="1k,2k,4k",
                        help=f"prompt lengths in tokens: {', '.join(LENGTHS)} or N (default %(default)s)")
    samples: int = flag("--samples", default=50, type=positive_int,
                        help="samples per task and length (default %(default)s)")


@dataclass(kw_only=True)
class LongbenchOptions(LongInputOptions):
    command: ClassVar[str] = "longbench"
    about: ClassVar[str] = "LongBench v1 from its files (prompts, truncation, metrics)"

    tasks: str | None = flag("--tasks", default=None,
                             help="task files (stems) in --data-dir (default: every file there)")
    limit: int | None = flag("--limit", default=None, type=positive_int,
                             help="first N examples per task (default: every example)")
    max_length: int | None = flag("--max-length", default=None, type=positive_int,
                                  help="prompt budget in tokens before middle truncation (default: context - max new "
                                       "tokens)")
    no_chat: bool = flag("--no-chat", default=False, kind="switch", help="never apply the chat template")


@dataclass(kw_only=True)
class FrontierOptions(ModelOptions, DataOptions, StoreOptions, OverwriteOptions):
    command: ClassVar[str] = "frontier"
    about: ClassVar[str] = "prefill speed-up against long-context score per method and level"
    description: ClassVar[str] = """\
`orthorank frontier`: at each prompt length, how much faster prefill gets per method before long-context answers
get worse (harness/api/frontier.py, harness/evaluation/frontier.py).

    orthorank frontier --methods dense,sleb,shortgpt,orthorank,depth,progressive,local --levels 0.05,0.1,0.15,0.2 \\
        --lengths 4k,8k --samples 10 --repeats 5 --out DIR

Each method runs at several levels, each level a plan skipping about the compute of removing ceil(s L) layers at
that length: pruning methods and OrthoRank take the first layers of their saved searches' order (greedy searches
are sequential, so a shorter prefix is what the search would have chosen at a lower level); the schedules
(method/schedules.py: depth, progressive, local) are built for that compute. `--policies` adds rows with other
selection policies on the OrthoRank and depth plans. With `--tails`, every selecting method also gets rows that
always update the prompt's last W tokens (the question; within K, so compute is unchanged), W chosen per method and
length on calibration prompts (the same tasks built from calibration text, checked to share no text with the
evaluation prompts), never on evaluation samples. Every row is scored on the offline suite's tasks (paired with
dense, same items, through the result store: runs resume), judged by the non-inferiority rule
(harness/evaluation/noninferiority.py), and timed against dense in interleaved rounds of time to first token (batch 1, one
prompt of that length, the LM head on the last position only).
"""
    examples: ClassVar[bool] = True

    methods: str = flag("--methods", default=default_methods("frontier"),
                        help=f"comma-separated, from dense, {', '.join(saved())} (levels from the saved search's "
                             f"order) and the schedules {', '.join(scheduled())} (default %(default)s)")
    levels: str = flag("--levels", default="0.05,0.1,0.15,0.2",
                       help="levels s: each plan skips about the compute of removing ceil(s L) layers at the length "
                            "(default %(default)s)")
    policies: str | None = flag("--policies", default=None, metavar="SPECS",
                                help="extra rows on the orthorank and depth plans: NAME[+recent=W][+first=W]"
                                     "[+window=W], comma-separated, e.g. attention+window=64 (default: none)")
    preset: str | None = flag("--preset", default=None, metavar="NAME",
                              help="also a row for this preset (src/orthorank/presets/NAME.json, `generate --preset`) "
                                   "at each length, to check it on this model (default: none)")
    schedule_start: float | None = flag("--schedule-start", default=None, type=finite_float,
                                        help="share of the layers kept dense before a schedule selects (default: "
                                             + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_START.items()) + ")")
    tails: str | None = flag("--tails", default=None, metavar="W,W,...",
                             help="candidate tails: each selecting method also gets rows that always update the "
                                  "prompt's last W tokens, W chosen on calibration prompts among these, e.g. "
                                  "0,16,64,256 (default: none)")
    calib_samples: int = flag("--calib-samples", default=8, type=positive_int,
                              help="calibration prompts per task for choosing the tail (default %(default)s)")
    score_on: str = flag("--score-on", default="evaluation", choices=("evaluation", "calibration"),
                         help="the prompts rows are scored on: the offline suite's evaluation samples, or the same "
                              "tasks built from calibration text (checked to share no text with the evaluation "
                              "samples), which is what a preset is chosen on (python -m orthorank.harness.study.presets) "
                              "(default %(default)s)")
    stop_after_loss: bool = flag("--stop-after-loss", default=False, kind="switch",
                                 help="score a method's levels from the lowest up and leave out the levels above one "
                                      "that already lost against dense (paired interval below 0): scores fall with "
                                      "the level, so its free speed-up cannot lie there; the table lists what was "
                                      "left out (default: score every level)")
    lengths: str = flag("--lengths", default="4k,8k",
                        help=f"prompt lengths: {', '.join(LENGTHS)} or N tokens (default %(default)s)")
    tasks: str = flag("--tasks", default="niah_single,niah_multikey",
                      help=f"offline-suite tasks, from {', '.join(TASKS)} (default %(default)s)")
    layouts: str = flag("--layouts", default="last",
                        help="where the question goes, comma-separated: last (after the document, with the task's "
                             "answer prefix), first (before it, the prompt ending in 'Answer:'), long (last, after "
                             f"over 100 tokens of instructions); from {', '.join(LAYOUTS)} (default %(default)s)")
    chat: str = flag("--chat", default="off", choices=("off", "on", "both"),
                     help="the tokenizer's chat template around each prompt: off, on or both (default %(default)s)")
    spans: str | None = flag("--spans", default=None, metavar="H:W,...",
                             help="local attention rows also with these global spans: the prompt's first H tokens "
                                  "read by every query, its last W tokens reading every key, e.g. 0:64,192:64 "
                                  "(default: the plan's own)")
    longbench: int | None = flag("--longbench", default=None, type=positive_int, metavar="N",
                                 help="also score dense and each method's free point on the first N examples of a "
                                      "LongBench task (default: none)")
    longbench_task: str = flag("--longbench-task", default="multi_news", help="that task (default %(default)s)")
    longbench_new_tokens: int | None = flag("--longbench-new-tokens", default=None, type=positive_int,
                                            help="cap on its new tokens, said in the table (default: the task's own)")
    longbench_dir: str | None = flag("--longbench-dir", default=None,
                                     help="LongBench files (default: longbench/ in --data-dir or ../shared/data)")
    samples: int = flag("--samples", default=10, type=positive_int,
                        help="samples per task, layout and chat mode (default %(default)s)")
    repeats: int = flag("--repeats", default=5, type=positive_int,
                        help="interleaved timing rounds per length, after one warm-up round (default %(default)s)")
    plans_dir: str | None = flag("--plans-dir", default=None,
                                 help="folder of saved <method>-<sparsity>.json plans (default: plans/<model>/)")
    batch_size: int = flag("--batch-size", default=1, type=positive_int,
                           help="prompts per generate call when scoring (default %(default)s)")
    out: str = flag("--out", metavar="DIR", group="output",
                    help="folder for frontier.{md,json} and one figure per length")
