"""Where a selection layer's time goes, phase by phase, against what each phase would cost at the FLOP ideal.

Each operator of a profiled call is put in the innermost phase it ran in: the layer's own marks
(method/phase_marks.py: input norm, scoring, top-K, gather, attention kernel, scatter) or the module it ran under
(the layer's input norm, projections, MLP, other norms, and the attention module's RoPE and reshapes), found through
profiler ranges that forward hooks open on the layer's submodules while profiling. The dense layer runs the same hooks, so both are split the same way.

A phase's ideal is the dense layer's time in it scaled by the share of the work the selective layer must still do:
every token's input norm, keys and values; the selected rows' share of queries, output projection, MLP and other
norms; the attention of the selected queries at their positions (the keys they read over the causal triangle's);
nothing for scoring, top-K, gathers and scatters, which the FLOP model does not count (the router's scoring FLOPs
are in the plan's compute sparsity, not here). The excess of each phase over its ideal then adds up to the layer's
gap to its ideal, and names what to remove.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

from orthorank.method import phase_marks
from orthorank.harness.runtime.timing import synchronize

MODULE_PREFIX = "module::"

# submodule name (the last part of its qualified name) -> phase; unlisted submodules take their parent's phase
MODULE_PHASES = {
    "input_layernorm": "input norm",
    "q_proj": "queries",
    "k_proj": "keys/values",
    "v_proj": "keys/values",
    "o_proj": "output projection",
    "self_attn": "RoPE, reshapes",  # what the attention module does besides its projections and kernel
    "mlp": "MLP",
    "post_attention_layernorm": "other norms",
    "pre_feedforward_layernorm": "other norms",
    "post_feedforward_layernorm": "other norms",
}
# phase marks of the selection layer (method/phase_marks.py) -> phase
MARK_PHASES = {"input norm": "input norm", "scoring": "scoring", "top-K": "top-K", "gather": "gather",
               "attention kernel": "attention kernel", "scatter": "scatter"}
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "softmax", "_flex")
PHASES = ("input norm", "scoring", "top-K", "gather", "queries", "keys/values", "RoPE, reshapes", "attention kernel",
          "output projection", "other norms", "MLP", "scatter", "other")


def phase_ideal_shares(ratio: float, attention_share: float, query_heads: int, kv_heads: int) -> dict[str, float]:
    """The share of the dense layer's time in each phase that the selective layer must still spend (RoPE: the
    selected rows' queries and every token's keys)."""
    rope = (ratio * query_heads + kv_heads) / (query_heads + kv_heads)
    return {"input norm": 1.0, "scoring": 0.0, "top-K": 0.0, "gather": 0.0, "queries": ratio, "keys/values": 1.0,
            "RoPE, reshapes": rope, "attention kernel": attention_share, "output projection": ratio,
            "other norms": ratio, "MLP": ratio, "scatter": 0.0, "other": ratio}


def attention_share(idx: torch.Tensor, T: int) -> float:
    """Keys the selected queries at positions idx [B, K] read, over the causal triangle's (every query's)."""
    return float((idx.double() + 1).sum(dim=1).mean()) / (T * (T + 1) / 2)


@contextmanager
def module_ranges(layer: nn.Module) -> Iterator[None]:
    """Profiler ranges named MODULE_PREFIX + submodule name around every call of the layer's listed submodules."""
    handles, open_ranges = [], {}
    for name, module in layer.named_modules():
        short = name.rsplit(".", 1)[-1]
        if short not in MODULE_PHASES:
            continue

        def enter(mod, args, _short=short):
            rf = torch.profiler.record_function(MODULE_PREFIX + _short)
            rf.__enter__()
            open_ranges.setdefault(id(mod), []).append(rf)

        def leave(mod, args, out):
            open_ranges[id(mod)].pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _phase_of(event: Any) -> str:
    """The innermost phase an operator ran in; the attention kernel by its own name, since the dense attention
    module runs it with no mark of ours."""
    if any(n in event.name for n in ATTENTION_OPS):
        return "attention kernel"
    node = event.cpu_parent
    while node is not None:
        name = node.name
        if name.startswith(phase_marks.PREFIX):
            return MARK_PHASES.get(name[len(phase_marks.PREFIX):], "other")
        if name.startswith(MODULE_PREFIX):
            return MODULE_PHASES[name[len(MODULE_PREFIX):]]
        node = node.cpu_parent
    return "other"


