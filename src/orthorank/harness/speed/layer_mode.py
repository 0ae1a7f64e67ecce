"""Bench's layer mode: one decoder layer alone, dense against selective at each ratio, plus the selection step and
the attention alone; and the profiler tables that split a run's time into operator families."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.method import attention_split, orthogonality
from orthorank.method.apply import restore_dense
from orthorank.method.attention import SPLIT_MIN_KEYS, _sdpa, query_chunks
from orthorank.method.cost import Arch
from orthorank.method.layer import SelectiveLayer, SequenceContext
from orthorank.method.local_attention import LocalAttention, local_attention, mean_keys_read
from orthorank.method.orthogonality import sink_scores
from orthorank.method.selection import SelectionConfig, keep_count, keep_to_indices
from orthorank.models.adapters import FamilyAdapter, get_adapter
from orthorank.harness.runtime.costmodel import flop_layer_cost, kv_fraction, selective_layer_cost
from orthorank.harness.runtime.timing import interleaved_rounds, summarize, synchronize, time_call
from orthorank.harness.speed.phase_profile import attention_share, profile_phases
from orthorank.harness.speed.runner import RunSettings


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
    with torch.inference_mode():
        fns, path, chunks = _layer_calls(model, adapter, layers[idx], idx, selection, settings, device)
        times = interleaved_rounds(
            list(fns), lambda name: time_call(fns[name], device), settings.repeats, settings.warmup, rotate=False,
            on_round=lambda r, t: log(f"  round {r + 1}/{settings.repeats}: dense {t['dense_layer'][-1] * 1e3:.1f} "
                                      f"ms, selective {t['selective_layer'][-1] * 1e3:.1f} ms"))
        prof = None
        if profile:
            try:
                prof = _profile(fns, device)
                chosen = fns["scoring_and_topk"]()
                arch = Arch.from_config(model.config, 1)
                share = 1.0 if chosen is None else attention_share(chosen[0], settings.seq_len)
                prof["phases"] = profile_phases(fns["dense_layer"], fns["selective_layer"], layers[idx], device,
                                                keep_count(settings.seq_len, selection.ratio) / settings.seq_len,
                                                share, (arch.heads, arch.kv_heads))
            except Exception as exc:  # the profiler is a diagnostic: never lose the timings to it
                prof = {"error": f"{type(exc).__name__}: {exc}"}
    stats = {k: summarize(v) for k, v in times.items()}
    synchronize(device)
    return _layer_report(model.config, selection, settings, idx, stats, path, len(chunks), prof)


def band_mask(T: int, window: int, device: torch.device) -> torch.Tensor:
    """[1, 1, T, T] bool: query q attends to key k where k <= q and q - k < window (transformers' sliding mask)."""
    i = torch.arange(T, device=device)
    d = i[:, None] - i[None, :]
    return ((d >= 0) & (d < window))[None, None]


def _layer_calls(model: nn.Module, adapter: FamilyAdapter, layer: nn.Module, idx: int, selection: SelectionConfig,
                 settings: RunSettings, device: torch.device
                 ) -> tuple[dict[str, Callable[[], Any]], str, list[tuple[int, int]]]:
    """What run_layer times, each a call on the same random hidden states of layer `idx` (the dense layer, the
    selection layer chunked and unchunked, the input norm, scoring, scoring + top-K, and the attention alone), with
    the attention path and query chunks the selection layer takes. Call under inference mode."""
    cfg = model.config
    dtype = next(layer.parameters()).dtype
    B, T = settings.batch, settings.seq_len
    gen = torch.Generator().manual_seed(settings.seed)
    h = torch.randn(B, T, cfg.hidden_size, generator=gen).to(device=device, dtype=dtype)
    pos = torch.arange(T, device=device).unsqueeze(0)
    pos_emb = adapter.position_embeddings(model, h, pos, idx)
    context = SequenceContext()
    wrapper = SelectiveLayer(layer, adapter, selection, context, idx)
    # A sliding-window layer gets its band as a 4D mask, as a model's forward gives it (without one the dense layer
    # would attend causally to every key and the blocked sliding kernel would not run); a full-attention layer none
    mask = None if wrapper._window is None or wrapper._window >= T else band_mask(T, wrapper._window, device)
    kwargs = dict(attention_mask=mask, position_ids=pos, position_embeddings=pos_emb, use_cache=False)
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
    return fns, path, chunks


def _layer_report(cfg: Any, selection: SelectionConfig, settings: RunSettings, idx: int,
                  stats: dict[str, dict[str, Any]], path: str, n_chunks: int, prof: Any) -> dict[str, Any]:
    """run_layer's result: the timings, and each part's time as a share of the dense layer's beside the ideal
    (FLOP) share."""
    T = settings.seq_len
    dense = stats["dense_layer"]["median_s"]
    frac = stats["selective_layer"]["median_s"] / dense
    f_kv = kv_fraction(cfg)
    ideal = flop_layer_cost(cfg, T, selection.ratio)
    return {
        "mode": "layer",
        "batch": settings.batch,
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
        "attention_chunks": n_chunks,
        "attention_path": path,
        # the attention of the selected queries alone, against the dense layer's causal kernel on the same keys
        **({"attention_alone": _attention_report(stats, dense, T, selection, path)}
           if "attention_split" in stats else {}),
        "scores_bmm_out_dtype": _bmm_flag(),
        "profile": prof,
    }


def _attention_report(stats: dict[str, dict[str, Any]], dense: float, T: int, selection: SelectionConfig,
                      path: str) -> dict[str, Any]:
    """The attention of the selected queries alone, each kernel's time as a share of the dense causal kernel's."""
    causal = stats["attention_causal"]["median_s"]
    return {
        "masked_fraction_of_causal": stats["attention_masked"]["median_s"] / causal,
        "split_fraction_of_causal": stats["attention_split"]["median_s"] / causal,
        "query_fraction": keep_count(T, selection.ratio) / T,
        "causal_share_of_dense_layer": causal / dense,
        "in_use": path,
        "local_fraction_of_causal": stats["attention_local"]["median_s"] / causal,
        # what time would be if it followed the keys read (method/local_attention.py's cost model)
        "local_ideal_fraction_of_causal": mean_keys_read(T, LocalAttention()) / ((T + 1) / 2),
        "note": "masked: method/attention.py's query chunks with a boolean mask; split: method/attention_split.py "
                "(prefix unmasked + diagonal masked, merged by log-sum-exp), which full-attention selection "
                f"layers use on CPU from {SPLIT_MIN_KEYS} keys on; local: the local schedule's blocked kernel "
                "(method/local_attention.py) over every query"}


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
