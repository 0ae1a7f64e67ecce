"""Options and steps shared by subcommands: model, plan, method and output flags."""

from __future__ import annotations

import argparse
import math
import sys

from orthorank.errors import UserError
from orthorank.method.policies import DECODE_MODES, get_policy
from orthorank.method.selection import CRITERIA, ORDERS, SOURCES
from orthorank.models.loading import EMBEDDED_MODEL


def policy_name(text: str) -> str:
    """--policy is checked as it is parsed, before a command reads any data or model."""
    try:
        return get_policy(text).name
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _int_at_least(text: str, low: int, words: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {words}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "0 or more")


DATA_DIR_HELP = ("data folder laid out like ../shared/data (default: $ORTHORANK_DATA_DIR, else ../shared/data or "
                 "shared/data from here or from the repository)")


class _DeprecatedAlias(argparse.Action):
    """An old spelling of another option: one line on stderr, then exactly what the new spelling does."""

    def __init__(self, option_strings, dest, target: argparse.Action | None = None, new: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.target, self.new = target, new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"orthorank: {option_string} is deprecated; use {self.new}", file=sys.stderr, flush=True)
        self.target(parser, namespace, values, option_string)


def deprecated(parser: argparse.ArgumentParser, new: str, *old: str) -> None:
    """Keep the `old` spellings of the option `new` working for one release: same value, same destination, hidden
    from --help, and one line on stderr naming the new spelling. An old spelling joins the mutually exclusive group
    of the new one, so a required group is satisfied by either."""
    target = parser._option_string_actions[new]
    container = next((g for g in parser._mutually_exclusive_groups if target in g._group_actions), parser)
    container.add_argument(*old, dest=target.dest, action=_DeprecatedAlias, target=target, new=new,
                           nargs=target.nargs, const=target.const, type=target.type, choices=target.choices,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=EMBEDDED_MODEL,
                   help=f"{EMBEDDED_MODEL} (embedded default), gemma3-270m, a .gguf file, an installed model package, "
                        "a local HF folder, a hub id, or a random-weight shape name")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="auto",
                   help="auto, float32 or bfloat16 (default auto: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for torch (default: torch's own choice, all cores)")
    p.add_argument("--max-memory", default=None,
                   help="spread the model with accelerate: device=size pairs, e.g. cuda=10GiB,cpu=30GiB (the rest "
                        "goes to --offload-dir); under torchrun each process gets this budget on its own GPU "
                        "(default: the whole model on --device)")
    p.add_argument("--offload-dir", default=None,
                   help="folder for weights offloaded to disk under --max-memory (default: none; a model that "
                        "needs disk offload then stops with an error)")
    p.add_argument("--sliding-kernel", choices=("model", "blocked"), default="model",
                   help="sliding-window layers' prefill: the model's own attention (transformers' SDPA over every key "
                        "with a band mask) or the exact blocked kernel that reads only the window's keys "
                        "(models/sliding_attention.py; dense and every plan alike) (default %(default)s)")


def add_selection_args(p: argparse.ArgumentParser) -> None:
    """Selection options; each left out keeps the saved plan's own setting, else the paper's (SelectionConfig)."""
    p.add_argument("--ratio", type=finite_float, default=None, help="share of tokens a selection layer updates "
                   "(default: a saved plan's own, else 0.33)")
    p.add_argument("--criterion", choices=CRITERIA, default=None,
                   help="|<x_sink,x_i>| (dot) or |cos| (default: a saved plan's own, else dot)")
    p.add_argument("--source", choices=SOURCES, default=None,
                   help="score normalized (normed) or raw states (default: a saved plan's own, else normed)")
    p.add_argument("--policy", "--order", dest="policy", type=policy_name, default=None, metavar="NAME",
                   help=f"which tokens a selection layer updates: {', '.join(ORDERS)} (default: a saved plan's "
                        "own, else orthogonal, the paper's; random and inverse are its ablations; oracle runs the "
                        "layer densely: an upper bound, never a speed-up)")
    p.add_argument("--keep-recent", type=int, default=None, metavar="W",
                   help="always update the last W real tokens (within the K updated; default: a saved plan's own, "
                        "else 0, off)")
    p.add_argument("--keep-first", type=int, default=None, metavar="W",
                   help="always update the first W real tokens after the sink (within the K updated; default: a "
                        "saved plan's own, else 0, off)")
    p.add_argument("--no-bypass-kv", action="store_true", help="ablation: bypassed tokens give no K/V")
    p.add_argument("--decode", choices=DECODE_MODES, default=None,
                   help="behaviour when decoding one token (default: a saved plan's own, else dense: every new "
                        "token is updated)")


def add_plan_args(p: argparse.ArgumentParser, methods=("dense", "orthorank", "prune"),
                  saved: bool = False) -> None:
    default = "dense" if "dense" in methods else methods[0]
    kinds = (["dense: the model unchanged"] if "dense" in methods else []) + [
        f"{m}: at --layers" for m in ("prune", "orthorank") if m in methods]
    if saved:
        kinds.append("a searched method: its saved plan at --sparsity")
    p.add_argument("--method", choices=methods, default=default,
                   help="; ".join(kinds) + " (default %(default)s)")
    p.add_argument("--layers", default=None,
                   help="comma-separated layer indices, e.g. 3,5,7 (default: none; --method orthorank or prune "
                        "needs them" + (", --sparsity" if saved else "") + " or --plan)")
    p.add_argument("--plan", default=None,
                   help="JSON plan file from `orthorank calibrate` (default: none; the plan comes from --method"
                        + (" and --sparsity or --layers)" if saved else " and --layers)"))
    if saved:
        p.add_argument("--sparsity", type=finite_float, default=None,
                       help="use the saved plan <method>-<S>.json of --method in --plans-dir (from `orthorank "
                            "calibrate`; default: none, --layers or --plan give the plan)")
        p.add_argument("--plans-dir", default=None,
                       help="folder of <method>-<sparsity>.json plans for --sparsity (default: plans/<model>/ here "
                            "or in the repository)")
    add_selection_args(p)


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", dest="json_out", default=None, metavar="FILE",
                   help="write the JSON result to FILE (default: none, the result is only printed)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")


def add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default="results/store",
                   help="result store folder: finished windows and items are kept here and reused (default "
                        "%(default)s)")
    p.add_argument("--no-store", action="store_true", help="compute everything, keep nothing")
    p.add_argument("--recompute-corrupt", action="store_true",
                   help="set aside corrupt store entries and recompute them (default: stop with an error)")
