"""Run throughput benchmarks: prefill, decode, and one decoder layer alone.

Prefill runs the decoder over B x T tokens and the LM head on the last position (LastTokenForward); decode times
greedy steps after an untimed prompt, with the KV cache. Methods are compared side by side on one loaded model: plans are applied and undone in place (apply_hybrid /
prune_layers / restore_dense), warm-up runs come first, then timed rounds interleave the methods (rotating their
order each round) so that drift of the machine's speed hits all of them alike.
"""

from __future__ import annotations

import dataclasses
import copy
import gc
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.harness.evaluation.continuation import UpdateCounter
from orthorank.method.apply import restore_dense
from orthorank.method.cost import Arch, hybrid_compute_sparsity
from orthorank.method.selection import SelectionConfig
from orthorank.models.adapters import get_adapter
from orthorank.models.last_token import LastTokenForward
from orthorank.models.static_decode import StaticDecoder
from orthorank.harness.runtime.bandwidth import decode_bound, decode_head_share, decode_step_bytes, process_bandwidth
from orthorank.harness.runtime.costmodel import (
    flop_layer_cost, ideal_speedup, kv_fraction, selective_layer_cost, with_fixed_share,
)
from orthorank.harness.runtime.timing import (
    current_memory_mib, interleaved_rounds, peak_memory, random_ids, reset_peak_memory, summarize, time_call,
)
from orthorank.harness.speed.specs import MethodSpec

MODES = ("prefill", "decode", "layer")


@dataclass
class RunSettings:
    mode: str
    batch: int
    seq_len: int
    new_tokens: int = 0
    warmup: int = 1
    repeats: int = 5
    use_cache: bool = False  # prefill only; decode always uses the cache
    seed: int = 0
    decode_impl: str = "eager"  # eager (dynamic cache), static (static cache), compile (static cache, compiled step)
    prompts: torch.Tensor | None = None  # [n, >= seq_len] token ids from text (rows reused in turn); None: random


def workload_ids(settings: RunSettings, vocab: int, device: torch.device) -> torch.Tensor:
    """[batch, seq_len] prompt ids: rows of settings.prompts (cycled to the batch) or seeded random tokens."""
    if settings.prompts is None:
        return random_ids(vocab, settings.batch, settings.seq_len, device, settings.seed)
    rows = torch.arange(settings.batch) % settings.prompts.shape[0]
    return settings.prompts[rows, :settings.seq_len].to(device)


@dataclass
class _Measured:
    spec: MethodSpec
    times: list[float] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)


def _workload(model: nn.Module, settings: RunSettings, device: torch.device) -> Callable[[], float]:
    """A callable that runs one repetition and returns its timed seconds."""
    cfg = model.config
    ids = workload_ids(settings, cfg.vocab_size, device)
    forward = LastTokenForward(model)
    if settings.mode == "prefill":
        def prefill() -> float:
            return time_call(lambda: forward(ids, use_cache=settings.use_cache), device)
        return prefill

    if settings.decode_impl != "eager":
        holder: dict[str, StaticDecoder] = {}

        def static_decode() -> float:
            if "decoder" not in holder:  # built at the first call, after the method's plan is applied
                holder["decoder"] = StaticDecoder(model, settings.batch, settings.seq_len + settings.new_tokens + 1,
                                                  settings.decode_impl)
                dec = holder["decoder"]
                dec.step(dec.prefill(ids).argmax(-1, keepdim=True))  # compiles the step: not timed
            dec = holder["decoder"]
            state = {"next": dec.prefill(ids).argmax(-1, keepdim=True)}  # the prompt: not timed

            def steps() -> None:
                for _ in range(settings.new_tokens):
                    state["next"] = dec.step(state["next"]).argmax(-1, keepdim=True)

            return time_call(steps, device)
        return static_decode

    def decode() -> float:
        state = _greedy_prompt(forward, ids)  # the prompt: not timed
        seconds = time_call(lambda: _greedy_steps(forward, state, settings.new_tokens), device)
        state.clear()
        return seconds
    return decode


