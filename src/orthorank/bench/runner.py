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
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.evaluation.continuation import UpdateCounter
from orthorank.method import attention_split, orthogonality
from orthorank.method.apply import apply_hybrid, restore_dense
from orthorank.method.attention import SPLIT_MIN_KEYS, _sdpa, query_chunks
from orthorank.method.cost import Arch, removal_sparsity, hybrid_compute_sparsity
from orthorank.method.layer import SelectiveLayer, SequenceContext
from orthorank.method.local_attention import LocalAttention, local_attention, mean_keys_read
from orthorank.method.orthogonality import sink_scores
from orthorank.method.plan import Plan, layers_for_sparsity
from orthorank.method.plan_store import find_plan
from orthorank.method.kinds import PlanKind
from orthorank.method.registry import benched, get_method
from orthorank.method.selection import SelectionConfig, keep_count, keep_to_indices
from orthorank.models.adapters import get_adapter
from orthorank.models.last_token import LastTokenForward
from orthorank.models.static_decode import StaticDecoder
from orthorank.runtime.bandwidth import decode_bound, decode_head_share, decode_step_bytes, process_bandwidth
from orthorank.runtime.costmodel import (
    flop_layer_cost, ideal_speedup, kv_fraction, selective_layer_cost, spread_layers, with_fixed_share,
)
from orthorank.runtime.timing import (
    current_memory_mib, interleaved_rounds, peak_memory, random_ids, reset_peak_memory, summarize, synchronize,
    time_call,
)

MODES = ("prefill", "decode", "layer")


@dataclass
class MethodSpec:
    name: str
    kind: PlanKind  # method/kinds/: what the method does to the model
    layers: list[int]  # the layers it changes: the selection layers where its kind selects, else the removed ones
    source: str = "spread"  # "spread" (evenly spread at the sparsity) or the plan file it came from
    selection: SelectionConfig | None = None
    removed: list[int] = field(default_factory=list)  # hybrid: removed layers (`layers` are its selection layers)
    # a saved hybrid plan's own selection per layer (keep ratios may differ by layer); None: `selection` everywhere
    per_layer: dict[int, SelectionConfig] | None = None
    decode_only: bool = False  # a variant that differs only in its decode policy: timed in decode mode only

    @property
    def selection_layers(self) -> list[int]:
        return self.layers if self.kind.selects else []

    @property
    def removed_layers(self) -> list[int]:
        """Layers this method does not run at all."""
        return self.removed if self.kind.selects else self.layers

    def ratios(self) -> list[float]:
        """The keep ratio of each selection layer."""
        if self.per_layer is not None:
            return [self.per_layer[i].ratio for i in self.selection_layers]
        return [self.selection.ratio for _ in self.selection_layers]

    def effective_sparsity(self, num_layers: int) -> float:
        """The paper's nominal measure: (removed + the skipped share of each selection layer) / L."""
        return (len(self.removed_layers) + sum(1.0 - r for r in self.ratios())) / num_layers

    def apply(self, model: nn.Module) -> None:
        if self.kind.dense:
            restore_dense(model)
        else:
            apply_hybrid(model, self.removed_layers,
                         self.per_layer or {i: self.selection for i in self.selection_layers})


def method_specs(methods: list[str], num_layers: int, sparsity: float, selection: SelectionConfig,
                 plans: list[tuple[str, Plan]] = (), model_name: str | None = None,
                 arch: Arch | None = None, seq_len: int | None = None) -> list[MethodSpec]:
    """Layers per method (names from orthorank.method.registry): a searched method's saved plan at the sparsity, evenly
    spread layers for spread-prune / spread-orthorank; a --plan file of the same kind overrides either."""

    specs = []
    for name in methods:
        method = get_method(name, benched())
        kind = method.kind
        if kind.dense:
            specs.append(MethodSpec(name, kind, [], source="-"))
            continue
        spec = MethodSpec(name, kind, [], selection=selection if kind.selects and not kind.per_layer else None)
        override = [(path, plan) for path, plan in plans if plan.kind is kind]
        if override:
            path, plan = override[-1]
            spec.layers, spec.source = list(plan.layers), str(path)
        elif method.layers == "plan":
            if model_name is None:
                raise UserError(f"method {name} uses its saved plan; pass --plan FILE")
            path = find_plan(model_name, method.plan_label, sparsity)
            plan = Plan.load(path)
            spec.layers, spec.source = list(plan.layers), str(path)
        from_plan = bool(override) or method.layers == "plan"
        if kind.per_layer and from_plan:  # a saved hybrid plan: its removals and its selection per layer
            spec.removed, spec.per_layer = list(plan.removed_layers), dict(plan.selection_layers)
            spec.layers = sorted(spec.per_layer)
            spec.selection = next(iter(spec.per_layer.values()), selection)
        elif kind.per_layer:
            spec.selection = selection
            spec.removed, spec.layers = spread_hybrid_layers(sparsity, num_layers, selection.ratio, arch,
                                                             seq_len or 2048)
        elif not from_plan:
            count = layers_for_sparsity(sparsity, num_layers, kind.name, selection.ratio, match=method.match,
                                        arch=arch, seq_len=seq_len or 2048, inner_only=False)
            spec.layers = spread_layers(count, num_layers)
        if kind.selects and not kind.per_layer and from_plan:
            spec.selection = plan.selection
        if len(spec.removed_layers) >= num_layers:
            raise UserError("layer removal at this sparsity would remove every layer")
        specs.append(spec)
    if len({s.name for s in specs}) != len(specs):
        raise UserError("--methods lists a method twice")
    return specs


