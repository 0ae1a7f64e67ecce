"""Options and steps shared by subcommands: model, plan, method and output flags."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from orthorank.errors import UserError
from orthorank.method.plan import Plan, parse_layers
from orthorank.method.plan_store import find_plan, sparsity_label
from orthorank.method.policies import DECODE_MODES, get_policy, parse_variant, parse_variants
from orthorank.method.selection import CRITERIA, ORDERS, SOURCES, SelectionConfig
from orthorank.method.registry import saved
from orthorank.models.catalog import SHIPPED, package_gguf, shipped_by_package
from orthorank.models.loading import (
    EMBEDDED_MODEL, SHAPES, LoadedModel, gguf_model_name, load_model, package_model_name,
)
from orthorank.peak_memory import start_meter
from orthorank.runtime.memory import check_fits
from orthorank.store import ResultStore


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


def variants_without_decode(text: str, command: str, where: str) -> list[str]:
    """--policies of a command whose decode policy comes from elsewhere (longctx's --decode-modes) or that never
    decodes (selection-map): a +decode= modifier there would be dropped silently, so it is refused."""
    specs = parse_variants(text)
    for spec in specs:
        if "decode" in parse_variant(spec):
            raise UserError(f"--policies {spec!r}: {command} {where}; write the variant without +decode=")
    return specs


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


def store_from_args(args):
    return None if args.no_store else ResultStore(args.store, recompute_corrupt=args.recompute_corrupt)


def selection_from_args(args, base: SelectionConfig | None = None) -> SelectionConfig:
    base = base or SelectionConfig()
    return SelectionConfig(
        ratio=args.ratio if args.ratio is not None else base.ratio,
        criterion=args.criterion or base.criterion,
        source=args.source or base.source,
        policy=args.policy or base.policy,
        fitted=base.fitted,
        bypass_kv=base.bypass_kv and not args.no_bypass_kv,
        decode=args.decode or base.decode,
        seed=args.seed,
        keep_recent=args.keep_recent if args.keep_recent is not None else base.keep_recent,
        keep_first=args.keep_first if args.keep_first is not None else base.keep_first,
    )


def setup_torch(args) -> None:
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)


def load_from_args(args) -> LoadedModel:
    plan = getattr(args, "plan", None)
    if isinstance(plan, (str, Path)) and str(plan):
        Plan.load(plan)  # a missing or broken plan file is a one-line error before the model loads
    setup_torch(args)
    lm = load_model(args.model, device=args.device, dtype=args.dtype, seed=args.seed,
                    num_layers=getattr(args, "num_layers", None), max_memory=getattr(args, "max_memory", None),
                    offload_dir=getattr(args, "offload_dir", None))
    print(lm.description(), file=sys.stderr, flush=True)
    start_meter(lm.device)  # result files record the peak above the model from here on
    return lm


def check_memory(lm: LoadedModel, batch: int, tokens: int, what: str, *, loss: bool = False,
                 new_tokens: int = 0, all_logits: bool | None = None) -> None:
    """Stop before a run whose batch x tokens would not fit in the memory available (runtime/memory.py)."""
    check_fits(lm.model, batch, tokens, what=what, loss=loss, new_tokens=new_tokens, device=lm.device,
               all_logits=all_logits)


def _saved_plan(args, lm: LoadedModel, path) -> Plan:
    """A plan file checked against the loaded model, with any selection options of the command line applied."""
    plan = Plan.load(path)
    plan.check_model(lm.name, lm.signature())
    overrides = (args.ratio, args.criterion, args.source, args.policy, args.decode, args.keep_recent,
                 args.keep_first)
    if plan.method == "hybrid" and args.ratio is not None:
        raise UserError("a hybrid plan sets each selection layer's ratio; --ratio does not apply to it")
    if plan.method in ("orthorank", "hybrid") and (any(v is not None for v in overrides) or args.no_bypass_kv):
        plan.selection = selection_from_args(args, plan.selection)
    return plan


def plan_from_args(args, lm: LoadedModel) -> Plan:
    """A plan from --plan FILE, or from --method/--layers/--ratio."""
    if args.plan:
        return _saved_plan(args, lm, args.plan)
    if args.method == "dense":
        if args.layers:
            raise UserError("--layers needs --method orthorank or prune")
        return Plan("dense", [], lm.name, lm.signature())
    if not args.layers:
        raise UserError(f"--method {args.method} needs --layers or --plan")
    layers = parse_layers(args.layers, lm.num_layers)
    selection = selection_from_args(args) if args.method == "orthorank" else None
    return Plan(args.method, layers, lm.name, lm.signature(), selection=selection)


# -- saved plans by method and sparsity (ppl, zeroshot, generate, selection-map, compare, longctx) -------------------


def expected_model_name(spec: str) -> str:
    """The name load_model will give `spec` (what plans record), known before loading it."""
    if spec in SHIPPED:
        return spec
    if spec.lower().endswith(".gguf"):
        return gguf_model_name(spec)
    by_package = shipped_by_package(spec)
    if by_package is not None:
        return by_package.name
    if Path(spec).is_dir():
        return Path(spec).resolve().name

    if spec in SHAPES or "/" in spec or Path(spec).exists():
        return spec
    # An installed package: its normalized name, without assembling a chunked one (loading does that).
    return package_model_name(spec) if package_gguf(spec, assemble=False) is not None else spec


def saved_plan_file(model_name: str, label: str, sparsity: float, plans_dir: str | Path | None = None,
                    check: bool = True) -> Path:
    """The saved plan <label>-<sparsity>.json: in plans_dir when given, else under plans/<model>/ (find_plan). With
    check, the file is read too, so a missing or broken plan is a one-line error before any model loads."""
    if plans_dir is None:
        path = find_plan(model_name, label, sparsity)
    else:
        path = Path(plans_dir) / f"{label}-{sparsity_label(sparsity)}.json"
        if not path.is_file():
            raise UserError(f"no {label} plan at sparsity {sparsity_label(sparsity)} in {plans_dir} (looked for "
                            f"{path}); run `orthorank calibrate --out {plans_dir}` first")
    if check:
        Plan.load(path)
    return path


def saved_plan_path(args) -> Path | None:
    """For --method M --sparsity S: the saved plan file (in --plans-dir, else plans/<model>/), found and read before
    the model is loaded."""
    if args.sparsity is None:
        return None
    if args.plan:
        raise UserError("give either --plan or --method with --sparsity, not both")
    if args.layers:
        raise UserError("--sparsity picks a saved plan; it does not combine with --layers")
    if args.method == "dense":
        raise UserError("--method dense takes no --sparsity")
    if args.method == "prune":
        raise UserError("with --sparsity, name the searched method: " + ", ".join(saved()))
    return saved_plan_file(expected_model_name(args.model), args.method, args.sparsity,
                           getattr(args, "plans_dir", None))


def check_plan_args(args) -> None:
    """Plan options that cannot work, found before the model is loaded."""
    if args.sparsity is None and args.method != "dense" and not args.plan and not (
            args.layers and args.method in ("orthorank", "prune")):
        extra = " or --layers" if args.method in ("orthorank", "prune") else ""
        raise UserError(f"--method {args.method} needs --sparsity S (a saved plan), --plan FILE{extra}")


def plan_for(args, lm, saved: Path | None) -> Plan:
    """--plan FILE, --method M --sparsity S (saved plan), or --method/--layers as in other commands."""
    if saved is not None:
        return _saved_plan(args, lm, saved)
    return plan_from_args(args, lm)
