"""Long-context evaluation rows: methods x decode policies on generated samples (offline suite or LongBench),
through the result store (resumable, shardable under torchrun), with intervals and paired differences."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
from torch import nn

from orthorank.harness.evaluation.generation import generate_rows
from orthorank.harness.evaluation.stats import Interval, accuracy_interval, paired_difference
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.plan import Plan
from orthorank.models.loading import input_device
from orthorank.models.sliding_attention import kernel_key
from orthorank.harness.store import code_version, fill, model_fingerprint


@dataclass
class Row:
    """One table row: a plan, and for OrthoRank the decode policy it runs under."""

    name: str  # e.g. "orthorank 0.2 (threshold decode)"
    method: str
    level: float | None
    plan: Plan
    decode: str | None = None
    variant: str | None = None  # a selection policy variant on the OrthoRank plan's layers (None: the plan's own)

    def applied(self) -> Plan:
        if not self.plan.kind.one_selection or self.decode is None:
            return self.plan

        return replace(self.plan, selection=replace(self.plan.selection, decode=self.decode))


@dataclass
class Item:
    """One generation: prompt ids, how many new tokens, stop ids, and a scorer of the decoded text."""

    key: str  # e.g. "niah_single/4096/17" or "multi_news/3"
    ids: list[int]
    max_new_tokens: int
    score: Callable[[str], float]
    stop_ids: list[int] | None = None
    labels: dict[str, str] = field(default_factory=dict)  # e.g. {"task": ..., "layout": ...}: the rule's groups
    haystack: str = "text"  # where its filler comes from (the overlap check reads only text pools)


def longctx_key(model: nn.Module, plan: Plan, suite: str, settings: dict[str, Any],
                fingerprint: str | None = None) -> dict:
    return {"model": fingerprint or model_fingerprint(model), "plan": plan.content_hash(), "suite": suite,
            "settings": settings, "dtype": str(next(model.parameters()).dtype),
            "device": input_device(model).type, "code": code_version("longctx"), **kernel_key(model)}


def run_row(lm, row: Row, items: list[Item], namespace=None, batch_size: int = 1, progress=None) -> dict[str, dict]:
    """{item key: {"score", "prediction", "new_tokens"}} for one row, resuming from the store."""
    plan = row.applied()
    apply_plan(lm.model, plan)

    def compute(idx: list[int]) -> dict[int, dict]:
        out = {}
        for start in range(0, len(idx), batch_size):
            chunk = idx[start:start + batch_size]
            stops = items[chunk[0]].stop_ids
            new, timing = generate_rows(lm, [items[i].ids for i in chunk],
                                        max(items[i].max_new_tokens for i in chunk), stop_ids=stops)
            for i, toks in zip(chunk, new):
                toks = toks[: items[i].max_new_tokens]
                text = lm.tokenizer.decode(toks, skip_special_tokens=True)
                out[i] = {"score": float(items[i].score(text)), "prediction": text[:400],
                          "new_tokens": len(toks)}
            if progress is not None:
                progress(len(chunk))
        return out

    try:
        done = fill(namespace, range(len(items)), compute, chunk=max(batch_size, 4), tag=row.name)
    finally:
        restore_dense(lm.model)
    return {items[i].key: v for i, v in done.items()}


def summarize(scores: dict[str, list[float]], reference: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Mean score (%) with a 95% bootstrap interval; with a reference row on the same items, the paired
    difference (percentage points) and its interval."""
    out = {}
    for group, vals in scores.items():
        ci = accuracy_interval(vals)
        entry = {"n": len(vals), "mean": 100 * ci.value, "low": 100 * ci.low, "high": 100 * ci.high}
        if reference is not None and group in reference and len(reference[group]) == len(vals):
            d = paired_difference(vals, reference[group])
            entry["diff"] = {"value": 100 * d.value, "low": 100 * d.low, "high": 100 * d.high,
                             "excludes_zero": d.excludes(0.0)}
        out[group] = entry
    return out


def fmt(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    return Interval(entry["mean"], entry["low"], entry["high"], n=entry.get("n")).text(".1f", unit="sample")


def fmt_diff(entry: dict[str, Any] | None) -> str:
    if entry is None or "diff" not in entry:
        return "-"
    d = entry["diff"]
    return (Interval(d["value"], d["low"], d["high"], n=entry.get("n")).text("+.1f", unit="sample")
            + (" **" if d["excludes_zero"] else ""))


def grouped(results: dict[str, dict], group_of: Callable[[str], str]) -> dict[str, list[float]]:
    """Per-item scores grouped (e.g. by task), in item-key order so rows pair up item by item."""
    out: dict[str, list[float]] = {}
    for key in sorted(results):
        out.setdefault(group_of(key), []).append(results[key]["score"])
    return out


def mean_of(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")
