"""The paper's Table 1 as one run: perplexity of dense, layer pruning and OrthoRank, compared at compute sparsity,
with bootstrap intervals over windows and paired ratios between rows on the same windows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from orthorank.errors import UserError
from orthorank.harness.evaluation.continuation import continuation_key, scored_tokens, stored_continuation
from orthorank.harness.evaluation.data import is_capped
from orthorank.harness.evaluation.perplexity import C4_WINDOWS, perplexity_key, stored_window_nll, tokenize_text
from orthorank.harness.evaluation.stats import (
    Interval, headroom_share, paired_perplexity_ratio, perplexity_interval, worst_ratio,
)
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.cost import Arch
from orthorank.method.plan import Plan
from orthorank.method.policies import parse_variant
from orthorank.harness.runtime.matching import measured_speedups
from orthorank.harness.store import model_fingerprint
from orthorank.method.registry import METHODS, baseline, get_method, is_baseline, is_reference

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
    ids = tokenize_text(tokenizer, text)
    return ids[: C4_WINDOWS * seq_len] if is_capped(dataset) else ids


def evaluate_rows(model, rows: list[Row], windows: dict[str, torch.Tensor], streams: dict[str, torch.Tensor],
                  store=None, batch_size: int = 1, progress: bool = True, fingerprint: str | None = None,
                  continuation: bool = False) -> None:
    """Per-window NLL of every row on every dataset, through the result store when one is given. continuation:
    each window's second half decoded one token at a time after a prefill of its first half
    (harness/evaluation/continuation.py), so decode policies count; the rows record the share of decoded tokens updated."""
    fp = fingerprint or model_fingerprint(model)
    key = continuation_key if continuation else perplexity_key
    for row in rows:
        apply_plan(model, row.plan)
        try:
            for name, w in windows.items():
                ns = None
                if store is not None:  # keyed by the dense weights' fingerprint and the plan's content
                    ns = store.namespace("perplexity", key(model, row.plan, name, streams[name], w.shape[1], fp))
                label = row.method if is_reference(row.method) else f"{row.method}@{row.level:g}"
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
    for row, m in zip(rows, measured_speedups(model, [r.plan for r in rows], window, repeats)):
        row.measured_speedup = m["speedup"]
        row.measured_range = (min(m["ratios"]), max(m["ratios"]))


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
    if is_reference(row.method):
        return []
    if row.ablation is not None:
        own = [r for r in rows if r.method == row.family and r.level == row.level]
        if row.ablation.startswith("policy "):  # another rule at the paper's compute: also against pruning
            own += [r for r in rows if r.method in PRUNING and r.level == row.level]
        return own
    if getattr(METHODS.get(row.family), "against_all", False):  # against every pruning method and OrthoRank at its level
        # and against the methods the registry pairs it with (a searched router plan: the router on OrthoRank's
        # layers, what the search under it adds)
        also = get_method(row.family).paired_with
        return [r for r in rows if r.level == row.level and r.ablation is None
                and (r.method in PRUNING or r.family.startswith("orthorank") or r.method in also)]
    if row.family.startswith("orthorank"):
        return [r for r in rows if r.method in PRUNING and r.level == row.level]
    return [r for r in rows if is_reference(r.method)
            or (is_baseline(r.method) and not is_baseline(row.method) and r.level == row.level)]


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


def worst_domains(comps: list[Comparison], reference: str | None = None) -> list[WorstDomain]:
    """Per row and level, the worst (largest) paired perplexity ratio against `reference` (the registry's pruning
    baseline, SLEB, unless given) over every dataset both were scored on: what a user without their own evaluation
    text should look at."""
    reference = baseline() if reference is None else reference
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
