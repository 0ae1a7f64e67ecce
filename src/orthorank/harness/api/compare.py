"""`orthorank compare`: dense vs layer pruning vs OrthoRank at compute-matched sparsity, with intervals, as tables,
JSON and a plot. Resumable through the result store; `torchrun --nproc-per-node N orthorank compare ...` splits the
windows and items across processes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import json
import time
from pathlib import Path

from orthorank.harness import distributed as dist
from orthorank.harness.api.calibration_options import parse_sparsities
from orthorank.harness.api.common import (
    check_memory,
    expected_model_name,
    load_model_from_options,
    saved_plan_file,
    store_from_options,
)
from orthorank.harness.api.options import CompareOptions
from orthorank.errors import UserError, comma_items
from orthorank.harness.evaluation.compare import (
    Row,
    ablation_plans,
    comparisons,
    dataset_stream,
    evaluate_rows,
    headrooms,
    measure_speedups,
    policy_plans,
    worst_domains,
)
from orthorank.harness.evaluation.data import DATASETS, load_eval_part
from orthorank.harness.evaluation.overlap import MAX_SHARED, shared_share
from orthorank.harness.evaluation.perplexity import make_windows
from orthorank.harness.evaluation.zeroshot.convert import resolve_data_dir
from orthorank.harness.evaluation.zeroshot.registry import check_task_files, resolve_tasks
from orthorank.harness.evaluation.zeroshot.runner import require_lm_eval
from orthorank.harness.evaluation.zeroshot.scoring import evaluate_zeroshot_rows, zeroshot_report
from orthorank.method.cost import Arch
from orthorank.method.plan import Plan
from orthorank.method.plan_store import plan_file_method
from orthorank.method.policies import parse_variants
from orthorank.method.registry import compared, get_method, is_reference
from orthorank.models.loading import check_context
from orthorank.harness.reports.compare_tables import (
    comparison_table,
    frontier_points,
    headroom_table,
    markdown_table,
    plot_ppl,
    worst_domain_table,
)
from orthorank.harness.reports.frontier import plot_frontier
from orthorank.harness.results import atomic_write_text, check_writable, write_json
from orthorank.harness.search.calibration import calibration_set
from orthorank.harness.store import model_fingerprint

METHODS = ("dense", *compared())  # compute-matched names; --match adds the nominal and speed-matched OrthoRank rows


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
    """Checks every plan's calibration windows against every dataset's evaluation windows (harness/evaluation/overlap.py):
    the windows are rebuilt from the plan's recorded calibration (source, size, seed), and a dataset window that
    shares more than MAX_SHARED of its 16-token runs with them stops the run before any evaluation.
    stop_before=True (no --max-windows given): a dataset is evaluated on its windows before the first such window
    instead, as long as one is left. Returns (one record per plan and dataset, the windows to evaluate)."""
    built: dict[str, object] = {}
    shares = []  # (row, calibration, dataset, share per window)
    for row in rows:
        cal = row.plan.provenance.get("calibration") if not row.plan.kind.dense else None
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


def _check_saved_plans(opts: CompareOptions, methods: list[str], sparsities: list[float]) -> None:
    """Every plan the rows need, found and read before the model loads."""
    model_name = expected_model_name(opts.model)
    for method in methods:
        if not is_reference(method):
            for s in sparsities:
                saved_plan_file(model_name, plan_file_method(method, opts.match), s, opts.plans_dir)


def build_rows(lm, methods: list[str], sparsities: list[float], ablations: bool, match: str = "compute",
               ablation_levels: list[float] | None = None, plans_dir: str | None = None,
               policies: list[str] | None = None) -> list[Row]:
    rows: list[Row] = []
    for method in methods:
        if is_reference(method):
            rows.append(Row("dense", 0.0, Plan("dense", [], lm.name, lm.signature())))
            continue
        label = plan_file_method(method, match)
        for s in sparsities:
            plan = Plan.load(saved_plan_file(lm.name, label, s, plans_dir, check=False))
            plan.check_model(lm.name, lm.signature())
            rows.append(Row(label, s, plan))
            if ablations and get_method(method).ablations and (ablation_levels is None or s in ablation_levels):
                rows += [Row(name.replace("orthorank", label, 1), s, variant) for name, variant in ablation_plans(plan)]
            if policies and plan.selection_layers and (ablation_levels is None or s in ablation_levels):
                rows += [Row(f"{label} (policy {spec})", s, variant)
                         for spec, (_, variant) in zip(policies, policy_plans(plan, policies))]
    return rows


@dataclass
class _Request:
    """What compare was asked for, checked before any model loads."""
    methods: list[str]
    datasets: list[str]
    sparsities: list[float]
    ablation_levels: list[float] | None
    policies: list[str] | None
    tasks: list[str]


def _checked_request(opts: CompareOptions) -> _Request:
    methods = _split(opts.methods, METHODS, "method")
    datasets = [] if opts.no_ppl else _datasets(opts.datasets)
    sparsities = parse_sparsities(opts.sparsity)
    ablation_levels = parse_sparsities(opts.ablation_levels) if opts.ablation_levels else None
    policies = parse_variants(opts.policies) if opts.policies else None
    if policies and not any(m.startswith("orthorank") for m in methods):
        raise UserError("--policies varies OrthoRank rows: add orthorank to --methods")
    tasks: list[str] = []
    if opts.zeroshot:
        require_lm_eval()
        tasks = resolve_tasks(opts.tasks)
        check_task_files(tasks, resolve_data_dir(opts.data_dir))
    elif opts.no_ppl:
        raise UserError("--no-ppl leaves nothing to do without --zeroshot")
    if opts.continuation and opts.no_ppl:
        raise UserError("--continuation scores the perplexity windows: drop --no-ppl")
    for name in ("compare.json", "compare.md", "compare.png"):
        check_writable(Path(opts.out) / name, opts.overwrite)
    _check_saved_plans(opts, methods, sparsities)
    return _Request(methods, datasets, sparsities, ablation_levels, policies, tasks)


def _token_windows(opts: CompareOptions, lm, parts: dict) -> tuple[dict, dict]:
    """Each domain's token stream after --skip-windows, and its windows (at most --max-windows)."""
    streams = {d: dataset_stream(lm.tokenizer, d, p.text, opts.seq_len) for d, p in parts.items()}
    if opts.skip_windows:
        for d, s in streams.items():
            if s.numel() < (opts.skip_windows + 1) * opts.seq_len:
                raise UserError(f"{d} has {s.numel() // opts.seq_len} windows of {opts.seq_len} tokens: nothing "
                                f"is left after --skip-windows {opts.skip_windows}")
        streams = {d: s[opts.skip_windows * opts.seq_len:] for d, s in streams.items()}
    return streams, {d: make_windows(s, opts.seq_len, opts.max_windows) for d, s in streams.items()}


