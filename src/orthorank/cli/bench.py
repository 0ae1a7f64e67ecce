"""`orthorank bench`: throughput of dense vs layer removal vs OrthoRank, side by side, with the cost model.

Modes: prefill (one forward over B x T tokens, logits for the last position only), decode (greedy steps after an
untimed prompt of T tokens, with the KV cache), layer (one decoder layer alone, dense vs selective, plus the
selection step alone). --mode, --batch-size and --seq-len take comma-separated lists; every combination is run on one
loaded model.
"""

from __future__ import annotations

import argparse
import os
import sys

from orthorank.api.bench import run
from orthorank.api.options import BenchOptions
from orthorank.cli.common import (
    add_model_args,
    add_output_args,
    add_selection_args,
    deprecated,
    finite_float,
    non_negative_int,
    positive_int,
)
from orthorank.errors import UserError
from orthorank.method.registry import benched


def _list(kind, text: str) -> list:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("empty list")
    return [kind(t) for t in items]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="throughput: dense vs layer removal vs OrthoRank (prefill, decode, layer)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--num-layers", type=positive_int, default=None,
                   help="shrink a random-weight shape (llama2-7b, llama3-8b, mistral-7b, ...) to this many layers "
                        "(default: the shape's own count)")
    p.add_argument("--methods", type=lambda t: _list(str, t), default=["dense", "spread-prune", "spread-orthorank"],
                   help=f"comma-separated, from {', '.join(benched())}: searched methods use their saved plan at "
                        "--sparsity (or --plan), spread-* spread their layers evenly (any shape; default "
                        "dense,spread-prune,spread-orthorank)")
    p.add_argument("--sparsity", type=finite_float, default=0.2,
                   help="target sparsity: picks the saved plans of searched methods and the layer count of spread-* "
                        "(default %(default)s)")
    p.add_argument("--plan", action="append", default=[],
                   help="plan file overriding the layers of its method (orthorank, prune or hybrid); may repeat (default: "
                        "none, the plans --methods and --sparsity pick)")
    p.add_argument("--mode", type=lambda t: _list(str, t), default=["prefill"],
                   help="prefill, decode, layer, or a comma-separated list (default prefill)")
    p.add_argument("--batch-size", dest="batch", type=lambda t: _list(positive_int, t), default=[1],
                   help="batch size, or a comma-separated list (default 1)")
    p.add_argument("--seq-len", type=lambda t: _list(positive_int, t), default=[1024],
                   help="tokens per row, or a comma-separated list (default 1024)")
    p.add_argument("--decode-batch-size", dest="decode_batch", type=lambda t: _list(positive_int, t), default=None,
                   help="decode mode's batch sizes, if other than --batch-size (default: those of --batch-size)")
    p.add_argument("--prompt-len", type=positive_int, default=None,
                   help="decode mode: untimed prompt tokens before the timed steps (default --seq-len)")
    p.add_argument("--new-tokens", type=positive_int, default=32, help="decode steps timed per run (default 32)")
    p.add_argument("--decode-impl", type=lambda t: _list(str, t), default=["eager"],
                   help="decode mode: eager (transformers' dynamic cache), static (a static cache), compile (a static "
                        "cache and the step compiled with torch.compile; each method decodes its own copy of the "
                        "model; eager static cache with one warning where compile cannot run), or a comma-separated "
                        "list, run one after another (default eager)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs per method first (default 1)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs per method (default 5)")
    p.add_argument("--cache", action="store_true", help="prefill: fill a KV cache, as generation does")
    p.add_argument("--fit-batch", action="store_true",
                   help="on CUDA out-of-memory, halve the batch and retry (the batch used is recorded)")
    p.add_argument("--layer-index", type=int, default=None, help="layer mode: which layer (default: the middle one)")
    p.add_argument("--profile", action="store_true", help="layer mode: print a profiler table per layer type")
    p.add_argument("--cost-table", default=None, metavar="FILE",
                   help="instead of the modes above, measure this device's cost table for hybrid plans and write it "
                        "to FILE: one dense decoder layer, a selective layer at each of --ratios, and the rest of the "
                        "model, at --batch-size x --seq-len (`orthorank calibrate --method hybrid` reads it; default: "
                        "none, run the modes)")
    p.add_argument("--ratios", default=None, help="cost table: selection ratios to measure (default 0.25,0.33,0.5)")
    p.add_argument("--cost-layers", default=None,
                   help="cost table: layers to time (comma-separated or 'all'; default the middle one, since "
                        "layers of one model have the same shape)")
    p.add_argument("--policies", default=None, metavar="SPECS",
                   help="add OrthoRank rows on the same layers with other selection or decode policies, timed side "
                        "by side: comma-separated NAME[+recent=W][+first=W][+decode=MODE], e.g. +decode=threshold "
                        "(default: none, the plan's own policy only)")
    add_selection_args(p)
    add_output_args(p)
    deprecated(p, "--batch-size", "--batch")
    deprecated(p, "--decode-batch-size", "--decode-batch")


def standalone(argv: list[str] | None = None) -> int:
    """`python -m orthorank.cli.bench ...`: the bench subcommand alone, without importing the other subcommands
    (whose optional dependencies a bare GPU machine may lack)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="orthorank")
    add_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv])
    try:
        return int(run(BenchOptions.from_namespace(args)) or 0)
    except UserError as exc:
        print(f"orthorank bench: error: {exc}", file=sys.stderr)
        return 2
