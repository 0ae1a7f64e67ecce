"""Measured prefill speed-ups of plans, side by side in one run, and matching OrthoRank's keep ratio to a pruning
plan's measured speed-up on the machine at hand.

Timings interleave the plans within every repeat (dense, then each plan, then the next repeat), so load on the
machine hits them alike; a plan's speed-up is the median over repeats of dense time / plan time in that repeat, and
its noise is the interquartile range of those per-repeat ratios."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import torch

from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.plan import Plan
from orthorank.method.selection import keep_count
from orthorank.models.loading import input_device
from orthorank.harness.runtime.timing import interleaved_rounds, iqr


@torch.no_grad()
def measured_speedups(model, plans: list[Plan], window: torch.Tensor, repeats: int) -> list[dict[str, Any]]:
    """Per plan: {"speedup": median of per-repeat ratios, "iqr": their interquartile range, "ratios": [...]}."""
    dense = Plan("dense", [], plans[0].model, plans[0].signature)
    order = {str(i): plan for i, plan in enumerate([dense, *plans])}
    batch = window.view(1, -1).to(input_device(model))

    def time_one(key: str) -> float:
        apply_plan(model, order[key])
        try:
            start = time.perf_counter()
            model(batch, use_cache=False)
            return time.perf_counter() - start
        finally:
            restore_dense(model)

    # dense, then each plan, in the same order every round (the first round warms up)
    times = interleaved_rounds(list(order), time_one, repeats, warmup=1, rotate=False)
    out = []
    for key in list(order)[1:]:
        ratios = sorted(d / p for d, p in zip(times["0"], times[key]))
        out.append({"speedup": round(statistics.median(ratios), 4), "iqr": round(iqr(ratios), 4),
                    "ratios": [round(r, 4) for r in ratios], "repeats": repeats})
    return out


def match_speed(model, make: Callable[[float], Plan], reference: Plan, window: torch.Tensor, base_ratio: float,
                repeats: int = 5, max_probes: int = 8, log: Callable[[str], None] | None = None,
                min_ratio: float | None = None, tolerance: float | None = None) -> dict[str, Any]:
    """The keep ratio r at which make(r) has the reference's measured prefill speed-up, by bisection on the number
    of kept tokens of the window (speed-up falls as r rises), from base_ratio: upwards to every token where make is
    faster than the reference there, and, with min_ratio, downwards to min_ratio where it is slower (without, a plan
    slower than the reference at base_ratio stays there). Each probe times dense, the reference and make(r) side by
    side; the search stops when the two speed-ups differ by no more than `tolerance`, or, without one, the timing
    noise (the larger of the two plans' IQRs of per-round ratios, which on a busy machine can stop it far from the
    match), or after `max_probes`, or when no kept-token count is left untried. Returns the closest probe's figures."""
    T = window.numel()
    k_base = keep_count(T, base_ratio)
    lo = keep_count(T, min_ratio) if min_ratio is not None else k_base  # the match lies in [lo, hi] kept tokens
    hi = T
    k = k_base
    probes: list[dict[str, Any]] = []
    tried: set[int] = set()
    best = None
    for _ in range(max_probes):
        ratio = base_ratio if k == k_base else k / T
        ref, cand = measured_speedups(model, [reference, make(ratio)], window, repeats)
        noise = max(ref["iqr"], cand["iqr"])
        diff = cand["speedup"] - ref["speedup"]
        probes.append({"ratio": round(ratio, 6), "speedup": cand["speedup"], "reference_speedup": ref["speedup"],
                       "noise": noise})
        if log is not None:
            log(f"  speed match: keep ratio {ratio:.4f} -> {cand['speedup']:.4f}x vs the reference's "
                f"{ref['speedup']:.4f}x (noise {noise:.4f})")
        if best is None or abs(diff) < abs(best["difference"]):
            best = {"ratio": ratio, "speedup": cand, "reference": ref, "difference": diff, "noise": noise}
        if abs(diff) <= (noise if tolerance is None else tolerance):
            break
        if diff < 0:  # slower than the reference: fewer kept tokens
            hi = k
        else:
            lo = k
        tried.add(k)
        k = (lo + hi) // 2
        if k in tried:  # the interval holds no count not yet timed (the floor itself included)
            break
    best["within_noise"] = abs(best["difference"]) <= best["noise"]
    if tolerance is not None:
        best["within_tolerance"] = abs(best["difference"]) <= tolerance
    best["probes"] = probes
    return best


def with_ratio(plan: Plan, ratio: float) -> Plan:
    return dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, ratio=ratio))
