"""The paper's Table 1 as one run: perplexity of dense, layer pruning and OrthoRank, compared at compute sparsity,
with bootstrap intervals over windows and paired ratios between rows on the same windows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orthorank.errors import UserError
from orthorank.evaluation.stats import Interval, paired_perplexity_ratio, perplexity_interval
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.cost import Arch
from orthorank.method.plan import Plan

# Ablations of the paper, applied on the OrthoRank plan's own layers. The paper does not say whether the sink's
# keys/values stay visible when bypassed tokens give none, so both variants are run.
ABLATIONS: dict[str, dict[str, Any]] = {
    "random": {"policy": "random"},
    "inverse": {"policy": "inverse"},
    "raw": {"source": "raw"},
    "no-kv": {"bypass_kv": False},
    "no-kv, sink visible": {"bypass_kv": False, "sink_kv_visible": True},
}
PRUNING = ("sleb", "shortened-ppl", "shortgpt")


@dataclass
class Row:
    method: str  # table label: dense, sleb, ..., orthorank, "orthorank (random)"
    level: float  # the sparsity level asked for (0 for dense)
    plan: Plan
    nll: dict[str, np.ndarray] = field(default_factory=dict)  # dataset -> summed NLL per window
    tokens: dict[str, int] = field(default_factory=dict)  # dataset -> predicted tokens per window
    measured_speedup: float | None = None
    measured_range: tuple[float, float] | None = None  # range of the per-repeat ratios behind it
    updated_share: dict[str, float | None] = field(default_factory=dict)  # continuation: decoded tokens updated

    @property
    def family(self) -> str:
        return self.method.split(" (")[0]

    @property
    def ablation(self) -> str | None:
        return self.method[len(self.family) + 2:-1] if "(" in self.method else None

    def interval(self, dataset: str) -> Interval:
        return perplexity_interval(self.nll[dataset], self.tokens[dataset])

    def sparsity(self, arch: Arch, seq_len: int) -> dict[str, Any]:
        """Nominal, compute and measured; the measured speed-up is this run's (--measure-speed) or else the one
        recorded when the plan was made ("measured_at": "plan")."""
        if self.measured_speedup is not None:
            return {**self.plan.sparsity(arch, seq_len, self.measured_speedup), "measured_at": "this run"}
        recorded = self.plan.recorded_speedup
        out = self.plan.sparsity(arch, seq_len, recorded)
        if recorded is not None:
            m = self.plan.provenance.get("measured", {})
            out["measured_at"] = f"plan ({m.get('seq_len')} tokens, {m.get('dtype')}, {m.get('threads')} threads)"
        return out

    def to_dict(self, arch: Arch, seq_len: int) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "level": self.level, "layers": self.plan.layers,
                               "sparsity": self.sparsity(arch, seq_len)}
        if self.measured_range is not None:
            out["measured_range"] = [round(v, 4) for v in self.measured_range]
        for d in self.nll:
            ci = self.interval(d)
            out[d] = {"perplexity": round(ci.value, 6), "ci95": [round(ci.low, 6), round(ci.high, 6)],
                      "windows": int(self.nll[d].size), "tokens_per_window": self.tokens[d],
                      "window_nll": [round(float(v), 6) for v in self.nll[d]]}
            if d in self.updated_share:
                out[d]["decoded_tokens_updated"] = self.updated_share[d]
        return out


def ablation_plans(plan: Plan) -> list[tuple[str, Plan]]:
    out = []
    for name, change in ABLATIONS.items():
        variant = dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, **change),
                                      provenance={**plan.provenance, "ablation": name})
        out.append((f"orthorank ({name})", variant))
    return out


def policy_plans(plan: Plan, specs: list[str]) -> list[tuple[str, Plan]]:
    """The plan's layers (and ratios) with other selection policies: one (label, plan) per variant spec
    (method/policies.parse_variant), so rules are compared at exactly the plan's compute."""
    from orthorank.method.policies import parse_variant

    if plan.selection is None:
        raise UserError(f"a {plan.method} plan selects no tokens: policies do not apply to it")
    out = []
    for spec in specs:
        # the plan's recorded speed-up was measured for its own policy: another policy has its own cost (the
        # oracle none at all), so a variant shows a speed-up only where this run measures it (--measure-speed)
        provenance = {k: v for k, v in plan.provenance.items() if k != "measured"}
        variant = dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, **parse_variant(spec)),
                                      provenance={**provenance, "policy_variant": spec})
        out.append((f"[{spec}]", variant))
    return out


