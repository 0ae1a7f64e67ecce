"""`orthorank compare`: dense vs layer pruning vs OrthoRank at compute-matched sparsity, with intervals, as tables,
JSON and a plot. Resumable through the result store; `torchrun --nproc-per-node N orthorank compare ...` splits the
windows and items across processes."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from orthorank import distributed as dist
from orthorank.cli.calibration_options import parse_sparsities
from orthorank.cli.common import (
    DATA_DIR_HELP, add_model_args, add_store_args, check_memory, expected_model_name, load_from_args,
    non_negative_int, positive_int, saved_plan_file, store_from_args,
)
from orthorank.errors import UserError, comma_items
from orthorank.evaluation.compare import (
    Row, ablation_plans, comparisons, dataset_stream, evaluate_rows, headrooms, measure_speedups, policy_plans,
    worst_domains,
)
from orthorank.evaluation.overlap import MAX_SHARED, shared_share
from orthorank.evaluation.zeroshot.convert import resolve_data_dir
from orthorank.evaluation.zeroshot.registry import check_task_files, resolve_tasks
from orthorank.evaluation.zeroshot.runner import require_lm_eval
from orthorank.evaluation.zeroshot.scoring import evaluate_zeroshot_rows, zeroshot_report
from orthorank.presentation.compare_tables import (
    comparison_table, frontier_points, headroom_table, markdown_table, plot_ppl, worst_domain_table,
)
from orthorank.evaluation.data import DATASETS, load_eval_part
from orthorank.evaluation.perplexity import make_windows
from orthorank.method.cost import Arch
from orthorank.method.plan import MATCH_RULES, Plan
from orthorank.method.plan_store import plan_file_method
from orthorank.method.policies import parse_variants
from orthorank.method.registry import METHODS as _REGISTRY
from orthorank.models.loading import check_context
from orthorank.presentation.frontier import plot_frontier
from orthorank.results import atomic_write_text, check_writable, write_json
from orthorank.search.calibration import calibration_set
from orthorank.store import model_fingerprint

# compare takes the compute-matched names; --match adds the nominal OrthoRank rows
# every method with saved plans (a search's, or a router fitted on them), compute-matched
METHODS = ("dense", *[n for n, m in _REGISTRY.items()
                      if m.layers == "plan" and m.plan_kind != "dense" and m.match == "compute"])


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
    p.set_defaults(func=run)


def _split(text: str, allowed, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise UserError(f"unknown {what} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
    return items


def _datasets(text: str) -> list[str]:
    """Domain names or text files (unknown names and missing files are refused when their text is read)."""
    items = comma_items(text)
    if not items:
        raise UserError(f"--datasets is empty; choose from {', '.join(DATASETS)} or give text files")
    return items


def calibration_overlap(tokenizer, rows: list[Row], windows: dict, data_dir,
                        stop_before: bool = False) -> tuple[list[dict], dict]:
    """Checks every plan's calibration windows against every dataset's evaluation windows (evaluation/overlap.py):
    the windows are rebuilt from the plan's recorded calibration (source, size, seed), and a dataset window that
    shares more than MAX_SHARED of its 16-token runs with them stops the run before any evaluation.
    stop_before=True (no --max-windows given): a dataset is evaluated on its windows before the first such window
    instead, as long as one is left. Returns (one record per plan and dataset, the windows to evaluate)."""
    built: dict[str, object] = {}
    shares = []  # (row, calibration, dataset, share per window)
    for row in rows:
        cal = row.plan.provenance.get("calibration") if row.plan.method != "dense" else None
        if not cal or "data" not in cal:
            continue
        key = json.dumps({k: cal.get(k) for k in ("data", "samples", "seq_len", "seed")}, sort_keys=True)
        if key not in built:
            try:
                built[key] = calibration_set(tokenizer, cal["data"], int(cal["samples"]), int(cal["seq_len"]),
                                             int(cal.get("seed", 0)), data_dir)
            except UserError as exc:
                raise UserError(f"cannot rebuild the calibration windows of {row.method}@{row.level:g} to check "
                                f"them against the evaluation windows: {exc}") from None
        cs = built[key]
        recorded = cal.get("windows_sha256")
        verified = recorded is None or recorded == cs.provenance["windows_sha256"]
        if not verified:
            raise UserError(f"the calibration windows of {row.method}@{row.level:g} ({cal['data']}) rebuild "
                            "differently from when the plan was made (data or tokenizer changed); cannot check them "
                            "against the evaluation windows")
        shares += [(row, cal, d, shared_share(w, cs.windows)) for d, w in windows.items()]
    if stop_before:
        cut = {}
        for row, cal, d, share in shares:
            hits = (share > MAX_SHARED).nonzero()[0]
            if hits.size and hits[0] > 0:
                cut[d] = min(cut.get(d, len(share)), int(hits[0]))
        windows = {d: w[:cut[d]] if d in cut else w for d, w in windows.items()}
        shares = [(row, cal, d, share[:cut[d]] if d in cut else share) for row, cal, d, share in shares]
    out = []
    for row, cal, d, share in shares:
        worst = int(share.argmax()) if share.size else 0
        entry = {"row": row.method, "level": row.level, "calibration": cal["data"], "dataset": d,
                 "max_shared": round(float(share.max()) if share.size else 0.0, 6), "window": worst,
                 "windows_checked": int(share.size)}
        out.append(entry)
        if entry["max_shared"] > MAX_SHARED:
            first = int((share > MAX_SHARED).nonzero()[0][0])
            hint = (f"evaluate the windows before it (--max-windows {first})" if first > 0
                    else "use a plan calibrated on other text")
            raise UserError(f"evaluation window {first} of {d} shares {100 * share[first]:.0f}% of its text "
                            f"with the calibration windows of {row.method}@{row.level:g} ({cal['data']}); "
                            f"{hint}")
    return out, windows


def _check_saved_plans(args, methods: list[str], sparsities: list[float]) -> None:
    """Every plan the rows need, found and read before the model loads."""
    model_name = expected_model_name(args.model)
    for method in methods:
        if method != "dense":
            for s in sparsities:
                saved_plan_file(model_name, plan_file_method(method, args.match), s, args.plans_dir)


def build_rows(lm, methods: list[str], sparsities: list[float], ablations: bool, match: str = "compute",
               ablation_levels: list[float] | None = None, plans_dir: str | None = None,
               policies: list[str] | None = None) -> list[Row]:
    rows: list[Row] = []
    for method in methods:
        if method == "dense":
            rows.append(Row("dense", 0.0, Plan("dense", [], lm.name, lm.signature())))
            continue
        label = plan_file_method(method, match)
        for s in sparsities:
            plan = Plan.load(saved_plan_file(lm.name, label, s, plans_dir, check=False))
            plan.check_model(lm.name, lm.signature())
            rows.append(Row(label, s, plan))
            if ablations and method == "orthorank" and (ablation_levels is None or s in ablation_levels):
                rows += [Row(name.replace("orthorank", label, 1), s, variant) for name, variant in ablation_plans(plan)]
            if policies and plan.selection_layers and (ablation_levels is None or s in ablation_levels):
                rows += [Row(f"{label} (policy {spec})", s, variant)
                         for spec, (_, variant) in zip(policies, policy_plans(plan, policies))]
    return rows


def run(args) -> int:
    methods = _split(args.methods, METHODS, "method")
    datasets = [] if args.no_ppl else _datasets(args.datasets)
    sparsities = parse_sparsities(args.sparsity)
    ablation_levels = parse_sparsities(args.ablation_levels) if args.ablation_levels else None
    policies = parse_variants(args.policies) if args.policies else None
    if policies and not any(m.startswith("orthorank") for m in methods):
        raise UserError("--policies varies OrthoRank rows: add orthorank to --methods")
    tasks: list[str] = []
    if args.zeroshot:
        require_lm_eval()
        tasks = resolve_tasks(args.tasks)
        check_task_files(tasks, resolve_data_dir(args.data_dir))
    elif args.no_ppl:
        raise UserError("--no-ppl leaves nothing to do without --zeroshot")
    if args.continuation and args.no_ppl:
        raise UserError("--continuation scores the perplexity windows: drop --no-ppl")
    out = Path(args.out)
    for name in ("compare.json", "compare.md", "compare.png"):
        check_writable(out / name, args.overwrite)
    parts = {d: load_eval_part(d, args.data_dir) for d in datasets}
    _check_saved_plans(args, methods, sparsities)
    dist.init(args.device)
    args.device = dist.local_device(args.device)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("compare needs a real model with a tokenizer")
    rows = build_rows(lm, methods, sparsities, args.ablations, args.match, ablation_levels, args.plans_dir,
                      policies)
    store = store_from_args(args)
    arch = Arch.from_config(lm.config, lm.num_layers)
    streams = {d: dataset_stream(lm.tokenizer, d, p.text, args.seq_len) for d, p in parts.items()}
    if args.skip_windows:
        for d, s in streams.items():
            if s.numel() < (args.skip_windows + 1) * args.seq_len:
                raise UserError(f"{d} has {s.numel() // args.seq_len} windows of {args.seq_len} tokens: nothing "
                                f"is left after --skip-windows {args.skip_windows}")
        streams = {d: s[args.skip_windows * args.seq_len:] for d, s in streams.items()}
    windows = {d: make_windows(s, args.seq_len, args.max_windows) for d, s in streams.items()}
    check_context(lm.model, args.seq_len)
    check_memory(lm, args.batch_size, args.seq_len, "compare", loss=True)
    say = print if dist.is_main() else (lambda *a, **k: None)
    whole = {d: int(w.shape[0]) for d, w in windows.items()}
    overlap, windows = calibration_overlap(lm.tokenizer, rows, windows, args.data_dir,
                                           stop_before=args.max_windows is None)
    stopped = {d: int(w.shape[0]) for d, w in windows.items() if w.shape[0] < whole[d]}
    for d, n in stopped.items():
        say(f"compare: {d}: the first {n} of its {whole[d]} windows, the ones before the plans' calibration text "
            "(--max-windows chooses)")

    fp = model_fingerprint(lm.model)
    start = time.perf_counter()
    if args.measure_speed:
        first = next(iter(windows.values()))[0] if windows else None
        if first is None:
            raise UserError("--measure-speed needs a perplexity dataset to time")
        measure_speedups(lm.model, [r for r in rows if r.method != "dense"], first, args.measure_speed)
        say(f"measured prefill speed-ups of 1 x {args.seq_len} tokens (median of {args.measure_speed} interleaved "
            "repeats): " + ", ".join(f"{r.method}@{r.level:g} {r.measured_speedup:.3f}x" for r in rows
                                     if r.measured_speedup is not None))
    evaluate_rows(lm.model, rows, windows, streams, store, args.batch_size, progress=True, fingerprint=fp,
                  continuation=args.continuation)
    zs = None
    if tasks:
        zs = evaluate_zeroshot_rows(lm, rows, tasks, args.limit, args.data_dir, store, args.zeroshot_batch_size,
                                    fingerprint=fp)
    seconds = time.perf_counter() - start
    if not dist.is_main():
        return 0

    n_windows = ", ".join(f"{d}: {w.shape[0]} x {args.seq_len}" for d, w in windows.items())
    comps = comparisons(rows)
    report = []
    if datasets:
        skip = args.skip_windows
        full = {d: skip + make_windows(s, args.seq_len).shape[0] for d, s in streams.items()}
        sliced = [d for d in datasets if windows[d].shape[0] < full[d]]
        scoring = ("Continuation perplexity: each window's second half decoded one token at a time through the KV "
                   "cache after a prefill of its first half (teacher forcing; the decode policy applies; \"decoded "
                   "tokens updated\": the share of decoded tokens the selection layers updated)"
                   if args.continuation else "Perplexity")
        caption = (f"{scoring} (lower is better), {lm.name}, {str(lm.model.dtype).removeprefix('torch.')}, windows "
                   f"{n_windows}" + (f" (a slice: {f'the windows after the first {skip} of' if skip else 'the first windows of'} {', '.join(f'{d} ({full[d]} in all)' for d in sliced)})"
                                     if sliced else " (every window)")
                   + ". 95% bootstrap intervals over windows. Sparsity: nominal = the paper's (n/L)(1-r); compute = "
                   f"share of the model's FLOPs skipped at {args.seq_len} tokens; measured = prefill speed-up.")
        report += [caption + "\n", markdown_table(rows, datasets, arch, args.seq_len)]
        if comps:
            report += ["", "Paired perplexity ratios on the same windows (row / reference; below 1 = the row is "
                       "better; ** = the 95% interval excludes 1)\n", comparison_table(comps, datasets)]
        worst = worst_domains(comps)
        if worst:
            report += ["", f"Worst-domain ratio against SLEB at the same level: the largest paired ratio over "
                       f"{', '.join(datasets)}, with the bootstrap interval of that maximum (each dataset's windows "
                       "resampled). Below 1 everywhere = better than SLEB on every dataset measured; ** = the "
                       "interval excludes 1.\n", worst_domain_table(worst)]
        room = headrooms(rows)
        if room:
            report += ["", "Headroom captured: (ppl_random - ppl_rule) / (ppl_random - ppl_oracle) on the same "
                       "windows, with a paired 95% bootstrap interval; 1 = as good as the oracle (which runs every "
                       "selection layer densely to choose: an upper bound, never a speed-up), 0 = no better than "
                       "random selection at the same layers and ratio.\n", headroom_table(room, datasets)]
        if any(r.sparsity(arch, args.seq_len).get("measured_at", "this run") != "this run" for r in rows):
            report.append("\n† measured when the plan was made (`calibrate --measure-speed`), not in this run.")
    payload = {"command": "compare", "model": lm.name, "datasets": datasets, "seq_len": args.seq_len,
               "scoring": "continuation" if args.continuation else "window",
               "windows": {d: int(w.shape[0]) for d, w in windows.items()}, "skip_windows": args.skip_windows,
               "seed": args.seed,
               "dtype": str(lm.model.dtype), "match": args.match, "world_size": dist.world_size(),
               "arch": dict(arch.__dict__),
               "rows": [r.to_dict(arch, args.seq_len) for r in rows], "comparisons": [c.to_dict() for c in comps],
               "plans": [r.plan.to_dict() for r in rows], "seconds": round(seconds, 1),
               "dataset_provenance": {d: p.provenance for d, p in parts.items()},
               "calibration_overlap": overlap, "stopped_before_calibration": stopped}
    if datasets:
        payload["worst_domain"] = [w.to_dict() for w in worst_domains(comps)]
        payload["headroom"] = [h.to_dict() for h in headrooms(rows)]
    if zs is not None:
        text, data = zeroshot_report(zs, rows, tasks, args.limit)
        report += ["", text]
        payload["zeroshot"] = data
    text = "\n".join(report)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "compare.md", text + "\n")
    write_json(out / "compare.json", payload, device=lm.device, overwrite=True)
    msg = f"\nwrote {out / 'compare.md'}, {out / 'compare.json'}"
    if datasets:
        plot = plot_ppl(rows, datasets, out / "compare.png", arch, args.seq_len)
        msg += f"; plot: {plot}"
        if args.measure_speed:  # perplexity against the speed-up measured in this run, every row a point
            frontier = plot_frontier(frontier_points(rows, datasets), datasets, out / "frontier.png",
                                     f"{lm.name}, windows of {args.seq_len} tokens")
            msg += f", {frontier}"
    print(msg + f"  ({seconds:.0f}s of evaluation, {dist.world_size()} process(es))")
    return 0
