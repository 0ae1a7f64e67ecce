"""The retrieval frontier: at one prompt length, each setting's measured prefill speed-up against its long-context
score, both paired with dense, and the best speed-up each method reaches without answering worse.

A point is kept ("free" in the files, for their readers) only when it passes the non-inferiority rule of
harness/evaluation/noninferiority.py against dense on the same items: dense solves enough items, the paired difference's 95%
interval excludes a loss beyond the margin, and no task or layout shows a loss. A method's best speed-up is the largest
measured speed-up (median of paired rounds) among its points that pass, reported with that point's interval; a method
with none has none. Every table gives the discordant pairs (items only dense solves / items only the row solves).
Points from older files that kept only means are judged by `decide_from_summary` (they cannot pass: their items are
not paired in the file).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orthorank.harness.evaluation.noninferiority import Verdict, decide_from_summary
from orthorank.method.registry import is_reference


@dataclass
class Point:
    name: str  # e.g. "sleb 3 layers", "progressive 0.15"
    method: str  # its family: dense, sleb, orthorank, depth, progressive, ...
    compute: float  # share of the dense prefill's FLOPs skipped at this length (cost.prefill_sparsity)
    speedup: dict[str, float]  # {"value", "low", "high", "n"}: dense time / row time, paired rounds
    score: dict[str, Any]  # {"mean", "low", "high", "n", "diff": {"value", "low", "high"}} in points (%)
    layers: int = 0  # layers the plan changes
    level: float | None = None  # the level s it was built for (None: dense)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ideal(self) -> float:
        """The FLOP ideal: what skipping `compute` of the work would give if time followed FLOPs."""
        return 1.0 / (1.0 - self.compute) if self.compute < 1.0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ideal_speedup": round(self.ideal, 4), "free": None}


def verdict(point: Point, dense: Point) -> Verdict | None:
    """The non-inferiority verdict of a point against dense: the one the run stored from its paired items, or, for
    older files that kept only means, the summary's (which never passes). None for dense itself."""
    if is_reference(point.method):
        return None
    stored = point.score.get("verdict")
    if stored is not None:
        return Verdict(**stored)
    if "diff" not in point.score:
        return None
    return decide_from_summary(point.score["mean"], dense.score["mean"], int(point.score["n"]))


def is_free(point: Point, dense: Point) -> bool:
    """Passes the non-inferiority rule against dense (dense itself is its own reference)."""
    if is_reference(point.method):
        return True
    v = verdict(point, dense)
    return v is not None and v.passes


def free_speedups(points: list[Point]) -> dict[str, dict[str, Any] | None]:
    """Per method (dense excluded): the free point with the largest measured speed-up, or None."""
    dense = next(p for p in points if is_reference(p.method))
    best: dict[str, dict[str, Any] | None] = {}
    for p in points:
        if is_reference(p.method):
            continue
        best.setdefault(p.method, None)
        if is_free(p, dense) and (best[p.method] is None or p.speedup["value"] > best[p.method]["speedup"]["value"]):
            best[p.method] = {"point": p.name, "level": p.level, "speedup": p.speedup, "compute": p.compute,
                              "score": p.score}
    return best


def _iv(d: dict[str, Any], key: str = "value", spec: str = ".3f") -> str:
    lo, hi = d.get("low"), d.get("high")
    v = format(d[key], spec)
    if lo is None or hi is None or lo != lo or hi != hi:
        return f"{v} [n/a]"
    return f"{v} [{format(lo, spec)}, {format(hi, spec)}]"


def table(points: list[Point], length: int, caption: str) -> str:
    dense = next(p for p in points if is_reference(p.method))
    lines = [f"### {length} tokens", "", caption, "",
             "| setting | layers | compute | FLOP ideal | measured speed-up [95% CI] | score [95% CI] | "
             "vs dense (points) [95% CI] | only dense / only it | non-inferior |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        v = verdict(p, dense)
        diff = "-" if v is None else f"{v.diff:+.1f} [{v.low:+.1f}, {v.high:+.1f}]"
        least = "at least " if v is not None and v.rule.get("from_summary") else ""  # means only: the fewest pairs
        pairs = "-" if v is None else f"{least}{v.only_dense} / {v.only_setting}"
        ok = "-" if v is None else ("yes" if v.passes else f"no: {v.reason}")
        lines.append(f"| {p.name} | {p.layers} | {p.compute:.3f} | {p.ideal:.3f}x | {_iv(p.speedup)}x | "
                     f"{_iv(p.score, 'mean', '.1f')} | {diff} | {pairs} | {ok} |")
    lines += ["", "Best non-inferior speed-up per method (the largest measured speed-up among its points that pass "
              "the rule):", "",
              "| method | speed-up [95% CI] | at | score |", "|---|---|---|---|"]
    for method, best in free_speedups(points).items():
        if best is None:
            lines.append(f"| {method} | none | - | - |")
        else:
            lines.append(f"| {method} | {_iv(best['speedup'])}x | {best['point']} | "
                         f"{_iv(best['score'], 'mean', '.1f')} |")
    return "\n".join(lines) + "\n"


def group_table(points: list[Point]) -> str:
    """Per task, layout and template: dense's accuracy and each row's paired difference with its discordant pairs
    (only dense / only the row), from the verdicts the run stored; empty for files without them."""
    dense = points[0]
    rows = [p for p in points[1:] if p.score.get("verdict") and p.score["verdict"].get("groups")]
    if not rows or not dense.score.get("groups"):
        return ""
    head = "| group | items | dense (%) | " + " | ".join(p.name for p in rows) + " |"
    lines = ["", "Per task, layout and template (each row: its accuracy minus dense's in points, 95% Newcombe "
             "interval, and only dense / only it; ! = a loss shown):", "", head,
             "|" + "---|" * (3 + len(rows))]
    for g, acc in dense.score["groups"].items():
        cells = []
        for p in rows:
            e = p.score["verdict"]["groups"][g]
            cells.append(f"{e['diff']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}] {e['only_dense']}/{e['only_setting']}"
                         + (" !" if e["loss_shown"] else ""))
        n = rows[0].score["verdict"]["groups"][g]["n"]
        lines.append(f"| {g} | {n} | {acc:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(points: list[Point], length: int, path: Path, title: str) -> None:
    import matplotlib  # optional heavy dependency: only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from orthorank.harness.results import atomic_save_figure

    dense = next(p for p in points if is_reference(p.method))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.axhspan(dense.score["low"], dense.score["high"], color="0.9", label="dense 95% interval")
    methods = list(dict.fromkeys(p.method for p in points))
    for m in methods:
        ps = sorted((p for p in points if p.method == m), key=lambda p: p.speedup["value"])
        xs = [p.speedup["value"] for p in ps]
        ys = [p.score["mean"] for p in ps]
        xerr = [[max(0.0, p.speedup["value"] - p.speedup["low"]) if p.speedup["low"] == p.speedup["low"] else 0.0
                 for p in ps], [max(0.0, p.speedup["high"] - p.speedup["value"])
                               if p.speedup["high"] == p.speedup["high"] else 0.0 for p in ps]]
        yerr = [[max(0.0, p.score["mean"] - p.score["low"]) for p in ps],
                [max(0.0, p.score["high"] - p.score["mean"]) for p in ps]]
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", capsize=2, label=m, linestyle="-" if len(ps) > 1 else "")
    ax.set_xlabel("measured prefill speed-up over dense (batch 1, paired rounds)")
    ax.set_ylabel("long-context score (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_save_figure(fig, path)
    plt.close(fig)
