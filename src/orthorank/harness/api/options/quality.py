"""Options of the commands that measure quality: `ppl`, `zeroshot`, `compare`, `analyze` and `selection-map`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orthorank.harness.api.options.base import Options, batch_size_or_auto, finite_float, flag, non_negative_int, positive_int
from orthorank.harness.api.options.groups import (
    DataOptions,
    JsonOutputOptions,
    ModelOptions,
    OverwriteOptions,
    PlanOptions,
    SavedPlansOptions,
    StoreOptions,
)
from orthorank.harness.evaluation.data import DATASETS
from orthorank.harness.evaluation.zeroshot.registry import ALL_TASKS, MAIN_TASKS
from orthorank.method.plan import MATCH_RULES
from orthorank.method.registry import compared, default_methods
from orthorank.method.selection import CRITERIA


@dataclass(kw_only=True)
class WindowOptions(Options):
    """Perplexity's windows: non-overlapping, each scored in one forward."""

    seq_len: int = flag("--seq-len", default=2048, type=positive_int, help="tokens per window (default %(default)s)")
    batch_size: int = flag("--batch-size", default=1, type=positive_int,
                           help="windows per forward (default %(default)s)")


@dataclass(kw_only=True)
class PplOptions(ModelOptions, PlanOptions, WindowOptions, DataOptions, JsonOutputOptions):
    command: ClassVar[str] = "ppl"
    about: ClassVar[str] = "perplexity on a text domain (wikitext2, c4, news, code) or a text file"
    description: ClassVar[str] = "Perplexity the GPTQ/SLEB way: non-overlapping windows, mean token NLL."

    dataset: str = flag("--dataset", default="wikitext2",
                        help="wikitext2, c4, news, code (docs/data.md), or a path to a UTF-8 text file (default "
                             "%(default)s)")
    max_windows: int | None = flag("--max-windows", default=None, type=positive_int,
                                   help="evaluate the first N windows (default: every window of the dataset)")


@dataclass(kw_only=True)
class ZeroshotOptions(ModelOptions, PlanOptions, DataOptions, StoreOptions, JsonOutputOptions):
    command: ClassVar[str] = "zeroshot"
    about: ClassVar[str] = "zero-shot accuracy through lm-evaluation-harness (offline tasks)"
    description: ClassVar[str] = (
        "Zero-shot accuracy through lm-evaluation-harness with the harness's prompts and metrics, on offline copies "
        f"of the tasks read from ../shared/data. Tasks: {', '.join(ALL_TASKS)} (or main = the paper's five, all).")

    tasks: str = flag("--tasks", default=",".join(MAIN_TASKS),
                      help=f"comma-separated harness task names, main, all (default: {','.join(MAIN_TASKS)})")
    limit: int | None = flag("--limit", default=None, type=positive_int,
                             help="evaluate the first N examples of each task (default: every example)")
    batch_size: int | str | None = flag("--batch-size", default=None, type=batch_size_or_auto,
                                        help="rows per forward (default 8); rows are right-padded with a mask, so "
                                             "OrthoRank's selection and every row's result are those of batch size 1")
    metric: str = flag("--metric", default="acc", choices=("acc", "acc_norm"),
                       help="metric of the printed table (default %(default)s)")


@dataclass(kw_only=True)
class CompareOptions(ModelOptions, WindowOptions, SavedPlansOptions, DataOptions, StoreOptions, OverwriteOptions):
    command: ClassVar[str] = "compare"
    about: ClassVar[str] = "perplexity table of dense, layer pruning and OrthoRank at equal sparsity"
    description: ClassVar[str] = (
        "Evaluates the stored plans (plans/<model>/<method>-<sparsity>.json, made by `orthorank calibrate`) on the "
        "same windows, in one run, with bootstrap intervals and paired ratios. Finished windows are kept in the "
        "result store (--store), so an interrupted run resumes where it stopped.")

    methods: str = flag("--methods", default=default_methods("compare"),
                        help=f"comma-separated, from dense, {', '.join(compared())} (default %(default)s)")
    sparsity: str = flag("--sparsity", default="0.1,0.2", help="levels, comma-separated (default %(default)s)")
    datasets: str = flag("--datasets", default="wikitext2,c4",
                         help=f"comma-separated: domains {', '.join(DATASETS)}, or paths to UTF-8 text files "
                              "(default %(default)s)")
    max_windows: int | None = flag("--max-windows", default=None, type=positive_int,
                                   help="bound the windows per dataset (default: every window, stopping before the "
                                        "first one that shares text with a plan's calibration windows)")
    skip_windows: int = flag("--skip-windows", default=0, type=non_negative_int,
                             help="start after this many windows of each dataset: a slice disjoint from one evaluated "
                                  "before (for checking a choice made on the first windows; default %(default)s)")
    match: str = flag("--match", default="compute", choices=MATCH_RULES,
                      help="which OrthoRank plans: compute-matched to pruning (default, orthorank-<s>.json), matched "
                           "to pruning's measured speed (orthorank-speed-<s>.json) or the paper's nominal rule "
                           "(orthorank-nominal-<s>.json)")
    ablations: bool = flag("--ablations", default=False, kind="switch",
                           help="add OrthoRank with random/inverse selection, raw states and no K/V for bypassed "
                                "tokens (sink hidden, and sink visible)")
    ablation_levels: str | None = flag("--ablation-levels", default=None,
                                       help="levels that get ablation and policy rows (default: all)")
    policies: str | None = flag("--policies", default=None, metavar="SPECS",
                                help="add OrthoRank rows with other selection policies on the same layers and ratio "
                                     "(equal compute): comma-separated NAME[+recent=W][+first=W][+decode=MODE], e.g. "
                                     "norm,attention,oracle,orthogonal+recent=64; with random and oracle, a headroom "
                                     "table (default: none)")
    measure_speed: int = flag("--measure-speed", default=0, type=non_negative_int, metavar="N",
                              help="also time one prefill window per row, N interleaved repeats, for the measured "
                                   "speed-up (default %(default)s: no timing)")
    continuation: bool = flag("--continuation", default=False, kind="switch",
                              help="score each window's second half decoded one token at a time through the KV cache "
                                   "after a prefill of its first half, so decode policies count (add rows with "
                                   "--policies +decode=threshold); default: whole windows in one forward, as the "
                                   "paper")
    no_ppl: bool = flag("--no-ppl", default=False, kind="switch", help="skip perplexity (zero-shot only)")
    zeroshot: bool = flag("--zeroshot", default=False, kind="switch",
                          help="add zero-shot accuracy tables (harness tasks)")
    tasks: str = flag("--tasks", default=",".join(MAIN_TASKS),
                      help="zero-shot harness tasks, comma-separated (default %(default)s)")
    limit: int | None = flag("--limit", default=None, type=positive_int,
                             help="zero-shot examples per task (default: every example)")
    zeroshot_batch_size: int = flag("--zeroshot-batch-size", default=16, type=positive_int,
                                    help="zero-shot rows per forward (default %(default)s)")
    out: str = flag("--out", default="results/compare", metavar="DIR",
                    help="folder for compare.json, compare.md, compare.png (default %(default)s)")


