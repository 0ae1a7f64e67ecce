"""`orthorank compare`: dense vs layer pruning vs OrthoRank at compute-matched sparsity, with intervals, as tables,
JSON and a plot. Resumable through the result store; `torchrun --nproc-per-node N orthorank compare ...` splits the
windows and items across processes."""

from __future__ import annotations

import argparse

from orthorank.api.compare import METHODS
from orthorank.cli.common import DATA_DIR_HELP, add_model_args, add_store_args, non_negative_int, positive_int
from orthorank.evaluation.data import DATASETS
from orthorank.method.plan import MATCH_RULES


# compare takes the compute-matched names; --match adds the nominal OrthoRank rows
# every method with saved plans (a search's, or a router fitted on them), compute-matched
def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="perplexity table of dense, layer pruning and OrthoRank at equal sparsity",
                       description="Evaluates the stored plans (plans/<model>/<method>-<sparsity>.json, made by "
                                   "`orthorank calibrate`) on the same windows, in one run, with bootstrap "
                                   "intervals and paired ratios. Finished windows are kept in the result store "
                                   "(--store), so an interrupted run resumes where it stopped.")
    add_model_args(p)
    p.add_argument("--methods", default="dense,sleb,shortened-ppl,shortgpt,orthorank",
                   help=f"comma-separated, from {', '.join(METHODS)} (default %(default)s)")
    p.add_argument("--sparsity", default="0.1,0.2", help="levels, comma-separated (default %(default)s)")
    p.add_argument("--datasets", default="wikitext2,c4",
                   help=f"comma-separated: domains {', '.join(DATASETS)}, or paths to UTF-8 text files (default "
                        "%(default)s)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--seq-len", type=positive_int, default=2048, help="tokens per window (default %(default)s)")
    p.add_argument("--max-windows", type=positive_int, default=None,
                   help="bound the windows per dataset (default: every window, stopping before the first one that "
                        "shares text with a plan's calibration windows)")
    p.add_argument("--skip-windows", type=non_negative_int, default=0,
                   help="start after this many windows of each dataset: a slice disjoint from one evaluated before "
                        "(for checking a choice made on the first windows; default %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="windows per forward (default %(default)s)")
    p.add_argument("--plans-dir", default=None,
                   help="folder of <method>-<sparsity>.json plans (default: plans/<model>/ here or in the repository)")
    p.add_argument("--match", choices=MATCH_RULES, default="compute",
                   help="which OrthoRank plans: compute-matched to pruning (default, orthorank-<s>.json), matched "
                        "to pruning's measured speed (orthorank-speed-<s>.json) or the paper's nominal rule "
                        "(orthorank-nominal-<s>.json)")
    p.add_argument("--ablations", action="store_true",
                   help="add OrthoRank with random/inverse selection, raw states and no K/V for bypassed tokens "
                        "(sink hidden, and sink visible)")
    p.add_argument("--ablation-levels", default=None,
                   help="levels that get ablation and policy rows (default: all)")
    p.add_argument("--policies", default=None, metavar="SPECS",
                   help="add OrthoRank rows with other selection policies on the same layers and ratio (equal "
                        "compute): comma-separated NAME[+recent=W][+first=W][+decode=MODE], e.g. norm,attention,oracle,"
                        "orthogonal+recent=64; with random and oracle, a headroom table (default: none)")
    p.add_argument("--measure-speed", type=non_negative_int, default=0, metavar="N",
                   help="also time one prefill window per row, N interleaved repeats, for the measured speed-up "
                        "(default %(default)s: no timing)")
    p.add_argument("--continuation", action="store_true",
                   help="score each window's second half decoded one token at a time through the KV cache after a "
                        "prefill of its first half, so decode policies count (add rows with --policies "
                        "+decode=threshold); default: whole windows in one forward, as the paper")
    p.add_argument("--no-ppl", action="store_true", help="skip perplexity (zero-shot only)")
    p.add_argument("--zeroshot", action="store_true", help="add zero-shot accuracy tables (harness tasks)")
    p.add_argument("--tasks", default="piqa,winogrande,hellaswag,arc_easy,arc_challenge",
                   help="zero-shot harness tasks, comma-separated (default %(default)s)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="zero-shot examples per task (default: every example)")
    p.add_argument("--zeroshot-batch-size", type=positive_int, default=16,
                   help="zero-shot rows per forward (default %(default)s)")
    add_store_args(p)
    p.add_argument("--out", default="results/compare", metavar="DIR",
                   help="folder for compare.json, compare.md, compare.png (default %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
