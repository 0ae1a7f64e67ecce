"""Options and steps shared by subcommands: model, plan, method and output flags."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from orthorank.harness.api.options import Options
from orthorank.errors import UserError
from orthorank.method.plan import Plan, parse_layers
from orthorank.method.plan_store import find_plan, sparsity_label
from orthorank.method.policies import parse_variant, parse_variants
from orthorank.method.kinds import get_kind, layer_list_kinds
from orthorank.method.registry import is_reference, saved
from orthorank.method.selection import SelectionConfig
from orthorank.models.catalog import SHIPPED, package_gguf, shipped_by_package
from orthorank.models.loading import SHAPES, LoadedModel, gguf_model_name, load_model, package_model_name
from orthorank.harness.peak_memory import start_meter
from orthorank.harness.results import record_kernel
from orthorank.harness.runtime.memory import check_fits
from orthorank.harness.store import ResultStore


def variants_without_decode(text: str, command: str, where: str) -> list[str]:
    """--policies of a command whose decode policy comes from elsewhere (longctx's --decode-modes) or that never
    decodes (selection-map): a +decode= modifier there would be dropped silently, so it is refused."""
    specs = parse_variants(text)
    for spec in specs:
        if "decode" in parse_variant(spec):
            raise UserError(f"--policies {spec!r}: {command} {where}; write the variant without +decode=")
    return specs


def store_from_options(opts: Options):
    return None if opts.no_store else ResultStore(opts.store, recompute_corrupt=opts.recompute_corrupt)


def selection_from_options(opts: Options, base: SelectionConfig | None = None) -> SelectionConfig:
    base = base or SelectionConfig()
    return SelectionConfig(
        ratio=opts.ratio if opts.ratio is not None else base.ratio,
        criterion=opts.criterion or base.criterion,
        source=opts.source or base.source,
        policy=opts.policy or base.policy,
        fitted=base.fitted,
        bypass_kv=base.bypass_kv and not opts.no_bypass_kv,
        decode=opts.decode or base.decode,
        seed=opts.seed,
        keep_recent=opts.keep_recent if opts.keep_recent is not None else base.keep_recent,
        keep_first=opts.keep_first if opts.keep_first is not None else base.keep_first,
    )


def setup_torch(opts: Options) -> None:
    if getattr(opts, "threads", None):
        torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)


def load_model_from_options(opts: Options) -> LoadedModel:
    plan = getattr(opts, "plan", None)
    if isinstance(plan, (str, Path)) and str(plan):
        Plan.load(plan)  # a missing or broken plan file is a one-line error before the model loads
    setup_torch(opts)
    lm = load_model(opts.model, device=opts.device, dtype=opts.dtype, seed=opts.seed,
                    num_layers=getattr(opts, "num_layers", None), max_memory=getattr(opts, "max_memory", None),
                    offload_dir=getattr(opts, "offload_dir", None))
    print(lm.description(), file=sys.stderr, flush=True)
    _use_sliding_kernel(lm, getattr(opts, "sliding_kernel", "model"))
    start_meter(lm.device)  # result files record the peak above the model from here on
    return lm


def sliding_kernel_choice(requested: str, device: torch.device) -> str:
    """auto: the blocked kernel on a CPU, where it was measured faster and exact (docs/design.md), the model's own
    elsewhere (a GPU's SDPA kernels already skip what a window masks)."""
    if requested == "auto":
        return "blocked" if torch.device(device).type == "cpu" else "model"
    return requested


def _use_sliding_kernel(lm: LoadedModel, requested: str) -> None:
    from orthorank.models.sliding_attention import kernel_name, use_blocked_sliding

    if sliding_kernel_choice(requested, lm.device) == "blocked":
        use_blocked_sliding(lm.model)
    name = kernel_name(lm.model)
    # a model with sliding-window layers: every result file says which kernel ran them
    record_kernel("sliding_window", None if name == "none" else name)
    if name != "none":
        print(f"sliding-window layers: {name} kernel", file=sys.stderr, flush=True)


def check_memory(lm: LoadedModel, batch: int, tokens: int, what: str, *, loss: bool = False,
                 new_tokens: int = 0, all_logits: bool | None = None) -> None:
    """Stop before a run whose batch x tokens would not fit in the memory available (harness/runtime/memory.py)."""
    check_fits(lm.model, batch, tokens, what=what, loss=loss, new_tokens=new_tokens, device=lm.device,
               all_logits=all_logits)


def _saved_plan(opts: Options, lm: LoadedModel, path) -> Plan:
    """A plan file checked against the loaded model, with any selection options of the command line applied."""
    plan = Plan.load(path)
    plan.check_model(lm.name, lm.signature())
    overrides = (opts.ratio, opts.criterion, opts.source, opts.policy, opts.decode, opts.keep_recent,
                 opts.keep_first)
    if plan.kind.per_layer and opts.ratio is not None:
        raise UserError(f"a {plan.method} plan sets each selection layer's ratio; --ratio does not apply to it")
    if plan.kind.selects and (any(v is not None for v in overrides) or opts.no_bypass_kv):
        plan.selection = selection_from_options(opts, plan.selection)
    return plan


def plan_from_options(opts: Options, lm: LoadedModel) -> Plan:
    """A plan from --plan FILE, or from --method/--layers/--ratio."""
    if opts.plan:
        return _saved_plan(opts, lm, opts.plan)
    if is_reference(opts.method):
        if opts.layers:
            raise UserError(f"--layers needs --method {' or '.join(layer_list_kinds())}")
        return Plan(opts.method, [], lm.name, lm.signature())
    if not opts.layers:
        raise UserError(f"--method {opts.method} needs --layers or --plan")
    layers = parse_layers(opts.layers, lm.num_layers)
    selection = selection_from_options(opts) if get_kind(opts.method).selects else None
    return Plan(opts.method, layers, lm.name, lm.signature(), selection=selection)


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


def saved_plan_path(opts: Options) -> Path | None:
    """For --method M --sparsity S: the saved plan file (in --plans-dir, else plans/<model>/), found and read before
    the model is loaded."""
    if opts.sparsity is None:
        return None
    if opts.plan:
        raise UserError("give either --plan or --method with --sparsity, not both")
    if opts.layers:
        raise UserError("--sparsity picks a saved plan; it does not combine with --layers")
    if is_reference(opts.method):
        raise UserError(f"--method {opts.method} takes no --sparsity")
    if opts.method not in saved():
        raise UserError("with --sparsity, name the searched method: " + ", ".join(saved()))
    return saved_plan_file(expected_model_name(opts.model), opts.method, opts.sparsity,
                           getattr(opts, "plans_dir", None))


def check_plan_options(opts: Options) -> None:
    """Plan options that cannot work, found before the model is loaded."""
    by_layers = opts.method in layer_list_kinds()
    if opts.sparsity is None and not is_reference(opts.method) and not opts.plan and not (opts.layers and by_layers):
        extra = " or --layers" if by_layers else ""
        raise UserError(f"--method {opts.method} needs --sparsity S (a saved plan), --plan FILE{extra}")


def plan_for(opts: Options, lm, saved: Path | None) -> Plan:
    """--plan FILE, --method M --sparsity S (saved plan), or --method/--layers as in other commands."""
    if saved is not None:
        return _saved_plan(opts, lm, saved)
    return plan_from_options(opts, lm)