@dataclass(kw_only=True)
class AnalyzeOptions(ModelOptions, DataOptions, OverwriteOptions):
    command: ClassVar[str] = "analyze"
    about: ClassVar[str] = "per-layer sink statistics, plots and an HTML report"
    description: ClassVar[str] = (
        "Per layer: cos(sink, token) of the normalized states, the sink's layer-to-layer stability, hidden-state "
        "norms, the attention share of the sink, and which tokens OrthoRank would select. Writes PNG figures, "
        "DIR/report.html (self-contained) and DIR/analysis.json.")
    exclusive: ClassVar[dict[str, bool]] = {"source": False}

    dataset: str | None = flag("--dataset", default=None, exclusive="source",
                               help="wikitext2 (default), c4, or a path to a UTF-8 text file")
    text: str | None = flag("--text", default=None, exclusive="source",
                            help="analyze this text instead of a dataset (split into --seq-len windows when longer; "
                                 "default: none, --dataset is read)")
    samples: int = flag("--samples", default=4, type=positive_int, help="windows to average over (default 4)")
    seq_len: int = flag("--seq-len", default=512, type=positive_int, help="tokens per window (default 512)")
    ratio: float = flag("--ratio", default=0.33, type=finite_float,
                        help="selection ratio for the selection map (default %(default)s)")
    criterion: str = flag("--criterion", default="dot", choices=CRITERIA,
                          help="selection score: |<x_sink,x_i>| (dot) or |cos| (default %(default)s)")
    sample_tokens: int = flag("--sample-tokens", default=48, type=positive_int,
                              help="tokens of the first window shown in the selection map (default 48)")
    compare_json: list[str] = flag("--compare-json", factory=list, kind="repeat", metavar="FILE",
                                   help="add a table from an `orthorank compare` JSON result (repeatable; default: "
                                        "none)")
    selection_map: list[str] = flag("--selection-map", factory=list, kind="repeat", metavar="FILE",
                                    help="add the maps of an `orthorank selection-map` result (selection-map.json; "
                                         "repeatable; default: none)")
    out: str = flag("--out", help="output folder for report.html, the PNGs and analysis.json")
    overwrite: bool = flag("--overwrite", default=False, kind="switch", help="replace an existing report in --out")


@dataclass(kw_only=True)
class SelectionMapOptions(ModelOptions, PlanOptions, DataOptions, OverwriteOptions):
    command: ClassVar[str] = "selection-map"
    about: ClassVar[str] = "which tokens of a long prompt each layer of a plan updates"
    description: ClassVar[str] = """\
`orthorank selection-map`: which tokens of a long prompt each layer of a plan updates, with the instruction,
the needle(s) and the question marked. Writes DIR/selection-map.json and one PNG per map; `orthorank analyze
--selection-map DIR/selection-map.json` puts them in the analysis report.

    orthorank selection-map --method orthorank --sparsity 0.2 --prompts needle:2k,longbench:multi_news --out DIR
    orthorank selection-map --plan PLAN.json --policies orthogonal,orthogonal+recent=64 --out DIR
"""
    examples: ClassVar[bool] = True

    method: str = flag("--method", default="orthorank",
                       choices=("orthorank", "orthorank-nominal", "orthorank-speed", "hybrid"), group="plan",
                       help="orthorank: at --layers; a searched method: its saved plan at --sparsity (default "
                            "%(default)s)")
    prompts: str = flag("--prompts", default="needle:2k,longbench:multi_news",
                        help="comma-separated: needle:LENGTH[:INDEX] (the long-context suite's niah_single sample), "
                             "longbench:TASK[:INDEX] (without INDEX: the first example that fits --max-tokens "
                             "untruncated; default %(default)s)")
    max_tokens: int = flag("--max-tokens", default=2048, type=positive_int,
                           help="longest LongBench prompt taken (default %(default)s)")
    policies: str | None = flag("--policies", default=None, metavar="SPECS",
                                help="one map per policy variant on the plan's layers: NAME[+recent=W][+first=W], "
                                     "comma-separated (default: one map, the plan's own policy)")
    out: str = flag("--out", help="folder for selection-map.json and the figures")