def _perplexity_report(opts: CompareOptions, lm, rows: list[Row], comps, datasets: list[str], windows: dict,
                       streams: dict, arch: Arch) -> list[str]:
    """The perplexity tables in Markdown: rows, paired ratios, worst domains and headroom, with their caption."""
    n_windows = ", ".join(f"{d}: {w.shape[0]} x {opts.seq_len}" for d, w in windows.items())
    skip = opts.skip_windows
    full = {d: skip + make_windows(s, opts.seq_len).shape[0] for d, s in streams.items()}
    sliced = [d for d in datasets if windows[d].shape[0] < full[d]]
    scoring = ("Continuation perplexity: each window's second half decoded one token at a time through the KV "
               "cache after a prefill of its first half (teacher forcing; the decode policy applies; \"decoded "
               "tokens updated\": the share of decoded tokens the selection layers updated)"
               if opts.continuation else "Perplexity")
    caption = (f"{scoring} (lower is better), {lm.name}, {str(lm.model.dtype).removeprefix('torch.')}, windows "
               f"{n_windows}" + (f" (a slice: {f'the windows after the first {skip} of' if skip else 'the first windows of'} {', '.join(f'{d} ({full[d]} in all)' for d in sliced)})"
                                 if sliced else " (every window)")
               + ". 95% bootstrap intervals over windows. Sparsity: nominal = the paper's (n/L)(1-r); compute = "
               f"share of the model's FLOPs skipped at {opts.seq_len} tokens; measured = prefill speed-up.")
    report = [caption + "\n", markdown_table(rows, datasets, arch, opts.seq_len)]
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
    if any(r.sparsity(arch, opts.seq_len).get("measured_at", "this run") != "this run" for r in rows):
        report.append("\n† measured when the plan was made (`calibrate --measure-speed`), not in this run.")
    return report