def _greedy_prompt(forward: LastTokenForward, ids: torch.Tensor) -> dict[str, Any]:
    """The decode loop's state after the prompt: its KV cache and the greedy next token."""
    logits, cache = forward(ids, use_cache=True)
    return {"cache": cache, "next": logits.argmax(-1, keepdim=True)}


def _greedy_steps(forward: LastTokenForward, state: dict[str, Any], steps: int,
                  after_step: Callable[[], None] | None = None) -> None:
    """Greedy decode steps through the KV cache in `state` (updated in place)."""
    for _ in range(steps):
        logits, state["cache"] = forward(state["next"], use_cache=True, cache=state["cache"])
        state["next"] = logits.argmax(-1, keepdim=True)
        if after_step is not None:
            after_step()


@torch.no_grad()
def decoded_update_share(model: nn.Module, spec: MethodSpec, settings: RunSettings, device: torch.device) -> float:
    """The share of decoded tokens the selection layers updated in the workload's greedy steps (the threshold decode
    policy skips the rest): one untimed eager run of the same prompt and steps, counting after every step."""

    spec.apply(model)
    try:
        forward = LastTokenForward(model)
        ids = workload_ids(settings, model.config.vocab_size, device)
        state = _greedy_prompt(forward, ids)
        counter = UpdateCounter(model)
        _greedy_steps(forward, state, settings.new_tokens, lambda: counter.step(settings.batch))
        return counter.share if counter.share is not None else 1.0
    finally:
        restore_dense(model)