def dataset_stream(tokenizer, dataset: str, text: str, seq_len: int) -> torch.Tensor:
    """The token stream a dataset's windows are cut from: the whole text, or for a capped domain (c4, news, code)
    its first 256 x seq_len tokens (for wikitext2 and c4 the same stream as perplexity.eval_stream)."""
    from orthorank.evaluation.data import is_capped
    from orthorank.evaluation.perplexity import C4_WINDOWS, tokenize_text

    ids = tokenize_text(tokenizer, text)
    return ids[: C4_WINDOWS * seq_len] if is_capped(dataset) else ids


def evaluate_rows(model, rows: list[Row], windows: dict[str, torch.Tensor], streams: dict[str, torch.Tensor],
                  store=None, batch_size: int = 1, progress: bool = True, fingerprint: str | None = None,
                  continuation: bool = False) -> None:
    """Per-window NLL of every row on every dataset, through the result store when one is given. continuation:
    each window's second half decoded one token at a time after a prefill of its first half
    (evaluation/continuation.py), so decode policies count; the rows record the share of decoded tokens updated."""
    from orthorank.evaluation.continuation import continuation_key, scored_tokens, stored_continuation
    from orthorank.evaluation.perplexity import perplexity_key, stored_window_nll
    from orthorank.store import model_fingerprint

    fp = fingerprint or model_fingerprint(model)
    key = continuation_key if continuation else perplexity_key
    for row in rows:
        apply_plan(model, row.plan)
        try:
            for name, w in windows.items():
                ns = None
                if store is not None:  # keyed by the dense weights' fingerprint and the plan's content
                    ns = store.namespace("perplexity", key(model, row.plan, name, streams[name], w.shape[1], fp))
                label = row.method if row.method == "dense" else f"{row.method}@{row.level:g}"
                if continuation:
                    nll, shares = stored_continuation(model, w, ns, batch_size, progress, desc=f"{label} {name}")
                    row.updated_share[name] = None if None in shares else float(np.mean(shares))
                    row.tokens[name] = scored_tokens(int(w.shape[1]))
                else:
                    nll = stored_window_nll(model, w, ns, batch_size, progress, desc=f"{label} {name}")
                    row.tokens[name] = int(w.shape[1] - 1)
                row.nll[name] = nll.numpy()
        finally:
            restore_dense(model)


@torch.no_grad()
def measure_speedups(model, rows: list[Row], window: torch.Tensor, repeats: int = 3) -> None:
    """Prefill speed-up of every row's plan over dense on one window, as `calibrate --measure-speed` measures it
    (bench.matching: the plans interleaved in every repeat, the median of the per-repeat ratios): sets each row's
    measured speed-up and the range of its per-repeat ratios."""
    from orthorank.bench.matching import measured_speedups

    for row, m in zip(rows, measured_speedups(model, [r.plan for r in rows], window, repeats)):
        row.measured_speedup = m["speedup"]
        row.measured_range = (min(m["ratios"]), max(m["ratios"]))


def frontier_points(rows: list[Row], datasets: list[str]) -> list:
    """Rows with a speed-up measured in this run as points of the speed/quality frontier (dense at 1x)."""
    from orthorank.analysis.frontier import FrontierPoint

    points = []
    for r in rows:
        if r.method != "dense" and r.measured_speedup is None:
            continue
        ppl = {d: (ci.value, ci.low, ci.high) for d in datasets if d in r.nll for ci in [r.interval(d)]}
        speed = 1.0 if r.method == "dense" else r.measured_speedup
        points.append(FrontierPoint(r.method, "dense" if r.method == "dense" else f"{r.level:g}", speed,
                                    r.measured_range, None, ppl))
    return points


@dataclass
class Comparison:
    a: Row
    b: Row
    dataset: str
    ratio: Interval  # ppl(a) / ppl(b), paired over the same windows

    @property
    def verdict(self) -> str:
        if self.ratio.high < 1.0:
            return "lower"
        if self.ratio.low > 1.0:
            return "higher"
        return "no difference"

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.method, "a_level": self.a.level, "b": self.b.method, "b_level": self.b.level,
                "dataset": self.dataset, "ratio": round(self.ratio.value, 6),
                "ci95": [round(self.ratio.low, 6), round(self.ratio.high, 6)], "a_perplexity_is": self.verdict}


