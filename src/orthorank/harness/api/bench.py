"""`orthorank bench`: throughput of dense vs layer removal vs OrthoRank, side by side, with the cost model.

Modes: prefill (one forward over B x T tokens, logits for the last position only), decode (greedy steps after an
untimed prompt of T tokens, with the KV cache), layer (one decoder layer alone, dense vs selective, plus the
selection step alone). --mode, --batch-size and --seq-len take comma-separated lists; every combination is run on one
loaded model.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from orthorank.harness.api.calibration_options import check_calibration_source
from orthorank.harness.api.common import check_memory, load_model_from_options, selection_from_options
from orthorank.harness.api.options import BenchOptions
from orthorank.harness.reports.speed import format_run
from orthorank.harness.search.calibration import calibration_set
from orthorank.harness.speed.layer_mode import run_layer
from orthorank.harness.speed.phase_profile import format_phases
from orthorank.harness.speed.runner import MODES, RunSettings, run_methods
from orthorank.harness.speed.specs import method_specs
from orthorank.errors import UserError
from orthorank.method.cost import Arch
from orthorank.method.plan import Plan, check_sparsity, parse_layers
from orthorank.method.policies import parse_variant, parse_variants
from orthorank.method.registry import get_method
from orthorank.models.static_decode import IMPLS
from orthorank.harness.results import check_writable, write_json
from orthorank.harness.runtime.cost_table import DEFAULT_RATIOS, format_cost_table, measure_cost_table, parse_ratios
from orthorank.harness.runtime.costmodel import flop_layer_cost, kv_fraction, selective_layer_cost


def _check(opts: BenchOptions) -> None:
    check_sparsity(opts.sparsity)
    if opts.policies:
        parse_variants(opts.policies)
    bad = [m for m in opts.mode if m not in MODES]
    if bad:
        raise UserError(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")

    bad = [m for m in opts.decode_impl if m not in IMPLS]
    if bad:
        raise UserError(f"unknown --decode-impl {bad[0]!r}; choose from {', '.join(IMPLS)}")
    if opts.warmup < 0:
        raise UserError("--warmup must be 0 or more")



def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _oom_types() -> tuple[type[BaseException], ...]:
    return tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                             getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)


def run_cost_table(opts: BenchOptions) -> int:
    ratios = parse_ratios(opts.ratios if opts.ratios is not None else list(DEFAULT_RATIOS))
    if len(opts.batch) != 1 or len(opts.seq_len) != 1:
        raise UserError("--cost-table takes one --batch-size and one --seq-len")
    if opts.warmup < 0:
        raise UserError("--warmup must be 0 or more")
    if opts.json_out:
        raise UserError("--cost-table writes its own file; drop --json")
    check_writable(opts.cost_table, opts.overwrite)
    lm = load_model_from_options(opts)
    layers = None
    if opts.cost_layers is not None:
        layers = (list(range(lm.num_layers)) if opts.cost_layers.strip() == "all"
                  else parse_layers(opts.cost_layers, lm.num_layers))
    selection = selection_from_options(opts)
    print(f"cost table for {lm.name} ({lm.num_layers} layers, {next(lm.model.parameters()).dtype}, {lm.device}, "
          f"{torch.get_num_threads()} thread(s)): batch {opts.batch[0]} x {opts.seq_len[0]}, ratios "
          f"{', '.join(f'{r:g}' for r in ratios)}, {opts.warmup} warm-up + {opts.repeats} timed rounds")
    table = measure_cost_table(lm.model, lm.name, lm.signature(), lm.device, ratios, batch=opts.batch[0],
                               seq_len=opts.seq_len[0], warmup=opts.warmup, repeats=opts.repeats, layers=layers,
                               selection=selection, seed=opts.seed)
    path = table.save(opts.cost_table, overwrite=opts.overwrite, device=lm.device)
    print(format_cost_table(table))
    print(f"wrote {path}")
    return 0


def with_policy_variants(specs: list, text: str) -> list:
    """Each OrthoRank spec followed by one spec per policy variant on its layers (method/policies.parse_variant),
    named "<method> [<variant>]"; a variant that changes only the decode policy is marked decode_only (it would
    time the same prefill twice)."""
    variants = parse_variants(text)
    varied = [s.kind.selects and not s.kind.per_layer for s in specs]  # one keep ratio the variants can share
    if not any(varied):
        raise UserError("--policies varies OrthoRank rows: add orthorank (or spread-orthorank) to --methods")
    out = []
    for s, vary in zip(specs, varied):
        out.append(s)
        if vary:
            out += [dataclasses.replace(s, name=f"{s.name} [{v}]", decode_only=set(parse_variant(v)) == {"decode"},
                                        selection=dataclasses.replace(s.selection, **parse_variant(v)))
                    for v in variants]
    return out


def layer_target(opts: BenchOptions, plans: list, selection) -> tuple:
    """Layer mode's (selection, layer index): with a --plan that selects tokens, that plan's configuration of its
    selection layer (--layer-index, default its first), so a router plan's layer runs its fitted router; else the
    command line's selection at --layer-index (default: the middle layer)."""
    for path, plan in plans:
        layers = plan.selection_layers
        if not layers:
            continue
        index = min(layers) if opts.layer_index is None else opts.layer_index
        if index not in layers:
            raise UserError(f"--layer-index {index} is not a selection layer of {path} (its selection layers: "
                            f"{', '.join(map(str, sorted(layers)))})")
        return layers[index], index
    return selection, opts.layer_index