def _applied_copy(model: nn.Module, spec: MethodSpec) -> nn.Module:
    twin = copy.deepcopy(model)
    spec.apply(twin)
    return twin


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_methods(model: nn.Module, specs: list[MethodSpec], settings: RunSettings, device: torch.device,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time each method on one workload; returns the run's record."""
    num_layers = len(get_adapter(model).layers(model))
    if settings.mode == "decode" and settings.new_tokens < 1:
        raise UserError("--mode decode needs --new-tokens of at least 1")
    tokens = settings.batch * (settings.seq_len if settings.mode == "prefill" else settings.new_tokens)
    measured = [_Measured(s) for s in specs]
    base_mib = current_memory_mib(device)
    bandwidth = process_bandwidth(device) if settings.mode == "decode" else None
    _time_methods(model, measured, settings, device, log)

    f_kv = kv_fraction(model.config)
    # threshold decoding: what the selection layers skipped depends on the text, so the ideal is taken at the share
    # of decoded tokens they actually updated (counted in one more, untimed run)
    shares = {m.spec.name: decoded_update_share(model, m.spec, settings, device) for m in measured
              if settings.mode == "decode" and m.spec.kind.selects
              and (m.spec.selection or SelectionConfig()).decode in ("threshold", "causal")}
    stats = {m.spec.name: summarize(m.times) for m in measured}
    head_share = decode_head_share(model) if settings.mode == "decode" else 0.0
    dense_t = next((stats[m.spec.name]["median_s"] for m in measured if m.spec.kind.dense), None)
    removal = [m for m in measured if m.spec.kind.removes and not m.spec.kind.selects]  # layer removal's row
    prune_t = stats[removal[0].spec.name]["median_s"] if removal else None
    dense_min = next((stats[m.spec.name]["min_s"] for m in measured if m.spec.kind.dense), None)
    arch = Arch.from_config(model.config, num_layers)
    rows = [_method_row(model, m, stats[m.spec.name], settings, arch, num_layers, f_kv, head_share, shares,
                        dense_t, prune_t, dense_min, tokens, base_mib, bandwidth) for m in measured]
    return {
        "mode": settings.mode,
        "batch": settings.batch,
        "seq_len": settings.seq_len,
        "new_tokens": settings.new_tokens if settings.mode == "decode" else None,
        "use_cache": True if settings.mode == "decode" else settings.use_cache,
        **({"decode_impl": settings.decode_impl} if settings.mode == "decode" else {}),
        # the LM head's share of a dense decode step's weight bytes, in every decode row's ideal
        **({"head_share": round(head_share, 6)} if settings.mode == "decode" else {}),
        "tokens_per_run": tokens,
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "methods": rows,
        "analysis": _implied_layer_cost(rows, num_layers) if settings.mode == "prefill" else None,
        **({"copy_bandwidth_gb_s": bandwidth / 1e9} if bandwidth is not None else {}),
    }


def _method_row(model: nn.Module, m: "_Measured", st: dict[str, Any], settings: RunSettings, arch: Arch,
                num_layers: int, f_kv: float, head_share: float, shares: dict[str, float], dense_t: float | None,
                prune_t: float | None, dense_min: float | None, tokens: int, base_mib: float | None,
                bandwidth: float | None) -> dict[str, Any]:
    """One method's record: its timing against dense and layer removal, its ideal speed-ups (FLOPs and weights),
    compute sparsity, memory and, for decode, the bandwidth bound."""
    s = m.spec
    sel = s.selection or SelectionConfig()
    if s.per_layer:  # costs are affine in the keep ratio, so the mean ratio gives the plan's total exactly
        sel = dataclasses.replace(sel, ratio=sum(s.ratios()) / len(s.layers))
    # prefill: FLOPs with attention at this prompt length; decode: weights (one new token per step)
    cost = flop_layer_cost(model.config, settings.seq_len, sel.ratio) if settings.mode == "prefill" else None
    removed, selected = len(s.removed_layers), len(s.selection_layers)
    if s.name in shares and not s.kind.per_layer:
        # a selection layer at the updated share u costs f_kv + (1 - f_kv) u of a dense one
        ideal = ideal_w = ideal_speedup(num_layers, removed, selected, f_kv, shares[s.name], "prefill")
    else:  # removed layers cost nothing; selection layers their share of a dense one
        ideal = ideal_speedup(num_layers, removed, selected, f_kv, sel.ratio, settings.mode, sel.decode, cost)
        ideal_w = ideal_speedup(num_layers, removed, selected, f_kv, sel.ratio, settings.mode, sel.decode)
    # decode is bound by the bytes a step reads, and every method reads the whole LM head each step
    ideal, ideal_w = with_fixed_share(ideal, head_share), with_fixed_share(ideal_w, head_share)
    speedup = dense_t / st["median_s"] if dense_t else None
    arch = Arch.from_config(model.config, num_layers)
    comp = hybrid_compute_sparsity(arch, settings.seq_len, removed, s.ratios())
    row = {
        "method": s.name,
        "kind": s.kind.name,
        "layers": s.layers,
        **({"removed_layers": s.removed} if s.kind.per_layer else {}),
        "changed_layers": len(s.layers) + len(s.removed),
        "layers_from": s.source,
        "effective_sparsity": round(s.effective_sparsity(num_layers), 6),
        "sparsity": {
            "nominal": round(s.effective_sparsity(num_layers), 6),
            "compute": round(comp, 6),
            "compute_seq_len": settings.seq_len,
            "measured_speedup": speedup,
        },
        "timing": st,
        "tokens_per_s": tokens / st["median_s"],
        "speedup_vs_dense": speedup,
        # From the fastest run of each method: less sensitive to other load on a shared CPU.
        "speedup_vs_dense_best_runs": dense_min / st["min_s"] if dense_min else None,
        "throughput_vs_layer_removal": prune_t / st["median_s"] if prune_t else None,
        "ideal_speedup": ideal,
        "ideal_speedup_weights_only": ideal_w,
        "pct_of_ideal": 100.0 * speedup / ideal if speedup and ideal else None,
        # Share of the ideal *gain* reached, (speed-up - 1) / (ideal - 1): the stricter figure.
        "pct_of_ideal_gain": (100.0 * (speedup - 1.0) / (ideal - 1.0)
                              if speedup and ideal and ideal > 1.0 + 1e-9 else None),
        "memory": {**m.memory, **({"weights_mib": base_mib} if base_mib is not None else {})},
    }
    if bandwidth is not None:
        # KV cache read at the timed steps' mean context
        step = decode_step_bytes(model, s.removed_layers, settings.batch,
                                 settings.seq_len + (settings.new_tokens + 1) // 2)
        bound = decode_bound(step, settings.batch, bandwidth)
        row["decode_bytes_per_step"] = step
        row["bandwidth_bound_tokens_per_s"] = bound
        row["pct_of_bandwidth_bound"] = 100.0 * row["tokens_per_s"] / bound
        if s.kind.selects and sel.decode != "dense":
            row["bandwidth_bound_note"] = "as if every kept layer ran (bypassed steps read less): a lower bound"
    if s.name in shares:
        row["decoded_tokens_updated"] = shares[s.name]
        row["ideal_note"] = "weights model at the share of decoded tokens the selection layers updated"
    if s.kind.selects:
        row["selection"] = sel.to_dict()
        row["ideal_selective_layer_cost"] = cost if cost is not None else selective_layer_cost(f_kv, sel.ratio)
        row["ideal_selective_layer_cost_weights_only"] = selective_layer_cost(f_kv, sel.ratio)
    return row


def _time_methods(model: nn.Module, measured: list["_Measured"], settings: RunSettings, device: torch.device,
                  log: Callable[[str], None]) -> None:
    """Every method's timed runs (into each _Measured's times and memory), in interleaved rounds."""
    try:
        with torch.inference_mode():
            # one workload per method where it holds per-plan state (a static cache and the step compiled for it)
            # A static cache and a step compiled for one plan: each method decodes its own copy of the model with its
            # plan applied once (re-applying a plan per round would invalidate the compiled graph in the timed part).
            own = settings.mode == "decode" and settings.decode_impl != "eager"
            models = {m.spec.name: _applied_copy(model, m.spec) if own else model for m in measured}
            shared = None if own else _workload(model, settings, device)
            works = {name: _workload(mm, settings, device) if own else shared for name, mm in models.items()}

            by_name = {m.spec.name: m for m in measured}

            def run_one(name: str) -> float:
                m = by_name[name]
                if not own:
                    m.spec.apply(model)
                try:
                    reset_peak_memory(device)
                    seconds = works[name]()
                    for key, value in peak_memory(device).items():
                        m.memory[key] = max(m.memory.get(key, 0.0), value)
                    return seconds
                finally:
                    if not own:
                        restore_dense(model)

            names = list(by_name)
            # compiling is never timed; the warm-up's memory is released before the timed rounds
            interleaved_rounds(names, run_one, repeats=0, warmup=max(settings.warmup, 1 if own else 0))
            for m in measured:
                m.memory.clear()
            _release(device)
            times = interleaved_rounds(names, run_one, settings.repeats, warmup=0, on_round=lambda r, t: log(
                f"  round {r + 1}/{settings.repeats}: " + ", ".join(f"{n} {t[n][-1] * 1e3:.1f} ms" for n in names)))
            for m in measured:
                m.times.extend(times[m.spec.name])
    finally:
        restore_dense(model)
        _release(device)


def _implied_layer_cost(rows: list[dict[str, Any]], num_layers: int) -> dict[str, Any] | None:
    """From dense (L layers), layer removal (L - p) and OrthoRank (n selection layers) medians, infer one dense
    layer's time l, the rest of the model e (embedding, head), and a selection layer's cost as a fraction of l."""
    by_kind = {r["kind"]: r for r in rows}
    if not all(k in by_kind for k in ("dense", "prune", "orthorank")):
        return None
    td, tp, to = (by_kind[k]["timing"]["median_s"] for k in ("dense", "prune", "orthorank"))
    p, n = by_kind["prune"]["changed_layers"], by_kind["orthorank"]["changed_layers"]
    if p == 0 or n == 0:
        return None
    layer_s = (td - tp) / p
    rest_s = td - num_layers * layer_s
    cost = (to - rest_s - (num_layers - n) * layer_s) / (n * layer_s) if layer_s > 0 else None
    return {
        "dense_layer_s": layer_s,
        "rest_of_model_s": rest_s,
        "implied_selective_layer_cost": cost,
        "ideal_selective_layer_cost": by_kind["orthorank"].get("ideal_selective_layer_cost"),
        "note": "estimated from end-to-end medians; noisy when the time difference between methods is small",
    }


# ----------------------------------------------------------------------------------------------------------------
# One decoder layer alone
