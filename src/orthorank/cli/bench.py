"""`orthorank bench`: throughput of dense vs layer removal vs OrthoRank, side by side, with the cost model.

Modes: prefill (one forward over B x T tokens, logits for the last position only), decode (greedy steps after an
untimed prompt of T tokens, with the KV cache), layer (one decoder layer alone, dense vs selective, plus the
selection step alone). --mode, --batch-size and --seq-len take comma-separated lists; every combination is run on one
loaded model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

from orthorank.method.policies import parse_variant, parse_variants
from orthorank.models.static_decode import IMPLS
from orthorank.runtime.cost_table import DEFAULT_RATIOS, format_cost_table, measure_cost_table, parse_ratios
from orthorank.runtime.costmodel import flop_layer_cost, kv_fraction, selective_layer_cost
from orthorank.bench.report import format_run
from orthorank.method.cost import Arch
from orthorank.method.registry import METHODS, get_method
from orthorank.bench.runner import MODES, RunSettings, method_specs, run_layer, run_methods
from orthorank.cli.common import (
    add_model_args, add_output_args, add_selection_args, check_memory, deprecated, finite_float, load_from_args,
    non_negative_int, positive_int, selection_from_args,
)
from orthorank.errors import UserError
from orthorank.method.plan import Plan, check_sparsity, parse_layers
from orthorank.results import check_writable, write_json


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
                   help=f"comma-separated, from {', '.join(METHODS)}: searched methods use their saved plan at "
                        "--sparsity (or --plan), spread-* spread their layers evenly (any shape; default "
                        "dense,spread-prune,spread-orthorank)")
    p.add_argument("--sparsity", type=finite_float, default=0.2,
                   help="target sparsity: picks the saved plans of searched methods and the layer count of spread-* "
                        "(default %(default)s)")
    p.add_argument("--plan", action="append", default=[],
                   help="plan file overriding the layers of its method (orthorank or prune); may repeat (default: "
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
    p.set_defaults(func=run)


def _check(args) -> None:
    check_sparsity(args.sparsity)
    if args.policies:
        parse_variants(args.policies)
    bad = [m for m in args.mode if m not in MODES]
    if bad:
        raise UserError(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")

    bad = [m for m in args.decode_impl if m not in IMPLS]
    if bad:
        raise UserError(f"unknown --decode-impl {bad[0]!r}; choose from {', '.join(IMPLS)}")
    if args.warmup < 0:
        raise UserError("--warmup must be 0 or more")
    for m in args.methods:
        if get_method(m).plan_kind == "hybrid" and get_method(m).layers != "spread":
            raise UserError("bench times dense, prune and orthorank plans, not hybrid ones; for hybrid plans use "
                            "`bench --cost-table` (predicted) or `compare --measure-speed` (measured)")


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _oom_types() -> tuple[type[BaseException], ...]:
    return tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                             getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)


def run_cost_table(args) -> int:
    ratios = parse_ratios(args.ratios if args.ratios is not None else list(DEFAULT_RATIOS))
    if len(args.batch) != 1 or len(args.seq_len) != 1:
        raise UserError("--cost-table takes one --batch-size and one --seq-len")
    if args.warmup < 0:
        raise UserError("--warmup must be 0 or more")
    if args.json_out:
        raise UserError("--cost-table writes its own file; drop --json")
    check_writable(args.cost_table, args.overwrite)
    lm = load_from_args(args)
    layers = None
    if args.cost_layers is not None:
        layers = (list(range(lm.num_layers)) if args.cost_layers.strip() == "all"
                  else parse_layers(args.cost_layers, lm.num_layers))
    selection = selection_from_args(args)
    print(f"cost table for {lm.name} ({lm.num_layers} layers, {next(lm.model.parameters()).dtype}, {lm.device}, "
          f"{torch.get_num_threads()} thread(s)): batch {args.batch[0]} x {args.seq_len[0]}, ratios "
          f"{', '.join(f'{r:g}' for r in ratios)}, {args.warmup} warm-up + {args.repeats} timed rounds")
    table = measure_cost_table(lm.model, lm.name, lm.signature(), lm.device, ratios, batch=args.batch[0],
                               seq_len=args.seq_len[0], warmup=args.warmup, repeats=args.repeats, layers=layers,
                               selection=selection, seed=args.seed)
    path = table.save(args.cost_table, overwrite=args.overwrite, device=lm.device)
    print(format_cost_table(table))
    print(f"wrote {path}")
    return 0


def with_policy_variants(specs: list, text: str) -> list:
    """Each OrthoRank spec followed by one spec per policy variant on its layers (method/policies.parse_variant),
    named "<method> [<variant>]"; a variant that changes only the decode policy is marked decode_only (it would
    time the same prefill twice)."""
    variants = parse_variants(text)
    if not any(s.kind == "orthorank" for s in specs):
        raise UserError("--policies varies OrthoRank rows: add orthorank (or spread-orthorank) to --methods")
    out = []
    for s in specs:
        out.append(s)
        if s.kind == "orthorank":
            out += [dataclasses.replace(s, name=f"{s.name} [{v}]", decode_only=set(parse_variant(v)) == {"decode"},
                                        selection=dataclasses.replace(s.selection, **parse_variant(v)))
                    for v in variants]
    return out


def run(args) -> int:
    if args.cost_table:
        return run_cost_table(args)
    _check(args)
    check_writable(args.json_out, args.overwrite)
    plans = [(path, Plan.load(path)) for path in args.plan]
    lm = load_from_args(args)
    if not args.fit_batch:  # with --fit-batch an out-of-memory batch is halved and retried instead
        check_memory(lm, max(args.batch), max(args.seq_len), "bench", all_logits=False)  # the last position's
    for path, plan in plans:
        plan.check_model(lm.name, lm.signature())
        if plan.method == "dense":
            raise UserError(f"plan file {path} is a dense plan; nothing to override")
        if plan.method == "hybrid":
            raise UserError(f"plan file {path} is a hybrid plan; bench times dense, prune and orthorank plans "
                            "(predict a hybrid plan's speed-up from `bench --cost-table`, or time it with "
                            "`compare --measure-speed`)")
    selection = selection_from_args(args)
    def specs_at(T: int) -> list:  # spread-orthorank matches compute at the length it runs at
        specs = method_specs(args.methods, lm.num_layers, args.sparsity, selection, plans, model_name=lm.name,
                             arch=Arch.from_config(lm.config, lm.num_layers), seq_len=T)
        return with_policy_variants(specs, args.policies) if args.policies else specs

    specs_by_len = {T: specs_at(T) for T in args.seq_len}
    specs = specs_by_len[args.seq_len[0]]
    cfg = lm.config
    dtype = next(lm.model.parameters()).dtype
    f_kv = kv_fraction(cfg)
    print(f"model {lm.name}: {lm.num_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads}/{getattr(cfg, 'num_key_value_heads', None)} heads, {dtype}, {lm.device}; "
          f"f_kv {f_kv:.3f}, ideal selective layer cost {selective_layer_cost(f_kv, selection.ratio):.3f} by "
          f"weights, " + ", ".join(f"{flop_layer_cost(cfg, T, selection.ratio):.3f} by FLOPs at {T} tokens"
                                   for T in args.seq_len))
    for s in specs:
        print(f"  {s.name}: {s.kind}, {len(s.layers)} layers {s.layers} ({s.source})")

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
            "methods": args.methods,
            "sparsity": args.sparsity,
            "selection": selection.to_dict(),
            "f_kv": f_kv,
            "ideal_selective_layer_cost": selective_layer_cost(f_kv, selection.ratio),  # weights only
            "ideal_selective_layer_cost_flops": {str(T): flop_layer_cost(cfg, T, selection.ratio)
                                                 for T in args.seq_len},
            "seed": args.seed,
            "runs": runs,
        }

    for mode, T in [(m, T) for m in args.mode for T in args.seq_len]:
        batches = args.decode_batch if mode == "decode" and args.decode_batch else args.batch
        seq_len = (args.prompt_len or T) if mode == "decode" else T
        impls = args.decode_impl if mode == "decode" else ["eager"]
        for requested, impl in [(b, i) for i in impls for b in batches]:
            batch = requested
            while True:
                settings = RunSettings(mode, batch, seq_len, args.new_tokens, args.warmup, args.repeats,
                                       args.cache, args.seed, impl)
                print(f"{mode}: batch {batch} x {seq_len}" + (f", {args.new_tokens} new tokens ({impl})"
                                                                 if mode == "decode" else ""))
                load = _loadavg()
                try:
                    if mode == "layer":
                        record = run_layer(lm.model, selection, settings, lm.device, args.layer_index, args.profile)
                    else:
                        record = run_methods(lm.model, [s for s in specs_by_len[T] if mode == "decode"
                                                        or not s.decode_only], settings, lm.device)
                except _oom_types() as exc:
                    torch.cuda.empty_cache()
                    if not args.fit_batch or batch == 1:
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
            runs.append(record)
            print(format_run(record))
            if mode == "layer" and record.get("profile"):
                prof = record["profile"]
                for name in ("dense_layer", "selective_layer"):
                    if name in prof:
                        print(f"--- profile: {name}\n{prof[name]}")
                for category, c in prof.get("categories", {}).items():
                    share = "-" if c["selective_over_dense"] is None else f"x{c['selective_over_dense']:.3f}"
                    print(f"  {category:24s} dense {c['dense_ms']:9.1f} ms  selective {c['selective_ms']:9.1f} ms  "
                          f"{share}")
                if "error" in prof:
                    print(f"--- profile failed: {prof['error']}")
            if args.json_out:  # rewritten after every run: a killed run keeps what finished
                write_json(args.json_out, payload(False), device=lm.device, overwrite=True)

    if args.json_out:
        path = write_json(args.json_out, payload(True), device=lm.device, overwrite=True)
        print(f"wrote {path}")
    return 0


def standalone(argv: list[str] | None = None) -> int:
    """`python -m orthorank.cli.bench ...`: the bench subcommand alone, without importing the other subcommands
    (whose optional dependencies a bare GPU machine may lack)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="orthorank")
    add_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv])
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"orthorank bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(standalone())
