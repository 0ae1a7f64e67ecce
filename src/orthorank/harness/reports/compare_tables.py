"""How a comparison is shown: its Markdown tables (perplexity with intervals, paired ratios, worst-domain ratios,
headroom shares), its figure and its frontier points. harness/evaluation/compare.py computes the rows and ratios; this module
only formats them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from orthorank.harness.reports.frontier import FrontierPoint
from orthorank.harness.evaluation.compare import Comparison, Headroom, Row, WorstDomain
from orthorank.harness.evaluation.stats import Interval
from orthorank.method.cost import Arch
from orthorank.harness.results import atomic_save_figure
from orthorank.method.registry import is_reference


def frontier_points(rows: list[Row], datasets: list[str]) -> list:
    """Rows with a speed-up measured in this run as points of the speed/quality frontier (dense at 1x)."""
    points = []
    for r in rows:
        if not is_reference(r.method) and r.measured_speedup is None:
            continue
        ppl = {d: (ci.value, ci.low, ci.high) for d in datasets if d in r.nll for ci in [r.interval(d)]}
        speed = 1.0 if is_reference(r.method) else r.measured_speedup
        points.append(FrontierPoint(r.method, "dense" if is_reference(r.method) else f"{r.level:g}", speed,
                                    r.measured_range, None, ppl))
    return points


def headroom_table(items: list[Headroom], datasets: list[str]) -> str:
    by_row: dict[tuple[str, float], dict[str, Headroom]] = {}
    for h in items:
        by_row.setdefault((h.row.method, h.row.level), {})[h.dataset] = h
    head = ["rule", "level", *[f"{d} share [95% CI]" for d in datasets]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for (method, level), by_d in by_row.items():
        cells = [method, f"{level:g}"]
        cells += [by_d[d].share.text(".2f") if d in by_d else "-" for d in datasets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def worst_domain_table(worst: list[WorstDomain]) -> str:
    head = ["row", "level", "vs", "worst dataset", "worst ratio [95% CI]", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for w in worst:
        text = w.ratio.text(".3f")
        lines.append("| " + " | ".join([w.row.method, f"{w.row.level:g}", w.reference.method, w.dataset,
                                        f"**{text}**" if w.ratio.excludes(1.0) else text, w.verdict]) + " |")
    return "\n".join(lines)


def _ci(ci: Interval) -> str:
    return ci.text(".2f")


def markdown_table(rows: list[Row], datasets: list[str], arch: Arch, seq_len: int) -> str:
    decoded = any(r.updated_share for r in rows)  # continuation scoring: what the decode policies skipped
    head = ["method", "level", "layers", "nominal", "compute", "measured", *[f"{d} ppl [95% CI]" for d in datasets],
            *(["decoded tokens updated"] if decoded else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        s = r.sparsity(arch, seq_len)
        measured = (f"{s['measured_speedup']:.3f}x" + ("" if s.get("measured_at") == "this run" else "†")
                    if s["measured_speedup"] else "-")
        shares = [v for v in r.updated_share.values() if v is not None]
        cells = [r.method, f"{r.level:g}", str(len(r.plan.layers)), f"{s['nominal']:.3f}", f"{s['compute']:.3f}",
                 measured, *[_ci(r.interval(d)) if d in r.nll else "-" for d in datasets],
                 *([f"{np.mean(shares):.3f}" if shares else "-"] if decoded else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison_table(comps: list[Comparison], datasets: list[str]) -> str:
    """Paired ratios ppl(row) / ppl(reference); ** marks an interval that excludes 1 (a difference the windows
    support), in either direction."""
    pairs: dict[tuple[str, float, str], dict[str, Comparison]] = {}
    for c in comps:
        pairs.setdefault((c.a.method, c.a.level, c.b.method), {})[c.dataset] = c
    head = ["row", "level", "vs", *[f"{d} ratio [95% CI]" for d in datasets]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for (a, level, b), by_d in pairs.items():
        cells = [a, f"{level:g}", b]
        for d in datasets:
            c = by_d.get(d)
            if c is None:
                cells.append("-")
                continue
            text = c.ratio.text(".3f")
            cells.append(f"**{text}**" if c.ratio.excludes(1.0) else text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_ppl(rows: list[Row], datasets: list[str], path: Path, arch: Arch, seq_len: int) -> Path:
    import matplotlib  # lazily: optional on the bench path (only figures need matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazily: optional on the bench path (only figures need matplotlib)

    fig, axes = plt.subplots(1, len(datasets), figsize=(5.8 * len(datasets), 4.4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        dense = [r for r in rows if is_reference(r.method) and ds in r.nll]
        by_method: dict[str, list[Row]] = {}
        for r in rows:
            if not is_reference(r.method) and ds in r.nll:
                by_method.setdefault(r.method, []).append(r)
        for method, rs in by_method.items():
            rs = sorted(rs, key=lambda r: r.sparsity(arch, seq_len)["compute"])
            pts = ([(0.0, dense[0].interval(ds))] if dense else []) + [
                (r.sparsity(arch, seq_len)["compute"], r.interval(ds)) for r in rs]
            xs = [x for x, _ in pts]
            ys = [ci.value for _, ci in pts]
            err = [[ci.value - ci.low for _, ci in pts], [ci.high - ci.value for _, ci in pts]]
            style = "--" if "(" in method else "-"
            ax.errorbar(xs, ys, yerr=err, fmt=style, marker="o", capsize=3, label=method)
        if dense:
            ax.axhline(dense[0].interval(ds).value, color="grey", lw=0.8, ls=":", label="dense")
        ax.set_yscale("log")
        n = next(iter(r.nll[ds].size for r in rows if ds in r.nll))
        ax.set_title(f"{ds}: perplexity vs compute sparsity ({n} windows)")
        ax.set_xlabel(f"compute sparsity (share of FLOPs skipped at {seq_len} tokens)")
        ax.set_ylabel("perplexity, 95% CI (log scale, lower is better)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path
