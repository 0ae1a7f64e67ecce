"""Text and Markdown tables from bench records (`python -m orthorank.harness.reports.speed FILE.json ...`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _f(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _attention_lines(run: dict[str, Any], ms: dict[str, float]) -> list[str]:
    a = run.get("attention_alone")
    if not a:
        return []
    return [f"  attention alone: causal (dense) {ms['attention_causal']:.2f} ms ({100 * a['causal_share_of_dense_layer']:.0f}% "
            f"of the dense layer); selected queries ({a['query_fraction']:.3f} of them): masked "
            f"{a['masked_fraction_of_causal']:.3f} of causal, prefix/diagonal split {a['split_fraction_of_causal']:.3f}"
            f" (in use: {a.get('in_use', 'masked')})"]

def paired_ratio(num: list[float], den: list[float], iters: int = 2000) -> tuple[float, float, float]:
    """Median of the paired ratios num_i / den_i with a bootstrap 95% interval over the pairs."""
    import numpy as np  # lazily: the text tables above need no numpy

    from orthorank.harness.evaluation.stats import resample_indices

    k = min(len(num), len(den))
    ratio = np.asarray(num[:k], dtype=float) / np.asarray(den[:k], dtype=float)
    draws = np.median(ratio[resample_indices(k, iters, 0)], axis=1)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(np.median(ratio)), float(lo), float(hi)


def speed_ratio(bench: dict[str, Any], a: str, b: str, iters: int = 2000) -> dict[int, tuple[float, float, float]]:
    """seq_len -> median of paired per-repeat throughput ratios a / b (above 1: a is faster) with a bootstrap
    interval over repeats (the repeats are interleaved, so each pair shares the machine's state)."""
    out = {}
    for run in bench.get("runs", []):
        if run.get("mode") != "prefill":
            continue
        by = {m["method"]: m for m in run["methods"]}
        if a not in by or b not in by:
            continue
        # throughput a / b = time b / time a
        out[int(run["seq_len"])] = paired_ratio(by[b]["timing"]["times_s"], by[a]["timing"]["times_s"], iters)
    return out


def format_run(run: dict[str, Any]) -> str:
    """A plain-text table of one run record."""
    if run["mode"] == "layer":
        t = run["timing"]
        ms = {k: v["median_s"] * 1e3 for k, v in t.items()}
        return "\n".join([
            f"  dense layer      {ms['dense_layer']:9.2f} ms (spread {t['dense_layer']['spread_pct']:.1f}%)",
            f"  selective layer  {ms['selective_layer']:9.2f} ms (spread {t['selective_layer']['spread_pct']:.1f}%)"
            f"  cost {run['selective_cost_fraction']:.3f} of dense, ideal {run['ideal_selective_cost_fraction']:.3f}"
            f" -> {run['pct_of_ideal']:.1f}% of ideal",
            f"  one query chunk  {ms['selective_layer_unchunked']:9.2f} ms (cost "
            f"{run['unchunked_attention_cost_fraction']:.3f}; the layer above uses {run['attention_chunks']} chunks)",
            f"  input norm       {ms['input_norm']:9.2f} ms ({100 * run['input_norm_fraction_of_dense']:.1f}% of dense)",
            f"  scoring          {ms['scoring']:9.2f} ms ({100 * run['scoring_fraction_of_dense']:.2f}% of dense)",
            f"  scoring + top-K  {ms['scoring_and_topk']:9.2f} ms "
            f"({100 * run['selection_fraction_of_dense']:.2f}% of dense)",
            *_attention_lines(run, ms),
        ])
    lines = [f"  {'method':<10} {'layers':>6} {'median ms':>11} {'spread':>7} {'tokens/s':>11} {'speed-up':>8} "
             f"{'best':>6} {'vs rm':>6} {'ideal':>6} {'% ideal':>7} {'peak mem':>10}"]
    for m in run["methods"]:
        mem = m["memory"]
        peak = mem.get("peak_allocated_mib", mem.get("peak_above_model_mib", mem.get("peak_above_start_mib",
                                                                               mem.get("process_peak_rss_mib"))))
        lines.append(
            f"  {m['method']:<10} {m['changed_layers']:>6} {m['timing']['median_s'] * 1e3:>11.1f} "
            f"{m['timing']['spread_pct']:>6.1f}% {m['tokens_per_s']:>11.1f} {_f(m['speedup_vs_dense'], '.3f'):>8} "
            f"{_f(m.get('speedup_vs_dense_best_runs'), '.3f'):>6} "
            f"{_f(m['throughput_vs_layer_removal'], '.3f'):>6} {_f(m['ideal_speedup'], '.3f'):>6} "
            f"{_f(m['pct_of_ideal'], '.1f'):>7} {_f(peak, '.0f'):>7} MiB")
    if run.get("copy_bandwidth_gb_s"):
        lines.append(f"  memory-bandwidth bound (copy bandwidth {run['copy_bandwidth_gb_s']:.1f} GB/s; weights and KV "
                     "cache read per step): " + ", ".join(
                         f"{m['method']} {m['bandwidth_bound_tokens_per_s']:.1f} tokens/s "
                         f"({m['pct_of_bandwidth_bound']:.0f}% reached)" for m in run["methods"]))
    a = run.get("analysis")
    if a and a.get("implied_selective_layer_cost") is not None:
        lines.append(f"  implied selection-layer cost {a['implied_selective_layer_cost']:.3f} of a dense layer "
                     f"(ideal {a['ideal_selective_layer_cost']:.3f}); dense layer {a['dense_layer_s'] * 1e3:.1f} ms")
    return "\n".join(lines)


def _device(rec: dict[str, Any]) -> str:
    env = rec.get("environment", {})
    if str(env.get("device", "")).startswith("cpu"):
        n, name = env.get("cpu_threads", "?"), env.get("device_name")
        return f"CPU{'' if name in (None, '', 'cpu') else ' (' + name + ')'}, {n} thread{'s' if n != 1 else ''}"
    return str(env.get("device_name") or env.get("device", "?"))


def markdown_table(records: list[dict[str, Any]], family_rows: bool = True) -> str:
    """One row per (file, run, method): the docs/results.md throughput table. Profiled layer runs add the gap to
    the ideal per operator family, and with family_rows each family's milliseconds."""
    out = ["| model | device | dtype | mode | batch x tokens | method | layers changed | tokens/s | speed-up "
           "| speed-up, best runs | vs layer removal | ideal | % of ideal | bandwidth bound (tokens/s) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in records:
        device = _device(rec)
        for run in rec["runs"]:
            if run["mode"] == "layer":
                continue
            shape = (f"{run['batch']} x {run['seq_len']}" if run["mode"] == "prefill"
                     else f"{run['batch']} x {run['new_tokens']} new (prompt {run['seq_len']})")
            for m in run["methods"]:
                out.append(
                    f"| {rec['model']} ({rec['num_layers']} layers) | {device} | {rec['dtype']} | {run['mode']}"
                    + (f" ({run['decode_impl']})" if run.get("decode_impl") else "") + " | "
                    f"{shape} | {m['method']} | {m['changed_layers']} | {m['tokens_per_s']:.0f} | "
                    f"{_f(m['speedup_vs_dense'], '.3f')} | {_f(m.get('speedup_vs_dense_best_runs'), '.3f')} | "
                    f"{_f(m['throughput_vs_layer_removal'], '.3f')} | "
                    f"{_f(m['ideal_speedup'], '.3f')} | {_f(m['pct_of_ideal'], '.1f')} | "
                    + (f"{m['bandwidth_bound_tokens_per_s']:.0f} ({m['pct_of_bandwidth_bound']:.0f}% reached) |"
                       if m.get("bandwidth_bound_tokens_per_s") else "- |"))
    if len(out) == 2:  # layer runs only: no throughput table
        out = []
    layer_rows = [(rec, run) for rec in records for run in rec["runs"] if run["mode"] == "layer"]
    if layer_rows:
        out += [""] if out else []
        out += ["| model | device | dtype | batch x tokens | layer | dense layer ms | selective layer ms | "
                "cost fraction | ideal | % of ideal | cost with one query chunk | scoring + top-K (% of dense layer) "
                "| attention share of dense layer | selected queries' attention / causal: masked | "
                "split (prefix + diagonal) |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for rec, run in layer_rows:
            t = run["timing"]
            a = run.get("attention_alone") or {}
            out.append(
                f"| {rec['model']} | {_device(rec)} | {rec['dtype']} | {run['batch']} x {run['seq_len']} | "
                f"{run.get('layer_index', '-')}{' (' + run['layer_type'] + ')' if run.get('layer_type') else ''} | "
                f"{t['dense_layer']['median_s'] * 1e3:.1f} | {t['selective_layer']['median_s'] * 1e3:.1f} | "
                f"{run['selective_cost_fraction']:.3f} | {run['ideal_selective_cost_fraction']:.3f} | "
                f"{run['pct_of_ideal']:.1f} | {_f(run.get('unchunked_attention_cost_fraction'), '.3f')} | "
                f"{100 * run['selection_fraction_of_dense']:.2f} | {_f(a.get('causal_share_of_dense_layer'), '.2f')} "
                f"| {_f(a.get('masked_fraction_of_causal'), '.3f')}{_used(a, 'masked')} "
                f"| {_f(a.get('split_fraction_of_causal'), '.3f')}{_used(a, 'split')} |")
        out.append("\n\\* the path selection layers take at that length (full-attention layers on CPU; older "
                   "records without the mark: masked)")
        profiled = [(rec, run) for rec, run in layer_rows if (run.get("profile") or {}).get("categories")]
        if profiled and family_rows:
            out += ["", "| model | batch x tokens | layer | operator family | dense layer ms | selective layer ms | "
                    "selective / dense |", "|---|---|---|---|---|---|---|"]
            for rec, run in profiled:
                cats = run["profile"]["categories"]
                for name, c in [*cats.items(), ("all", {"dense_ms": sum(c["dense_ms"] for c in cats.values()),
                                                        "selective_ms": sum(c["selective_ms"] for c in cats.values())})]:
                    ratio = c["selective_ms"] / c["dense_ms"] if c["dense_ms"] > 0 else None
                    out.append(f"| {rec['model']} | {run['batch']} x {run['seq_len']} | {run.get('layer_index', '-')} | "
                               f"{name} | {c['dense_ms']:.1f} | {c['selective_ms']:.1f} | {_f(ratio, '.3f')} |")
            out.append(f"\nSelf time per operator family per call of each layer, the mean of {_calls(profiled)} "
                       "profiled calls (torch.profiler; `orthorank bench --mode layer --profile`)")
        if profiled:
            out += ["", "| model | batch x tokens | layer | profiled cost fraction | ideal | % of ideal | gap | "
                    "attention kernel | matmul | gather / scatter / copy / sort | elementwise |",
                    "|---|---|---|---|---|---|---|---|---|---|---|"]
            for rec, run in profiled:
                gap = profile_gap(run)
                if gap is None:
                    continue
                out.append(f"| {rec['model']} | {run['batch']} x {run['seq_len']} | {run.get('layer_index', '-')} | "
                           f"{gap['fraction']:.3f} | {gap['ideal']:.3f} | {100 * gap['ideal'] / gap['fraction']:.1f} | "
                           + " | ".join(f"{100 * gap[k]:+.1f}" for k in ("gap", *GAP_PARTS)) + " |")
            out.append(f"\nWhere the profiled selective layer's cost (the mean of {_calls(profiled)} profiled calls) "
                       "exceeds the FLOP ideal, in points of the dense layer's time: the gap, and each operator "
                       "family's excess over its own ideal (attention: the dense kernel's time times the selected "
                       "share of queries; the others: the dense layer's time "
                       "in that family times the weights-only ideal, sorting 0). The families' ideals approximate "
                       "the FLOP model's parts (which counts attention at each query's position), so the excesses "
                       "add up to the gap within a few points.")
    return "\n".join(out)


GAP_PARTS = ("attention kernel", "matmul", "gather / scatter / copy / sort", "elementwise")


def profile_gap(run: dict[str, Any]) -> dict[str, float] | None:
    """A profiled layer run's cost over its FLOP ideal, split by operator family, as fractions of the dense
    layer's profiled time (see the caption in markdown_table); None where the profile recorded no time."""
    cats = run["profile"]["categories"]
    dense = sum(c["dense_ms"] for c in cats.values())
    selective = sum(c["selective_ms"] for c in cats.values())
    if dense <= 0 or selective <= 0:
        return None
    query_share = run["kept_tokens_per_row"] / run["seq_len"]
    weights = run["ideal_selective_cost_fraction_weights_only"]

    def excess(names: tuple[str, ...], share: float) -> float:
        return sum(cats[n]["selective_ms"] - share * cats[n]["dense_ms"] for n in names) / dense

    return {"fraction": selective / dense, "ideal": run["ideal_selective_cost_fraction"],
            "gap": selective / dense - run["ideal_selective_cost_fraction"],
            "attention kernel": excess(("attention kernel",), query_share),
            "matmul": excess(("matmul",), weights),
            "gather / scatter / copy / sort": (excess(("gather / scatter / copy",), weights)
                                               + excess(("sort / top-K",), 0.0)),
            "elementwise": excess(("elementwise",), weights)}


def _calls(profiled: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """How many profiled calls each run averaged (records before the averaging: 1)."""
    return " or ".join(str(c) for c in sorted({run["profile"].get("calls", 1) for _, run in profiled}))


def _used(a: dict[str, Any], path: str) -> str:
    return " \\*" if a.get("in_use") == path else ""


def main(argv: list[str] | None = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    brief = "--brief" in paths  # profiled layer runs: the gap table without each family's milliseconds
    paths = [p for p in paths if p != "--brief"]
    if not paths:
        print("usage: python -m orthorank.harness.reports.speed [--brief] RESULT.json ...", file=sys.stderr)
        return 2
    records = []
    for p in paths:
        for f in sorted(Path(p).glob("*.json")) if Path(p).is_dir() else [Path(p)]:
            data = json.loads(f.read_text())
            if data.get("command") == "bench":
                records.append(data)
    print(markdown_table(records, family_rows=not brief))
    return 0


if __name__ == "__main__":
    sys.exit(main())