def _timed_run(opts: BenchOptions, lm, selection, specs: list, mode: str, T: int, requested: int,
               impl: str, target: tuple, prompts: torch.Tensor | None = None) -> dict:
    """One mode at one length and batch: every method timed side by side (with --fit-batch, an out-of-memory batch
    is halved and run again); the run's record, with the machine's load before and after."""
    seq_len = (opts.prompt_len or T) if mode == "decode" else T
    batch = requested
    while True:
        settings = RunSettings(mode, batch, seq_len, opts.new_tokens, opts.warmup, opts.repeats,
                               opts.cache, opts.seed, impl, prompts=prompts)
        print(f"{mode}: batch {batch} x {seq_len}" + (f", {opts.new_tokens} new tokens ({impl})"
                                                         if mode == "decode" else ""))
        load = _loadavg()
        try:
            if mode == "layer":
                record = run_layer(lm.model, target[0], settings, lm.device, target[1], opts.profile)
            else:
                record = run_methods(lm.model, [s for s in specs if mode == "decode" or not s.decode_only],
                                     settings, lm.device)
        except _oom_types() as exc:
            torch.cuda.empty_cache()
            if not opts.fit_batch or batch == 1:
                raise UserError(f"out of memory at batch {batch} x {seq_len}: "
                                f"{str(exc).splitlines()[0]} (try --fit-batch or a smaller batch)") from None
            print(f"  out of memory at batch {batch}; retrying with {batch // 2}")
            batch //= 2
            continue
        break
    if batch != requested:
        record["note"] = f"batch {requested} ran out of memory; {batch} is the largest that fitted"
    record["requested_batch"] = requested
    if load is not None:  # CPU timings depend on what else runs on the machine
        record["load_average"] = {"before": load, "after": _loadavg()}
    return record


def _print_profile(prof: dict) -> None:
    for name in ("dense_layer", "selective_layer"):
        if name in prof:
            print(f"--- profile: {name}\n{prof[name]}")
    for category, c in prof.get("categories", {}).items():
        share = "-" if c["selective_over_dense"] is None else f"x{c['selective_over_dense']:.3f}"
        print(f"  {category:24s} dense {c['dense_ms']:9.1f} ms  selective {c['selective_ms']:9.1f} ms  {share}")
    if "phases" in prof:
        print(format_phases(prof["phases"]))
    if "error" in prof:
        print(f"--- profile failed: {prof['error']}")


def _describe(lm, selection, specs: list, lengths: list[int]) -> None:
    """The model, the cost model's ideal selective layer and every method's layers, before the timings."""
    cfg = lm.config
    f_kv = kv_fraction(cfg)
    print(f"model {lm.name}: {lm.num_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads}/{getattr(cfg, 'num_key_value_heads', None)} heads, "
          f"{next(lm.model.parameters()).dtype}, {lm.device}; f_kv {f_kv:.3f}, ideal selective layer cost "
          f"{selective_layer_cost(f_kv, selection.ratio):.3f} by weights, "
          + ", ".join(f"{flop_layer_cost(cfg, T, selection.ratio):.3f} by FLOPs at {T} tokens" for T in lengths))
    for s in specs:
        print(f"  {s.name}: {s.kind.name}, {len(s.layers)} layers {s.layers} ({s.source})")


