"""The speed/quality frontier: perplexity (with its interval) against measured prefill speed-up, one series per
method, for plans of any kind (hybrid plans included)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orthorank.harness.results import atomic_save_figure
from orthorank.method.registry import is_reference


@dataclass
class FrontierPoint:
    method: str  # series: dense, sleb, orthorank, hybrid, ...
    label: str  # what the point is (e.g. "sleb-0.2", "hybrid x1.25")
    measured: float  # measured speed-up (median)
    measured_range: tuple[float, float] | None  # per-round range of the paired speed-ups
    predicted: float | None  # cost-table prediction
    ppl: dict[str, tuple[float, float, float]]  # dataset -> (value, low, high)


def plot_frontier(points: list[FrontierPoint], datasets: list[str], path: str | Path, title: str = "") -> Path:
    import matplotlib  # lazily: optional on the bench path (only figures need matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazily: optional on the bench path (only figures need matplotlib)

    colors = {"dense": "black", "sleb": "tab:blue", "orthorank": "tab:orange", "hybrid": "tab:green",
              "shortened": "tab:purple", "shortgpt": "tab:brown", "orthorank-nominal": "tab:red"}
    markers = {"dense": "s", "sleb": "o", "orthorank": "^", "hybrid": "D", "shortened": "v", "shortgpt": "P",
               "orthorank-nominal": "<"}
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.2 * len(datasets), 4.8), squeeze=False)
    dense = [p for p in points if is_reference(p.method)]
    for ax, ds in zip(axes[0], datasets):
        series: dict[str, list[FrontierPoint]] = {}
        for p in points:
            if not is_reference(p.method) and ds in p.ppl:
                series.setdefault(p.method, []).append(p)
        for method, pts in series.items():
            pts = sorted(pts, key=lambda p: p.measured)
            line = ([dense[0]] if dense and ds in dense[0].ppl else []) + pts
            c = colors.get(method)
            xs = [p.measured for p in line]
            ys = [p.ppl[ds][0] for p in line]
            yerr = [[p.ppl[ds][0] - p.ppl[ds][1] for p in line], [p.ppl[ds][2] - p.ppl[ds][0] for p in line]]
            xerr = [[p.measured - (p.measured_range or (p.measured, p.measured))[0] for p in line],
                    [(p.measured_range or (p.measured, p.measured))[1] - p.measured for p in line]]
            ax.errorbar(xs, ys, yerr=yerr, xerr=xerr, fmt="-", marker=markers.get(method, "o"), color=c,
                        capsize=3, elinewidth=0.8, label=f"{method} (measured)")
            pred = [p for p in pts if p.predicted is not None]
            if pred:
                ax.scatter([p.predicted for p in pred], [p.ppl[ds][0] for p in pred], facecolors="none",
                           edgecolors=c, marker=markers.get(method, "o"), s=40,
                           label=f"{method} (cost-table prediction)")
            for p in pts:
                ax.annotate(p.label, (p.measured, p.ppl[ds][0]), textcoords="offset points", xytext=(4, -10),
                            fontsize=6, color=c)
        if dense and ds in dense[0].ppl:
            ax.axhline(dense[0].ppl[ds][0], color="grey", lw=0.8, ls=":", label="dense")
        ax.set_xlabel("measured prefill speed-up over dense (median; bars: per-round range)")
        ax.set_ylabel("perplexity, 95% CI (lower is better)")
        ax.set_title(f"{ds}{': ' + title if title else ''}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path