def spread_hybrid_layers(sparsity: float, num_layers: int, ratio: float, arch: Arch | None,
                         seq_len: int) -> tuple[list[int], list[int]]:
    """A hybrid point for speed measurements on random shapes (no calibration): half of layer removal's
    ceil(s L) layers removed (evenly spread), and the fewest evenly spread selection layers among the rest whose
    FLOPs at seq_len make up the other half's compute (all of the rest when even that falls short)."""
    p = layers_for_sparsity(sparsity, num_layers, "prune", 1.0, inner_only=False)
    removed = spread_layers(p // 2, num_layers)
    rest = [i for i in range(num_layers) if i not in removed]
    if arch is None or p - len(removed) == 0:
        return removed, []
    target = removal_sparsity(arch, seq_len, p)
    for n in range(1, len(rest) + 1):
        if hybrid_compute_sparsity(arch, seq_len, len(removed), [ratio] * n) >= target - 1e-12:
            break
    picks = spread_layers(n, len(rest))
    return removed, [rest[j] for j in picks]


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


@dataclass
class _Measured:
    spec: MethodSpec
    times: list[float] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)


def _workload(model: nn.Module, settings: RunSettings, device: torch.device) -> Callable[[], float]:
    """A callable that runs one repetition and returns its timed seconds."""
    cfg = model.config
    ids = random_ids(cfg.vocab_size, settings.batch, settings.seq_len, device, settings.seed)
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
        ids = random_ids(model.config.vocab_size, settings.batch, settings.seq_len, device, settings.seed)
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
              and (m.spec.selection or SelectionConfig()).decode == "threshold"}
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