def _prompts(opts: BenchOptions, lm) -> torch.Tensor | None:
    """--prompt-text: one window of calibration text per row of the largest batch, as long as the longest prompt."""
    if not opts.prompt_text:
        return None
    if lm.tokenizer is None:
        raise UserError("--prompt-text needs a model with a tokenizer")
    rows = -(-max(max(opts.batch), max(opts.decode_batch or [1])) // 4) * 4  # a mix takes 4 domains' windows alike
    length = max((opts.prompt_len or T) for T in opts.seq_len)
    return calibration_set(lm.tokenizer, opts.prompt_text, rows, length, opts.seed, opts.data_dir).windows


def run(opts: BenchOptions) -> int:
    if opts.cost_table:
        return run_cost_table(opts)
    _check(opts)
    check_writable(opts.json_out, opts.overwrite)
    if opts.prompt_text:
        check_calibration_source(opts.prompt_text, opts.data_dir)
    plans = [(path, Plan.load(path)) for path in opts.plan]
    lm = load_model_from_options(opts)
    if not opts.fit_batch:  # with --fit-batch an out-of-memory batch is halved and retried instead
        check_memory(lm, max(opts.batch), max(opts.seq_len), "bench", all_logits=False)  # the last position's
    for path, plan in plans:
        plan.check_model(lm.name, lm.signature())
        if plan.kind.dense:
            raise UserError(f"plan file {path} is a dense plan; nothing to override")
        if not any(get_method(m).kind is plan.kind for m in opts.methods):
            raise UserError(f"plan file {path} is a {plan.method} plan, but --methods lists no {plan.method} method "
                            "for it to override")
    selection = selection_from_options(opts)
    prompts = _prompts(opts, lm)

    def specs_at(T: int) -> list:  # spread-orthorank matches compute at the length it runs at
        specs = method_specs(opts.methods, lm.num_layers, opts.sparsity, selection, plans, model_name=lm.name,
                             arch=Arch.from_config(lm.config, lm.num_layers), seq_len=T)
        return with_policy_variants(specs, opts.policies) if opts.policies else specs

    specs_by_len = {T: specs_at(T) for T in opts.seq_len}
    target = layer_target(opts, plans, selection)
    specs = specs_by_len[opts.seq_len[0]]
    cfg = lm.config
    dtype = next(lm.model.parameters()).dtype
    f_kv = kv_fraction(cfg)
    _describe(lm, selection, specs, opts.seq_len)

    runs: list[dict] = []

    def payload(done: bool) -> dict:
        return {
            "command": "bench",
            "complete": done,
            "model": lm.name,
            "num_layers": lm.num_layers,
            "config": {
                "model_type": cfg.model_type,
                "hidden_size": cfg.hidden_size,
                "intermediate_size": cfg.intermediate_size,
                "num_attention_heads": cfg.num_attention_heads,
                "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
                "vocab_size": cfg.vocab_size,
            },
            "dtype": str(dtype).replace("torch.", ""),
            "methods": opts.methods,
            "sparsity": opts.sparsity,
            "selection": selection.to_dict(),
            "f_kv": f_kv,
            "ideal_selective_layer_cost": selective_layer_cost(f_kv, selection.ratio),  # weights only
            "ideal_selective_layer_cost_flops": {str(T): flop_layer_cost(cfg, T, selection.ratio)
                                                 for T in opts.seq_len},
            "seed": opts.seed,
            "prompts": opts.prompt_text or "random tokens",
            "runs": runs,
        }

    for mode, T in [(m, T) for m in opts.mode for T in opts.seq_len]:
        batches = opts.decode_batch if mode == "decode" and opts.decode_batch else opts.batch
        impls = opts.decode_impl if mode == "decode" else ["eager"]
        for requested, impl in [(b, i) for i in impls for b in batches]:
            record = _timed_run(opts, lm, selection, specs_by_len[T], mode, T, requested, impl, target, prompts)
            runs.append(record)
            print(format_run(record))
            if mode == "layer" and record.get("profile"):
                _print_profile(record["profile"])
            if opts.json_out:  # rewritten after every run: a killed run keeps what finished
                write_json(opts.json_out, payload(False), device=lm.device, overwrite=True)

    if opts.json_out:
        path = write_json(opts.json_out, payload(True), device=lm.device, overwrite=True)
        print(f"wrote {path}")
    return 0