def reference_rows(row: Row, rows: list[Row]) -> list[Row]:
    """What a row is compared with: OrthoRank with every pruning method at its level; an ablation with OrthoRank at
    its level; a pruning method with dense and, other than SLEB, with SLEB at its level (every method's paired ratio
    against SLEB is what the worst-domain table reads)."""
    if row.method == "dense":
        return []
    if row.ablation is not None:
        own = [r for r in rows if r.method == row.family and r.level == row.level]
        if row.ablation.startswith("policy "):  # another rule at the paper's compute: also against pruning
            own += [r for r in rows if r.method in PRUNING and r.level == row.level]
        return own
    if row.family in ("hybrid", "router", "router-hybrid"):  # against every pruning method and OrthoRank at its level
        return [r for r in rows if r.level == row.level and r.ablation is None
                and (r.method in PRUNING or r.family.startswith("orthorank"))]
    if row.family.startswith("orthorank"):
        return [r for r in rows if r.method in PRUNING and r.level == row.level]
    return [r for r in rows if r.method == "dense" or (r.method == "sleb" != row.method and r.level == row.level)]


def comparisons(rows: list[Row]) -> list[Comparison]:
    out = []
    for row in rows:
        for ref in reference_rows(row, rows):
            for d in row.nll:
                if d in ref.nll and ref.nll[d].shape == row.nll[d].shape:
                    ratio = paired_perplexity_ratio(row.nll[d], ref.nll[d], row.tokens[d])
                    out.append(Comparison(row, ref, d, ratio))
    return out


@dataclass
class WorstDomain:
    row: Row
    reference: Row
    ratio: Interval  # the largest paired ratio over the domains, with the interval of the maximum
    dataset: str
    datasets: list[str]

    @property
    def verdict(self) -> str:
        if self.ratio.high < 1.0:
            return "lower everywhere"
        if self.ratio.low > 1.0:
            return "higher somewhere"
        return "no difference"

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.row.method, "level": self.row.level, "vs": self.reference.method,
                "worst_dataset": self.dataset, "datasets": self.datasets, "ratio": round(self.ratio.value, 6),
                "ci95": [round(self.ratio.low, 6), round(self.ratio.high, 6)], "verdict": self.verdict}


def worst_domains(comps: list[Comparison], reference: str = "sleb") -> list[WorstDomain]:
    """Per row and level, the worst (largest) paired perplexity ratio against `reference` over every dataset both
    were scored on: what a user without their own evaluation text should look at."""
    from orthorank.evaluation.stats import worst_ratio

    groups: dict[tuple[str, float], list[Comparison]] = {}
    for c in comps:
        if c.b.method == reference and c.a.level == c.b.level:
            groups.setdefault((c.a.method, c.a.level), []).append(c)
    out = []
    for cs in groups.values():
        interval, k = worst_ratio([(c.a.nll[c.dataset], c.b.nll[c.dataset], c.a.tokens[c.dataset]) for c in cs])
        out.append(WorstDomain(cs[0].a, cs[0].b, interval, cs[k].dataset, [c.dataset for c in cs]))
    return out


@dataclass
class Headroom:
    row: Row
    dataset: str
    share: Interval  # (ppl_random - ppl_rule) / (ppl_random - ppl_oracle)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.row.method, "level": self.row.level, "dataset": self.dataset,
                "share": None if self.share.value != self.share.value else round(self.share.value, 6),
                "ci95": [round(self.share.low, 6), round(self.share.high, 6)], "windows": self.share.n}


def headrooms(rows: list[Row]) -> list[Headroom]:
    """For every level with a random row and an oracle row of OrthoRank's plan: the share of the oracle's headroom
    over random that the paper's rule and every other policy row capture, per dataset (same windows, paired)."""
    from orthorank.evaluation.stats import headroom_share

    out = []
    for base in [r for r in rows if r.ablation is None and (r.family.startswith("orthorank") or r.family.startswith("router"))]:
        mine = [r for r in rows if r.family == base.method and r.level == base.level]
        random = next((r for r in mine if r.ablation in ("random", "policy random")), None)
        oracle = next((r for r in mine if r.ablation == "policy oracle"), None)
        if random is None or oracle is None:
            continue
        rules = [base] + [r for r in mine if r.ablation is not None and r.ablation.startswith("policy ")
                          and r not in (random, oracle)]
        for rule in rules:
            for d in rule.nll:
                if all(d in r.nll and r.nll[d].shape == rule.nll[d].shape for r in (random, oracle)):
                    out.append(Headroom(rule, d, headroom_share(rule.nll[d], random.nll[d], oracle.nll[d],
                                                                rule.tokens[d])))
    return out


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(datasets), figsize=(5.8 * len(datasets), 4.4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        dense = [r for r in rows if r.method == "dense" and ds in r.nll]
        by_method: dict[str, list[Row]] = {}
        for r in rows:
            if r.method != "dense" and ds in r.nll:
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
    from orthorank.results import atomic_save_figure

    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path