def run(opts: CompareOptions) -> int:
    req = _checked_request(opts)
    datasets, out = req.datasets, Path(opts.out)
    parts = {d: load_eval_part(d, opts.data_dir) for d in datasets}
    dist.init(opts.device)
    opts = dataclasses.replace(opts, device=dist.local_device(opts.device))  # the caller's options stay theirs
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError("compare needs a real model with a tokenizer")
    rows = build_rows(lm, req.methods, req.sparsities, opts.ablations, opts.match, req.ablation_levels,
                      opts.plans_dir, req.policies)
    store = store_from_options(opts)
    arch = Arch.from_config(lm.config, lm.num_layers)
    streams, windows = _token_windows(opts, lm, parts)
    check_context(lm.model, opts.seq_len)
    check_memory(lm, opts.batch_size, opts.seq_len, "compare", loss=True)
    say = print if dist.is_main() else (lambda *a, **k: None)
    whole = {d: int(w.shape[0]) for d, w in windows.items()}
    overlap, windows = calibration_overlap(lm.tokenizer, rows, windows, opts.data_dir,
                                           stop_before=opts.max_windows is None)
    stopped = {d: int(w.shape[0]) for d, w in windows.items() if w.shape[0] < whole[d]}
    for d, n in stopped.items():
        say(f"compare: {d}: the first {n} of its {whole[d]} windows, the ones before the plans' calibration text "
            "(--max-windows chooses)")

    fp = model_fingerprint(lm.model)
    start = time.perf_counter()
    if opts.measure_speed:
        first = next(iter(windows.values()))[0] if windows else None
        if first is None:
            raise UserError("--measure-speed needs a perplexity dataset to time")
        measure_speedups(lm.model, [r for r in rows if not is_reference(r.method)], first, opts.measure_speed)
        say(f"measured prefill speed-ups of 1 x {opts.seq_len} tokens (median of {opts.measure_speed} interleaved "
            "repeats): " + ", ".join(f"{r.method}@{r.level:g} {r.measured_speedup:.3f}x" for r in rows
                                     if r.measured_speedup is not None))
    evaluate_rows(lm.model, rows, windows, streams, store, opts.batch_size, progress=True, fingerprint=fp,
                  continuation=opts.continuation)
    zs = None
    if req.tasks:
        zs = evaluate_zeroshot_rows(lm, rows, req.tasks, opts.limit, opts.data_dir, store, opts.zeroshot_batch_size,
                                    fingerprint=fp)
    seconds = time.perf_counter() - start
    if not dist.is_main():
        return 0

    comps = comparisons(rows)
    report = _perplexity_report(opts, lm, rows, comps, datasets, windows, streams, arch) if datasets else []
    payload = {"command": "compare", "model": lm.name, "datasets": datasets, "seq_len": opts.seq_len,
               "scoring": "continuation" if opts.continuation else "window",
               "windows": {d: int(w.shape[0]) for d, w in windows.items()}, "skip_windows": opts.skip_windows,
               "seed": opts.seed,
               "dtype": str(lm.model.dtype), "match": opts.match, "world_size": dist.world_size(),
               "arch": dict(arch.__dict__),
               "rows": [r.to_dict(arch, opts.seq_len) for r in rows], "comparisons": [c.to_dict() for c in comps],
               "plans": [r.plan.to_dict() for r in rows], "seconds": round(seconds, 1),
               "dataset_provenance": {d: p.provenance for d, p in parts.items()},
               "calibration_overlap": overlap, "stopped_before_calibration": stopped}
    if datasets:
        payload["worst_domain"] = [w.to_dict() for w in worst_domains(comps)]
        payload["headroom"] = [h.to_dict() for h in headrooms(rows)]
    if zs is not None:
        text, data = zeroshot_report(zs, rows, req.tasks, opts.limit)
        report += ["", text]
        payload["zeroshot"] = data
    text = "\n".join(report)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "compare.md", text + "\n")
    write_json(out / "compare.json", payload, device=lm.device, overwrite=True)
    msg = f"\nwrote {out / 'compare.md'}, {out / 'compare.json'}"
    if datasets:
        plot = plot_ppl(rows, datasets, out / "compare.png", arch, opts.seq_len)
        msg += f"; plot: {plot}"
        if opts.measure_speed:  # perplexity against the speed-up measured in this run, every row a point
            frontier = plot_frontier(frontier_points(rows, datasets), datasets, out / "frontier.png",
                                     f"{lm.name}, windows of {opts.seq_len} tokens")
            msg += f", {frontier}"
    print(msg + f"  ({seconds:.0f}s of evaluation, {dist.world_size()} process(es))")
    return 0
