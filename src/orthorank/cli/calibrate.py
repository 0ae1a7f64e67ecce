"""`orthorank calibrate`: choose the layers for a method at a sparsity on calibration text and write plans."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import torch

from orthorank import distributed as dist
from orthorank.cli.calibrate_hybrid import run_hybrid
from orthorank.runtime.costmodel import spread_layers
from orthorank.runtime.matching import match_speed, measured_speedups, with_ratio
from orthorank.search.checkpoint import Checkpoint
from orthorank.search.registry import get_search
from orthorank.method.registry import METHODS, searched
from orthorank.search.layer_search import StackRunner
from orthorank.search.calibration import (
    DEFAULT_CALIB_BATCH, DEFAULT_CALIB_DATA, DEFAULT_CALIB_SEQ_LEN, DEFAULT_CALIB_TOKENS, calibration_set,
)
from orthorank.search.racing import ALPHA
from orthorank.cli.calibration_options import (
    calibration_samples, check_calibration_source, match_rules, parse_sparsities, router_base, screen_batches,
    token_count,
)
from orthorank.cli.common import (
    DATA_DIR_HELP, add_model_args, add_selection_args, add_store_args, check_memory, deprecated, finite_float,
    load_from_args, positive_int, selection_from_args, store_from_args,
)
from orthorank.errors import UserError
from orthorank.models.loading import check_context
from orthorank.method.apply import restore_dense
from orthorank.method.cost import Arch, compute_sparsity, ratio_to_match
from orthorank.method.plan import DEFAULT_COST_SEQ_LEN, Plan, layers_for_sparsity
from orthorank.method.plan_store import plan_file_method, sparsity_label
from orthorank.results import check_writable

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="search the layers for a method at a sparsity; write plan files",
                       description="Greedy (orthorank, sleb) or one-shot (shortened-ppl, shortgpt) layer search "
                                   "on calibration text disjoint from the evaluation text.")
    add_model_args(p)
    p.add_argument("--method", required=True, choices=searched(),
                   help="orthorank-nominal is orthorank with --match nominal; hybrid needs --cost-table")
    p.add_argument("--sparsity", default=None, help="one value or a list, e.g. 0.1,0.2 (greedy runs once); for "
                   "hybrid: the predicted speed-up of removing ceil(s L) layers on the cost table (default: none; "
                   "every method needs it, hybrid needs it or --target-speedup)")
    p.add_argument("--target-speedup", default=None,
                   help="hybrid: predicted prefill speed-up(s) to reach, e.g. 1.1,1.25 (one search, one plan each; "
                        "default: none, --sparsity names the levels)")
    p.add_argument("--cost-table", default=None, metavar="FILE",
                   help="hybrid: this device's cost table, from `orthorank bench --cost-table FILE` (default: none; "
                        "--method hybrid needs it)")
    p.add_argument("--ratios", default=None,
                   help="hybrid: selection ratios the search may use (default: every ratio on the cost table)")
    add_selection_args(p)
    p.add_argument("--router", default=None, metavar="BANK",
                   help="with --policy router: a router bank (`orthorank fit-router --layers inner`) covering every "
                        "candidate layer; the plans found keep it, refit them on their own layers with fit-router "
                        "(default: none; --policy router needs it)")
    p.add_argument("--calib-data", default=DEFAULT_CALIB_DATA,
                   help="calibration text: a domain's held-out part (c4, wikitext2, news, code), mix (equal tokens "
                        "of c4, wikitext2, news and code) or mix:A+B, wikitext2-train (hub), or a text file "
                        "(default %(default)s: the source whose plans lose least on their worst evaluation domain, "
                        "docs/transfer.md)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--calib-samples", type=positive_int, default=None,
                   help="calibration windows of --seq-len (default: --calib-tokens / --seq-len)")
    p.add_argument("--calib-tokens", type=token_count, default=None,
                   help=f"calibration size in tokens, e.g. 8K or 32768 (sets --calib-samples to this / --seq-len; "
                        f"default {DEFAULT_CALIB_TOKENS // 1024}K)")
    p.add_argument("--seq-len", type=positive_int, default=DEFAULT_CALIB_SEQ_LEN,
                   help="calibration window length (default %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_CALIB_BATCH,
                   help="calibration windows per forward (default %(default)s)")
    p.add_argument("--match", default="compute", type=match_rules,
                   help="OrthoRank plans for a sparsity: compute (default: the fewest selection layers that reach "
                        "pruning's compute sparsity at --cost-seq-len, with the keep ratio raised until the two are "
                        "equal), speed (the same layers, keep ratio set so the measured prefill speed-up equals "
                        "pruning's on this machine) or nominal (the paper's round(s L / (1 - r)) layers); several "
                        "comma-separated")
    p.add_argument("--cost-seq-len", type=positive_int, default=DEFAULT_COST_SEQ_LEN,
                   help="sequence length at which compute sparsity is counted (the evaluation length; default "
                        "%(default)s)")
    p.add_argument("--screen-fraction", type=finite_float, default=None,
                   help="greedy searches race: every candidate is scored on this share of the calibration batches "
                        "first, those clearly worse than the leader (paired t-test per window) are dropped and the "
                        "rest see twice as many batches, until all are seen (default: the batches of the first "
                        "2K tokens; 1 = exhaustive)")
    p.add_argument("--exhaustive", action="store_true", help="score every candidate on every calibration batch")
    p.add_argument("--recheck", type=positive_int, default=1,
                   help="a race never drops the best N so far: they are always scored on every batch (default 1: "
                        "only the paired test drops candidates; each kept one costs a pass over every batch)")
    p.add_argument("--measure-speed", type=int, default=5, metavar="N",
                   help="time one prefill of --cost-seq-len tokens under each plan and dense, N interleaved repeats, "
                        "and record the measured speed-up in the plan (0: do not time; --match speed needs N >= 3; "
                        "default %(default)s)")
    add_store_args(p)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", metavar="DIR",
                     help="folder for <method>-<sparsity>.json, one per sparsity (required: --out or --json)")
    deprecated(p, "--out", "--out-dir")
    out.add_argument("--json", dest="json_out", metavar="FILE",
                     help="one plan file, for one sparsity (required: --out or --json)")
    deprecated(p, "--json", "-o", "--output")
    p.add_argument("--overwrite", action="store_true", help="replace existing plan files")
    p.set_defaults(func=run)


def run(args) -> int:
    if get_search(METHODS[args.method].search).per_layer:
        return run_hybrid(args)
    if args.sparsity is None:
        raise UserError(f"--method {args.method} needs --sparsity")
    if args.target_speedup is not None or args.cost_table is not None or args.ratios is not None:
        raise UserError("--target-speedup, --cost-table and --ratios belong to --method hybrid")
    method = METHODS[args.method]
    if method.match != "compute":  # orthorank-nominal / -speed: the search of orthorank under that rule
        args.match = [method.match]
    args.method = method.search
    search = get_search(method.search)
    sparsities = parse_sparsities(args.sparsity, search=True)
    if args.json_out and len(sparsities) > 1:
        raise UserError("--json takes one sparsity; use --out DIR for several")
    selection = selection_from_args(args, router_base(args))
    if search.plan_method == "orthorank" and selection.ratio >= 1.0:
        raise UserError("ratio 1.0 skips no work; choose a ratio below 1")
    rules = args.match if search.plan_method == "orthorank" else ["compute"]
    if "speed" in rules and args.measure_speed < 3:
        raise UserError("--match speed times the plans: give --measure-speed N with N >= 3")
    if args.measure_speed < 0:
        raise UserError(f"--measure-speed must be 0 or more, got {args.measure_speed}")
    jobs = [(rule, s) for rule in rules for s in sparsities]
    if args.json_out and len(jobs) > 1:
        raise UserError("--json takes one sparsity and one --match rule; use --out DIR for several")
    outputs = [Path(args.json_out)] if args.json_out else [
        Path(args.out) / f"{plan_file_method(args.method, rule)}-{sparsity_label(s)}.json" for rule, s in jobs]
    for path in outputs:
        check_writable(path, args.overwrite)
    samples = calibration_samples(args)
    check_calibration_source(args.calib_data, args.data_dir)
    dist.init(args.device)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("calibration needs a real model with a tokenizer")
    restore_dense(lm.model)
    L = lm.num_layers
    arch = Arch.from_config(lm.config, L)
    counts = [search.layer_count(s, L, selection.ratio, "nominal" if rule == "nominal" else "compute", arch,
                                 args.cost_seq_len, selection.rule.scoring_flops(arch.hidden)) for rule, s in jobs]
    calib = calibration_set(lm.tokenizer, args.calib_data, samples, args.seq_len, args.seed, args.data_dir)
    check_context(lm.model, args.seq_len)
    check_memory(lm, args.batch_size, args.seq_len, "calibrate", loss=True)
    runner = StackRunner(lm.model, calib.windows, args.batch_size)
    screen = screen_batches(args, len(runner.batches))
    say = print if dist.is_main() else (lambda *a, **k: None)
    greedy = search.greedy
    say(f"{args.method}: " + (f"{max(counts)} greedy steps" if greedy else "one-shot scores") + f" over {L} layers, "
        f"calibration {samples} x {args.seq_len} tokens from {args.calib_data} (seed {args.seed})"
        + ("" if not greedy else ", exhaustive" if screen is None else f", screening on {screen} of "
           f"{len(runner.batches)} batches and re-checking the contenders") + f", {dist.world_size()} process(es)")
    checkpoint = Checkpoint.open(store_from_args(args), runner, args.method,
                                 search.settings(selection, screen, args.recheck))
    try:
        result = search.run(runner, max(counts), selection, True, screen_batches=screen, recheck=args.recheck,
                            log=say, checkpoint=checkpoint)
    except KeyboardInterrupt:
        kept = checkpoint.resumed + checkpoint.written
        where = f"in {checkpoint.folder}" if checkpoint.folder is not None else "nowhere (--no-store)"
        print(f"orthorank calibrate: interrupted; {kept} finished {'step' if greedy else 'score'} entries kept "
              f"{where}; run the same command again to resume from there", file=sys.stderr)
        return 130
    say(f"{args.method}: search took {result.seconds:.1f}s ({result.evaluations} candidate evaluations; dense "
        f"calibration loss {result.dense_loss:.4f})" + (f"; resumed {checkpoint.resumed} stored step(s)"
                                                       if checkpoint.resumed else ""))
    if not dist.is_main():
        return 0
    plans = []
    for (rule, s), n in zip(jobs, counts):
        sel, matched = selection, None
        if search.plan_method == "orthorank" and rule == "compute":
            target = compute_sparsity(arch, args.cost_seq_len, "prune", layers_for_sparsity(s, L, "prune"))
            scoring = selection.rule.scoring_flops(arch.hidden)  # a router's FLOPs count
            ratio = ratio_to_match(arch, args.cost_seq_len, target, n, selection.ratio, scoring=scoring)
            sel = dataclasses.replace(selection, ratio=ratio)
            got = compute_sparsity(arch, args.cost_seq_len, "orthorank", n, ratio, scoring=scoring)
            matched = {"rule": "equal compute", "knob": "one keep ratio for every selection layer, raised from "
                       f"{selection.ratio:g} until the plan skips pruning's compute share",
                       "base_ratio": selection.ratio, "ratio": ratio, "target_compute": round(target, 6),
                       "compute": round(got, 6), "relative_error": round(abs(got - target) / target, 6)}
        plan = Plan(
            method=search.plan_method,
            layers=result.order[:n],
            model=lm.name,
            signature=lm.signature(),
            selection=sel if search.plan_method == "orthorank" else None,
            target_sparsity=s,
            arch=dict(arch.__dict__),
            provenance={
                "search": args.method,
                "reference": search.reference,
                "match": rule if search.plan_method == "orthorank" else "removed ceil(s L)",
                **({"matched": matched} if matched else {}),
                "cost_seq_len": args.cost_seq_len,
                "order": result.order[:n],
                "losses": [round(x, 6) for x in result.losses[:n]],
                "dense_loss": round(result.dense_loss, 6),
                "calibration": calib.provenance,
                "search_mode": "exhaustive" if screen is None else {"race": {"first_batches": screen,
                                                                             "keep": args.recheck, "alpha": ALPHA}},
                "search_seconds": round(result.seconds, 2),
                "search_resumed_steps": checkpoint.resumed,
                "search_device": f"{lm.device} x {dist.world_size()}, dtype {str(lm.model.dtype).removeprefix('torch.')}, "
                                 f"{torch.get_num_threads()} threads",
                "evaluations": result.evaluations,
            },
        )
        plans.append(plan)
    if args.measure_speed:
        _time_plans(lm, plans, jobs, counts, args, selection.ratio, say)
    for plan, (rule, s), n, path in zip(plans, jobs, counts, outputs):
        plan.save(path, overwrite=args.overwrite)
        m = plan.sparsity(seq_len=args.cost_seq_len)
        measured = plan.provenance.get("measured", {}).get("speedup")
        print(f"  sparsity {s:g} ({rule}): {n} layers {sorted(plan.layers)}"
              + (f" at ratio {plan.selection.ratio:.4f}" if plan.method == "orthorank" else "")
              + f" -> nominal {m['nominal']:.4f}, compute {m['compute']:.4f} at {args.cost_seq_len} tokens"
              + (f", measured prefill speed-up {measured:.3f}x" if measured else "") + f"; wrote {path}")
    return 0


def _time_plans(lm, plans: list[Plan], jobs, counts, args, base_ratio: float, say) -> None:
    """Measured prefill speed-up of every plan (and, for --match speed, the keep ratio that equals pruning's)."""
    T = min(args.cost_seq_len, int(getattr(lm.config, "max_position_embeddings", None) or args.cost_seq_len))
    gen = torch.Generator().manual_seed(args.seed)
    window = torch.randint(0, int(lm.config.vocab_size), (T,), generator=gen)
    about = {"seq_len": T, "dtype": str(lm.model.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
             "device": str(lm.device), "repeats": args.measure_speed}
    for plan, (rule, s), n in zip(plans, jobs, counts):
        if rule != "speed":
            continue
        removed = math.ceil(s * lm.num_layers - 1e-9)
        reference = Plan("prune", spread_layers(removed, lm.num_layers), lm.name, lm.signature())
        say(f"  matching the measured speed-up of removing {removed} layers at {s:g} ({T} tokens, "
            f"{args.measure_speed} repeats per probe)")
        found = match_speed(lm.model, lambda r, plan=plan: with_ratio(plan, r), reference, window,
                            base_ratio, args.measure_speed, log=say)
        plan.selection = dataclasses.replace(plan.selection, ratio=found["ratio"])
        if not found["within_noise"]:
            say(f"  warning: at {s:g} the closest keep ratio found, {found['ratio']:.4f}, gives "
                f"{found['speedup']['speedup']:.3f}x against pruning's {found['reference']['speedup']:.3f}x, more "
                f"apart than the timing noise ({found['noise']:.3f}); the plan records it as not matched")
        plan.provenance["matched"] = {
            "rule": "equal measured prefill speed-up", "knob": "one keep ratio for every selection layer",
            "base_ratio": base_ratio,
            "ratio": found["ratio"], "reference": f"removal of {removed} evenly spread layers",
            "reference_speedup": found["reference"]["speedup"], "speedup": found["speedup"]["speedup"],
            "difference": round(found["difference"], 4), "noise_iqr": found["noise"],
            "within_noise": found["within_noise"], "probes": found["probes"], **about}
    for plan, m in zip(plans, measured_speedups(lm.model, plans, window, args.measure_speed)):
        plan.provenance["measured"] = {**m, **about}
