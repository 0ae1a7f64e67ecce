"""The paper's Table 1 as one run: perplexity of dense, layer pruning and OrthoRank at equal sparsity."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from orthorank.evaluation.perplexity import perplexity
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.plan import Plan

# Ablations of the paper, applied on the OrthoRank plan's own layers.
ABLATIONS: dict[str, dict[str, Any]] = {
    "random": {"order": "random"},
    "inverse": {"order": "inverse"},
    "raw": {"source": "raw"},
    "no-kv": {"bypass_kv": False},
}


@dataclass
class Row:
    method: str
    sparsity: float  # nominal
    plan: Plan
    values: dict[str, float] = field(default_factory=dict)  # dataset or task -> number

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "sparsity": self.sparsity,
            "effective_sparsity": round(self.plan.effective_sparsity, 4),
            "layers": self.plan.layers,
            **self.values,
        }


def ablation_plans(plan: Plan) -> list[tuple[str, Plan]]:
    out = []
    for name, change in ABLATIONS.items():
        variant = dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, **change),
                                      provenance={**plan.provenance, "ablation": name})
        out.append((f"orthorank ({name})", variant))
    return out


def evaluate_rows(model, rows: list[Row], windows: dict[str, torch.Tensor], batch_size: int = 1,
                  progress: bool = True) -> None:
    for row in rows:
        apply_plan(model, row.plan)
        for name, w in windows.items():
            row.values[name] = perplexity(model, w, batch_size, progress, desc=f"{row.method}@{row.sparsity:g} {name}"
                                          ).perplexity
        restore_dense(model)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.2f}"
    return str(v)


def markdown_table(rows: list[Row], columns: list[str], mean_label: str | None = None) -> str:
    head = ["method", "sparsity", "effective", *columns] + ([mean_label] if mean_label else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        vals = [r.values.get(c, float("nan")) for c in columns]
        cells = [r.method, f"{r.sparsity:g}", f"{r.plan.effective_sparsity:.3f}", *map(_fmt, vals)]
        if mean_label:
            cells.append(_fmt(sum(vals) / len(vals)) if vals else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_ppl(rows: list[Row], datasets: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4.2), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        dense = [r for r in rows if r.method == "dense"]
        by_method: dict[str, list[Row]] = {}
        for r in rows:
            if r.method != "dense":
                by_method.setdefault(r.method, []).append(r)
        for method, rs in by_method.items():
            rs = sorted(rs, key=lambda r: r.plan.effective_sparsity)
            xs = [0.0] + [r.plan.effective_sparsity for r in rs] if dense else [r.plan.effective_sparsity for r in rs]
            ys = ([dense[0].values[ds]] if dense else []) + [r.values[ds] for r in rs]
            style = "--" if "(" in method else "-"
            ax.plot(xs, ys, style, marker="o", label=method)
        if dense:
            ax.axhline(dense[0].values[ds], color="grey", lw=0.8, ls=":", label="dense")
        ax.set_yscale("log")
        ax.set_title(f"{ds} perplexity vs sparsity")
        ax.set_xlabel("effective sparsity (skipped share of layer work)")
        ax.set_ylabel("perplexity (log scale, lower is better)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