def phase_times(fn: Callable[[], Any], layer: nn.Module, device: torch.device) -> tuple[dict[str, float], float]:
    """One profiled call of fn: self time per phase (ms) of its operators, and its wall time (ms) under the
    profiler."""
    from torch.profiler import ProfilerActivity, profile  # lazily: only a profiled run needs it

    times = dict.fromkeys(PHASES, 0.0)
    with module_ranges(layer), phase_marks.marking(), profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        synchronize(device)
        wall = (time.perf_counter() - start) * 1e3
    for event in prof.events():
        if event.name.startswith((phase_marks.PREFIX, MODULE_PREFIX)):
            continue  # our ranges: their own time is the profiler's bookkeeping
        times[_phase_of(event)] += event.self_cpu_time_total / 1e3
    return times, wall


def profile_phases(dense: Callable[[], Any], selective: Callable[[], Any], layer: nn.Module, device: torch.device,
                   ratio: float, attn_share: float, heads: tuple[int, int], calls: int = 5) -> dict[str, Any]:
    """Per phase: the dense and the selective layer's time (medians of `calls` profiled calls, alternating), the
    selective phase's ideal and its excess over it, in ms and in points of the dense layer's profiled time."""
    runs: dict[str, list[dict[str, float]]] = {"dense": [], "selective": []}
    for _ in range(calls):
        for name, fn in (("dense", dense), ("selective", selective)):
            runs[name].append(phase_times(fn, layer, device)[0])

    def median(name: str, phase: str) -> float:
        values = sorted(r[phase] for r in runs[name])
        return values[len(values) // 2]

    shares = phase_ideal_shares(ratio, attn_share, *heads)
    dense_total = sum(median("dense", p) for p in PHASES)
    rows = {}
    for p in PHASES:
        d, s = median("dense", p), median("selective", p)
        ideal = d * shares[p]
        rows[p] = {"dense_ms": d, "selective_ms": s, "ideal_ms": ideal, "excess_ms": s - ideal,
                   "excess_points": 100.0 * (s - ideal) / dense_total if dense_total else None}
    sel_total = sum(r["selective_ms"] for r in rows.values())
    ideal_total = sum(r["ideal_ms"] for r in rows.values())
    return {"calls": calls, "ratio": ratio, "attention_share": attn_share, "phases": rows,
            "dense_ms": dense_total, "selective_ms": sel_total, "ideal_ms": ideal_total,
            "selective_fraction": sel_total / dense_total if dense_total else None,
            "ideal_fraction": ideal_total / dense_total if dense_total else None,
            "note": "operator self times under the profiler (medians of alternating profiled calls); time between "
                    "operators (Python, dispatch) is in no phase"}


def format_phases(prof: dict[str, Any]) -> str:
    lines = [f"  phases (medians of {prof['calls']} profiled calls; ideal: keep ratio {prof['ratio']:.3f}, attention "
             f"share {prof['attention_share']:.3f}):",
             f"  {'phase':18s} {'dense ms':>9s} {'selective':>9s} {'ideal':>8s} {'excess':>8s} {'points':>7s}"]
    for p, r in prof["phases"].items():
        if r["dense_ms"] == 0 and r["selective_ms"] == 0:
            continue
        lines.append(f"  {p:18s} {r['dense_ms']:9.2f} {r['selective_ms']:9.2f} {r['ideal_ms']:8.2f} "
                     f"{r['excess_ms']:8.2f} {r['excess_points']:7.1f}")
    lines.append(f"  {'total':18s} {prof['dense_ms']:9.2f} {prof['selective_ms']:9.2f} {prof['ideal_ms']:8.2f} "
                 f"{prof['selective_ms'] - prof['ideal_ms']:8.2f}   (selective {prof['selective_fraction']:.3f} of "
                 f"dense, ideal {prof['ideal_fraction']:.3f})")
    return "\n".join(lines)
