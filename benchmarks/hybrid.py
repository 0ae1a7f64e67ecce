"""Hybrid plans against SLEB and OrthoRank at equal speed-up on the embedded model (issue 12, item 4).

    .venv/bin/python benchmarks/hybrid.py targets            # predicted speed-ups of the committed plans
    .venv/bin/python benchmarks/hybrid.py evaluate           # speed-ups measured, perplexities, table, frontier

`targets` reads the cost table (benchmarks/results/hybrid-smollm2-135m/cost-table.json, from `orthorank bench
--cost-table`) and prints the predicted prefill speed-up of each committed plan (plans/smollm2-135m/sleb-0.1,
sleb-0.2, orthorank-0.1, orthorank-0.2), rounded up to 3 decimals: the targets of the hybrid search
(benchmarks/hybrid.sh runs it). It writes targets.json beside the table.

`evaluate` takes dense, those four plans and the hybrid plan of each target (plans/smollm2-135m/hybrid-x<t>.json)
and
- measures the prefill speed-up of each over dense (1 x 2048 random tokens, decoder + LM head on the last
  position, bf16, interleaved rounds; kept in speed.json and reused unless --remeasure);
- evaluates perplexity on the first --max-windows windows of 2048 tokens of WikiText-2 and C4 through the result
  store (resumes; 95% bootstrap intervals over windows), and the paired ratio of each hybrid plan to the plan it
  matches in speed;
- writes hybrid.json, hybrid.md and frontier.png (perplexity against measured speed-up, every method).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/hybrid-smollm2-135m"
MODEL = "smollm2-135m"
MATCHED = ["sleb-0.1", "orthorank-0.1", "sleb-0.2", "orthorank-0.2"]
# the other committed plans: points of the frontier (every method), not matched by a hybrid search
OTHERS = ["shortened-ppl-0.1", "shortened-ppl-0.2", "shortgpt-0.1", "shortgpt-0.2",
          "orthorank-nominal-0.1", "orthorank-nominal-0.2"]


def ceil3(x: float) -> float:
    return math.ceil(x * 1000 - 1e-6) / 1000


def plan_path(name: str) -> Path:
    return ROOT / "plans" / MODEL / f"{name}.json"


def hybrid_name(target: float) -> str:
    return f"hybrid-x{target:g}"


def targets(args) -> int:
    from orthorank.bench.cost_table import CostTable
    from orthorank.method.plan import Plan

    table = CostTable.load(args.cost_table)
    out = {}
    for name in MATCHED:
        plan = Plan.load(plan_path(name))
        pred = table.plan_speedup(plan)
        out[name] = {"predicted_speedup": pred, "target": ceil3(pred), "hybrid_plan": hybrid_name(ceil3(pred))}
    (Path(args.out) / "targets.json").write_text(json.dumps(out, indent=2) + "\n")
    print(",".join(f"{t:g}" for t in sorted({v["target"] for v in out.values()})))
    return 0


def _ci(ci) -> str:
    return f"{ci.value:.2f} [{ci.low:.2f}, {ci.high:.2f}]"


def evaluate(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    from orthorank.analysis.frontier import FrontierPoint, plot_frontier
    from orthorank.bench.cost_table import CostTable, device_description, measure_plan_speedups
    from orthorank.evaluation.compare import Row, evaluate_rows
    from orthorank.evaluation.data import load_eval_text
    from orthorank.evaluation.perplexity import eval_stream, make_windows
    from orthorank.evaluation.stats import paired_perplexity_ratio
    from orthorank.method.cost import Arch
    from orthorank.method.plan import Plan
    from orthorank.models.loading import load_model
    from orthorank.results import environment
    from orthorank.store import ResultStore, model_fingerprint

    out = Path(args.out)
    table = CostTable.load(args.cost_table)
    matched = json.loads((out / "targets.json").read_text())
    lm = load_model(MODEL, device="cpu", dtype="bfloat16")
    table.check_model(lm.name, lm.signature())
    if not args.ppl_only:  # perplexity does not depend on the threads the timings were taken with
        table.check_device(device_description(lm.device))
    arch = Arch.from_config(lm.config, lm.num_layers)
    plans: dict[str, Plan] = {"dense": Plan("dense", [], lm.name, lm.signature())}
    for name in MATCHED:
        plans[name] = Plan.load(plan_path(name))
    missing = []
    for name in MATCHED:
        h = matched[name]["hybrid_plan"]
        if plan_path(h).is_file():
            plans.setdefault(h, Plan.load(plan_path(h)))
        else:
            missing.append(h)
    for name in OTHERS:
        if plan_path(name).is_file():
            plans[name] = Plan.load(plan_path(name))
    if missing:
        print(f"note: no hybrid plan yet for {', '.join(sorted(set(missing)))} (run benchmarks/hybrid.sh)")
    for p in plans.values():
        p.check_model(lm.name, lm.signature())

    if args.ppl_only:  # fill the result store only (e.g. while a search runs); no timing, no tables
        datasets, seq = ["wikitext2", "c4"], 2048
        streams = {d: eval_stream(lm.tokenizer, d, load_eval_text(d), seq) for d in datasets}
        windows = {d: make_windows(s, seq, args.max_windows) for d, s in streams.items()}
        evaluate_rows(lm.model, [Row(n, 0.0, p) for n, p in plans.items()], windows, streams, ResultStore(args.store),
                      1, progress=True, fingerprint=model_fingerprint(lm.model))
        return 0

    # -- measured speed-ups (cached by plan content) ------------------------------------------------------------
    speed_file = out / "speed.json"
    speed = json.loads(speed_file.read_text()) if speed_file.is_file() and not args.remeasure else None
    hashes = {n: p.content_hash() for n, p in plans.items()}
    if speed is None or any(speed.get("hashes", {}).get(n) != h for n, h in hashes.items()) \
            or speed.get("device") != device_description(lm.device):
        print(f"measuring prefill speed-ups: {len(plans)} plans, {args.repeats} rounds")
        speed = measure_plan_speedups(lm.model, plans, lm.device, batch=1, seq_len=2048, repeats=args.repeats,
                                      warmup=1)
        speed["hashes"] = hashes
        speed_file.write_text(json.dumps(speed, indent=2) + "\n")

    # -- perplexity through the store ----------------------------------------------------------------------------
    datasets = ["wikitext2", "c4"]
    seq = 2048
    streams = {d: eval_stream(lm.tokenizer, d, load_eval_text(d), seq) for d in datasets}
    windows = {d: make_windows(s, seq, args.max_windows) for d, s in streams.items()}
    full = {d: make_windows(s, seq).shape[0] for d, s in streams.items()}
    rows = [Row(n, 0.0, p) for n, p in plans.items()]
    if not args.no_ppl:
        evaluate_rows(lm.model, rows, windows, streams, ResultStore(args.store), 1, progress=True,
                      fingerprint=model_fingerprint(lm.model))
    by = {r.method: r for r in rows}

    def kind(name: str) -> str:
        if name == "dense":
            return "dense"
        return name.rsplit("-", 1)[0] if name.startswith("orthorank-nominal") else name.split("-")[0]

    def describe(p: Plan) -> tuple[str, str]:
        removed = ",".join(map(str, p.removed_layers)) or "-"
        sel = p.selection_layers
        if not sel:
            return removed, "-"
        ratios = sorted({c.ratio for c in sel.values()})
        if len(ratios) == 1:
            return removed, f"{','.join(map(str, sel))} @ {ratios[0]:g}"
        return removed, " ".join(f"{i}@{c.ratio:g}" for i, c in sel.items())

    head = ["plan", "removed layers", "selection layers @ ratio", "predicted speed-up (cost table)",
            "measured speed-up [per-round range]", "compute sparsity",
            *[f"{d} ppl [95% CI]" for d in datasets]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    order = ["dense"] + [n for pair in [(m, matched[m]["hybrid_plan"]) for m in MATCHED] for n in pair] + OTHERS
    seen, names = set(), []
    for n in order:
        if n in plans and n not in seen:
            seen.add(n)
            names.append(n)
    rows_json, points = [], []
    for n in names:
        p, r, sp = plans[n], by[n], speed["plans"][n]
        pred = table.plan_speedup(p)
        removed, sel = describe(p)
        rng = (sp["speedup_per_round"]["min"], sp["speedup_per_round"]["max"])
        cells = [n, removed, sel, f"{pred:.3f}x", f"{sp['speedup']:.3f}x [{rng[0]:.3f}, {rng[1]:.3f}]",
                 f"{p.compute_sparsity(arch, seq):.3f}",
                 *[_ci(r.interval(d)) if d in r.nll else "-" for d in datasets]]
        lines.append("| " + " | ".join(cells) + " |")
        ppl = {d: (r.interval(d).value, r.interval(d).low, r.interval(d).high) for d in datasets if d in r.nll}
        points.append(FrontierPoint(kind(n), n.replace("hybrid-x", "x") if kind(n) == "hybrid" else n.split("-")[-1]
                                    if n != "dense" else "dense", sp["speedup"], rng, pred, ppl))
        rows_json.append({"plan": n, "method": p.method, "actions": p.to_dict().get("actions"),
                          "layers": p.layers, "predicted_speedup": pred, "measured": sp,
                          "compute_sparsity": p.compute_sparsity(arch, seq),
                          **{d: {"perplexity": ppl[d][0], "ci95": [ppl[d][1], ppl[d][2]],
                                 "window_nll": [round(float(v), 6) for v in r.nll[d]]} for d in ppl}})
    pair_lines = ["| plan A | vs plan B | predicted speed-up (A / B) | measured speed-up (A / B) | "
                  + " | ".join(f"{d} ppl ratio [95% CI]" for d in datasets) + " |",
                  "|---|---|---|---|" + "|".join("---" for _ in datasets) + "|"]
    pairs_json = []
    # Each hybrid plan against the plan it targets, then the comparisons across methods at (nearly) equal measured
    # speed-up: OrthoRank against SLEB at each level (the paper's claim), each hybrid plan against the other method.
    comparisons = [(matched[m]["hybrid_plan"], m) for m in MATCHED]
    for level in ("0.1", "0.2"):
        o, s_ = f"orthorank-{level}", f"sleb-{level}"
        comparisons += [(o, s_), (matched[o]["hybrid_plan"], s_), (matched[s_]["hybrid_plan"], o)]
    for h, m in comparisons:
        if h not in plans or m not in plans:
            continue
        cells = [h, m, f"{table.plan_speedup(plans[h]):.3f} / {table.plan_speedup(plans[m]):.3f}",
                 f"{speed['plans'][h]['speedup']:.3f} / {speed['plans'][m]['speedup']:.3f}"]
        entry = {"plan": h, "vs": m}
        for d in datasets:
            if d in by[h].nll and d in by[m].nll:
                ci = paired_perplexity_ratio(by[h].nll[d], by[m].nll[d], by[h].tokens[d])
                text = f"{ci.value:.3f} [{ci.low:.3f}, {ci.high:.3f}]"
                cells.append(f"**{text}**" if ci.excludes(1.0) else text)
                entry[d] = {"ratio": ci.value, "ci95": [ci.low, ci.high]}
            else:
                cells.append("-")
        pair_lines.append("| " + " | ".join(cells) + " |")
        pairs_json.append(entry)

    n_w = ", ".join(f"{d}: {windows[d].shape[0]} of {full[d]}" for d in datasets)
    caption = (f"Hybrid plans vs SLEB and OrthoRank at equal predicted speed-up, {MODEL}, bfloat16, 1 x 2048 tokens. "
               f"Perplexity on the first windows of 2048 tokens ({n_w}; a slice where fewer than all), 95% bootstrap "
               f"intervals over windows. Predicted speed-up: from the cost table measured on this CPU "
               f"({table.device.get('name')}, {table.device.get('threads')} thread, {table.dtype}, "
               f"{table.batch} x {table.seq_len}). Measured: prefill (decoder + LM head on the last position) of "
               f"1 x 2048 random tokens, median of {speed['repeats']} interleaved rounds over dense's median; the "
               f"range is that of the per-round paired speed-ups (load average during the timing "
               f"{speed['load_average']['before']} -> {speed['load_average']['after']}, a shared 2-core machine).")
    text = "\n".join([caption, "", *lines, "",
                      "Paired perplexity ratios on the same windows (A / B; below 1 = A is better; ** = the 95% "
                      "interval excludes 1): first each hybrid plan against the plan whose predicted speed-up it "
                      "targets, then OrthoRank against SLEB and each hybrid plan against the other method at the same "
                      "level (measured speed-ups side by side)", "", *pair_lines])
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hybrid.md").write_text(text + "\n")
    payload = {"model": MODEL, "dtype": "bfloat16", "seq_len": seq,
               "windows": {d: int(windows[d].shape[0]) for d in datasets}, "full_windows": full,
               "cost_table": {"path": str(Path(args.cost_table).relative_to(ROOT) if Path(args.cost_table).is_absolute()
                                          else args.cost_table), **table.to_dict()["costs"], "device": table.device},
               "targets": matched, "rows": rows_json, "pairs": pairs_json, "speed": speed,
               "plans": {n: p.to_dict() for n, p in plans.items()}, "environment": environment(lm.device)}
    (out / "hybrid.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    if not args.no_ppl:
        plot = plot_frontier(points, datasets, out / "frontier.png",
                             f"perplexity vs measured speed-up ({', '.join(f'{windows[d].shape[0]} windows' for d in datasets[:1])})")
        print(f"wrote {out / 'hybrid.md'}, {out / 'hybrid.json'}, {plot}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["targets", "evaluate"])
    p.add_argument("--cost-table", default=str(OUT / "cost-table.json"))
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--store", default=str(ROOT / "benchmarks/results/store"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-windows", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds of the speed measurement")
    p.add_argument("--remeasure", action="store_true", help="time the plans again even if speed.json holds them")
    p.add_argument("--no-ppl", action="store_true", help="speed-ups only")
    p.add_argument("--ppl-only", action="store_true", help="perplexities into the store only (no timing, no tables)")
    args = p.parse_args()
    from orthorank.errors import UserError

    try:
        return targets(args) if args.step == "targets" else evaluate(args)
    except UserError as exc:
        print(f"hybrid.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