def run_layer(model: nn.Module, selection: SelectionConfig, settings: RunSettings, device: torch.device,
              layer_index: int | None = None, profile: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time one dense decoder layer against the same layer wrapped as a selection layer, and the selection step
    (scoring alone, scoring + top-K) alone, on random hidden states with no padding and no cache."""

    adapter = get_adapter(model)
    restore_dense(model)
    layers = adapter.layers(model)
    idx = len(layers) // 2 if layer_index is None else layer_index
    if not 0 <= idx < len(layers):
        raise UserError(f"--layer-index {idx} is out of range for {len(layers)} layers")
    layer = layers[idx]
    cfg = model.config
    dtype = next(layer.parameters()).dtype
    B, T = settings.batch, settings.seq_len
    gen = torch.Generator().manual_seed(settings.seed)
    with torch.inference_mode():
        h = torch.randn(B, T, cfg.hidden_size, generator=gen).to(device=device, dtype=dtype)
        pos = torch.arange(T, device=device).unsqueeze(0)
        pos_emb = adapter.position_embeddings(model, h, pos, idx)
        kwargs = dict(attention_mask=None, position_ids=pos, position_embeddings=pos_emb, use_cache=False)
        context = SequenceContext()
        wrapper = SelectiveLayer(layer, adapter, selection, context, idx)
        x = adapter.attention_input(layer, h)
        src = adapter.score_input(h, x) if selection.source == "normed" else h
        sink = src[:, 0]
        if hasattr(wrapper, "select_indices"):
            def select() -> Any:
                return wrapper.select_indices(h, x)
        else:  # the pre-optimization layer
            def select() -> Any:
                return keep_to_indices(wrapper._select(h, x, 0))
        unchunked = SelectiveLayer(layer, adapter, selection, SequenceContext(), idx)
        unchunked.max_attention_chunks = 1
        arch = Arch.from_config(cfg, 1)
        path, chunks = query_chunks(keep_count(T, selection.ratio), T, arch.heads // arch.kv_heads, wrapper._window,
                                    wrapper.max_attention_chunks, wrapper.min_chunk_keys, True, device.type == "cpu")
        types = getattr(cfg, "layer_types", None)
        sliding = isinstance(types, list) and "sliding" in str(types[idx])  # a window: not the causal comparison
        attention = {} if sliding else _attention_alone(cfg, select(), T, wrapper, dtype, device, settings.seed)
        fns = {
            **attention,
            "dense_layer": lambda: layer(h, **kwargs),
            "selective_layer": lambda: wrapper(h, **kwargs),
            "selective_layer_unchunked": lambda: unchunked(h, **kwargs),
            "input_norm": lambda: adapter.attention_input(layer, h),
            "scoring": lambda: sink_scores(src, sink, selection.criterion),
            "scoring_and_topk": select,
        }
        times = interleaved_rounds(
            list(fns), lambda name: time_call(fns[name], device), settings.repeats, settings.warmup, rotate=False,
            on_round=lambda r, t: log(f"  round {r + 1}/{settings.repeats}: dense {t['dense_layer'][-1] * 1e3:.1f} "
                                      f"ms, selective {t['selective_layer'][-1] * 1e3:.1f} ms"))
        prof = None
        if profile:
            try:
                prof = _profile(fns, device)
            except Exception as exc:  # the profiler is a diagnostic: never lose the timings to it
                prof = {"error": f"{type(exc).__name__}: {exc}"}
    stats = {k: summarize(v) for k, v in times.items()}
    dense = stats["dense_layer"]["median_s"]
    frac = stats["selective_layer"]["median_s"] / dense
    f_kv = kv_fraction(cfg)
    ideal = flop_layer_cost(cfg, T, selection.ratio)
    synchronize(device)
    return {
        "mode": "layer",
        "batch": B,
        "seq_len": T,
        "layer_index": idx,
        **({"layer_type": cfg.layer_types[idx]} if isinstance(getattr(cfg, "layer_types", None), list) else {}),
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "kept_tokens_per_row": keep_count(T, selection.ratio),
        "timing": stats,
        "selective_cost_fraction": frac,
        "ideal_selective_cost_fraction": ideal,  # FLOPs with attention at seq_len
        "ideal_selective_cost_fraction_weights_only": selective_layer_cost(f_kv, selection.ratio),
        "pct_of_ideal": 100.0 * ideal / frac,
        "input_norm_fraction_of_dense": stats["input_norm"]["median_s"] / dense,
        "scoring_fraction_of_dense": stats["scoring"]["median_s"] / dense,
        "selection_fraction_of_dense": stats["scoring_and_topk"]["median_s"] / dense,
        "unchunked_attention_cost_fraction": stats["selective_layer_unchunked"]["median_s"] / dense,
        "attention_chunks": len(chunks),
        "attention_path": path,
        # the attention of the selected queries alone, against the dense layer's causal kernel on the same keys
        **({"attention_alone": {
            "masked_fraction_of_causal": stats["attention_masked"]["median_s"] / stats["attention_causal"]["median_s"],
            "split_fraction_of_causal": stats["attention_split"]["median_s"] / stats["attention_causal"]["median_s"],
            "query_fraction": keep_count(T, selection.ratio) / T,
            "causal_share_of_dense_layer": stats["attention_causal"]["median_s"] / dense,
            "in_use": path,
            "local_fraction_of_causal": stats["attention_local"]["median_s"] / stats["attention_causal"]["median_s"],
            # what time would be if it followed the keys read (method/local_attention.py's cost model)
            "local_ideal_fraction_of_causal": mean_keys_read(T, LocalAttention()) / ((T + 1) / 2),
            "note": "masked: method/attention.py's query chunks with a boolean mask; split: method/attention_split.py "
                    "(prefix unmasked + diagonal masked, merged by log-sum-exp), which full-attention selection "
                    f"layers use on CPU from {SPLIT_MIN_KEYS} keys on; local: the local schedule's blocked kernel "
                    "(method/local_attention.py) over every query"}}
           if "attention_split" in stats else {}),
        "scores_bmm_out_dtype": _bmm_flag(),
        "profile": prof,
    }


def _attention_alone(cfg, selected, T: int, wrapper, dtype: torch.dtype, device: torch.device,
                     seed: int) -> dict[str, Callable[[], Any]]:
    """The attention of one layer alone on random q/k/v of its shapes (no padding, keys from position 0): the dense
    causal kernel over every query, the masked SDPA over the selected queries as selection layers run it, and the
    prefix/diagonal split (method/attention_split.py) where this torch has its kernel. Empty when a layer shape has
    no separate K/V heads (nothing to time)."""

    if selected is None or device.type != "cpu":
        return {}
    arch = Arch.from_config(cfg, 1)
    H, Hkv, hd = arch.heads, arch.kv_heads, arch.head_dim
    idx = selected[0]  # [B, K] positions, in order
    B, K = idx.shape
    gen = torch.Generator().manual_seed(seed + 1)
    q_all, k, v = (torch.randn(B, n, T, hd, generator=gen).to(device=device, dtype=dtype) for n in (H, Hkv, Hkv))
    q_sel = torch.gather(q_all, 2, idx[:, None, :, None].expand(B, H, K, hd))
    q_rows = q_sel.transpose(1, 2)  # [B, K, H, d] as selection layers hand it over
    scale = hd ** -0.5
    _, chunks = query_chunks(K, T, H // Hkv, None, wrapper.max_attention_chunks, wrapper.min_chunk_keys, True)
    fns = {
        "attention_causal": lambda: torch.nn.functional.scaled_dot_product_attention(
            q_all, k, v, is_causal=True, scale=scale, enable_gqa=H > Hkv),
        "attention_masked": lambda: _sdpa(q_rows, idx, k, v, scale, 0, None, None, None, wrapper.max_attention_chunks,
                                          wrapper.min_chunk_keys, split=False),
    }
    if attention_split.available():
        fns["attention_split"] = lambda: attention_split.split_attention(q_sel, idx, k, v, scale, chunks)
    local = LocalAttention()  # the local schedule's pattern: every query, a window instead of every key
    fns["attention_local"] = lambda: local_attention(q_all, k, v, scale=scale, cfg=local)
    return fns


def _bmm_flag() -> bool | None:
    return orthogonality.BMM_OUT_DTYPE_OK


# Operator families of a layer's profile, by aten name (self time: a composite op such as aten::linear counts only
# what it does itself, its matmul under "matmul"). First match wins; the rest is "elementwise" (norms, RoPE,
# activations, residual adds, scoring's products).
PROFILE_CATEGORIES = (
    ("attention kernel", ("scaled_dot_product", "flash_attention", "efficient_attention", "softmax", "logsumexp")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm", "aten::_weight_int")),
    ("gather / scatter / copy", ("index", "gather", "scatter", "copy", "clone", "cat", "contiguous", "take",
                                 "masked_select", "nonzero", "stack", "to_copy")),
    ("sort / top-K", ("sort", "topk", "argmax", "argmin", "kthvalue")),
)


def profile_category(op: str) -> str:
    name = op.lower()
    for category, needles in PROFILE_CATEGORIES:
        if any(n in name for n in needles):
            return category
    return "elementwise"


def profile_families(fn: Callable[[], Any], device: torch.device, calls: int = 1,
                     rows: int = 18) -> tuple[str, dict[str, float], float]:
    """fn's operator table (its first profiled call), its self time per operator family in ms and its wall time
    in ms, each the mean of `calls` profiled calls. Time between operators (Python, dispatch, and the profiler's
    own bookkeeping, since the wall time is taken under the profiler) is in no family."""
    from torch.profiler import ProfilerActivity, profile  # lazily: only a profiled bench run needs it

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = ""
    totals = {c: 0.0 for c, _ in PROFILE_CATEGORIES} | {"elementwise": 0.0}
    wall = 0.0
    for i in range(calls):
        with profile(activities=acts) as p:
            start = time.perf_counter()
            fn()
            synchronize(device)
            wall += (time.perf_counter() - start) * 1e3 / calls
        averages = p.key_averages()
        if i == 0:
            table = averages.table(sort_by=key, row_limit=rows)
        for event in averages:
            totals[profile_category(event.key)] += getattr(event, key) / 1e3 / calls
    return table, totals, wall


def _profile(fns: dict[str, Callable[[], Any]], device: torch.device, calls: int = 3) -> dict[str, Any]:
    """The operator tables of the dense and the selective layer (from the first profiled call of each), and their
    self time per operator family per call (`categories`, ms; the mean of `calls` profiled calls, alternating dense
    and selective so both see the same machine): where the selective layer spends more than its share of the dense
    layer's time."""
    out: dict[str, Any] = {"calls": calls}
    categories: dict[str, dict[str, float]] = {}
    for i in range(calls):
        for name in ("dense_layer", "selective_layer"):
            table, totals, _ = profile_families(fns[name], device)
            if i == 0:
                out[name] = table
            categories[name] = {c: categories.get(name, {}).get(c, 0.0) + v / calls for c, v in totals.items()}
    out["categories"] = {c: {"dense_ms": categories["dense_layer"][c], "selective_ms": categories["selective_layer"][c],
                             "selective_over_dense": (categories["selective_layer"][c] / categories["dense_layer"][c]
                                                      if categories["dense_layer"][c] > 0 else None)}
                         for c in categories["dense_layer"]}
    return out
