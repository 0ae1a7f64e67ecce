"""Ideal speed-ups: what a plan would gain if every skipped FLOP were free time.

Two models of a selection layer's cost relative to a dense layer:
- weights only (notes section 6): f_kv + (1 - f_kv) * r, with f_kv the K+V share of the layer's matmul weights;
  right for short prompts, where attention's share of a layer is small;
- FLOPs with attention (`flop_layer_cost`, from orthorank.method.cost): the bypassed tokens still pay the input
  norm, K/V projections, RoPE on K and the scoring; the selected ones pay everything else, their attention over
  keys up to their positions included. Attention grows with the prompt (quadratically per layer), so a selection
  layer's ideal cost falls towards r as prompts get longer, and OrthoRank's ideal speed-up rises with length
  while layer removal's stays L / (L - p).
With L layers of which n are selection layers, the ideal end-to-end speed-up is L / (L - n + n * cost). Embedding,
final norm and the LM head (the benchmark applies it to the last position only) are ignored: they are small next
to the decoder layers.
"""

from __future__ import annotations

from typing import Any

from orthorank.method.cost import Arch, layer_flops, selection_layer_flops


def layer_weight_counts(config: Any) -> dict[str, int]:
    """Matmul weights of one Llama-style decoder layer (q, k, v, o, gated MLP), from a HF config."""
    d = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or d // heads)
    ffn = int(config.intermediate_size)
    return {
        "q": d * heads * head_dim,
        "k": d * kv_heads * head_dim,
        "v": d * kv_heads * head_dim,
        "o": heads * head_dim * d,
        "mlp": 3 * d * ffn,
    }


def kv_fraction(config: Any) -> float:
    """f_kv: the K and V projections' share of a layer's matmul weights (16.6% Llama-2-7B, 3.8% Llama-3-8B)."""
    w = layer_weight_counts(config)
    return (w["k"] + w["v"]) / sum(w.values())


def selective_layer_cost(f_kv: float, ratio: float) -> float:
    """Cost of a selection layer that updates a fraction `ratio` of the tokens, relative to a dense layer."""
    return f_kv + (1.0 - f_kv) * ratio


def flop_layer_cost(config: Any, seq_len: int, ratio: float) -> float:
    """A selection layer's FLOPs at `seq_len` prompt tokens (attention included) over a dense layer's."""
    arch = Arch.from_config(config)
    return selection_layer_flops(arch, seq_len, ratio) / layer_flops(arch, seq_len).dense


def ideal_speedup(num_layers: int, removed: int = 0, selected: int = 0, f_kv: float = 0.0, ratio: float = 1.0,
                  mode: str = "prefill", decode: str = "dense", layer_cost: float | None = None) -> float | None:
    """Ideal speed-up over dense of removing `removed` layers and selecting tokens in `selected` others (at `ratio`):
    L / (L - removed) for the removals, times K / (K - n + n c) over the K kept layers for n selection layers
    costing c of a dense layer each. `layer_cost` (e.g. `flop_layer_cost`) replaces the weight-only cost of a
    selection layer.

    In decode mode with decode="dense" every new token is updated by every layer (ceil(ratio * 1) = 1), so a
    selection layer saves nothing; with decode="threshold" or "causal" the work saved depends on the data: None.
    """
    L, kept, n = int(num_layers), int(num_layers) - int(removed), int(selected)
    if kept <= 0:
        return None
    shrink = L / kept
    if n == 0:
        return shrink
    if mode == "decode":
        return shrink if decode == "dense" else None
    cost = selective_layer_cost(f_kv, ratio) if layer_cost is None else layer_cost
    return shrink * kept / (kept - n + n * cost)


def with_fixed_share(speedup: float | None, fixed_share: float) -> float | None:
    """A speed-up of the decoder layers alone, as a speed-up of a whole step in which a share `fixed_share` of the
    dense step's time is work no method changes (a decode step's LM head: it reads the whole head matrix every
    token, 63% of Gemma 3 270M's weight bytes, 21% of SmolLM2-135M's). Amdahl: 1 / ((1 - f) / S + f)."""
    if speedup is None:
        return None
    return 1.0 / ((1.0 - fixed_share) / speedup + fixed_share)


def spread_layers(count: int, num_layers: int) -> list[int]:
    """`count` evenly spread layer indices, avoiding the first and last layer when possible (SLEB never removes
    them; selection works poorly there). For speed, which layers does not matter, only how many."""
    count = max(0, min(int(count), num_layers))
    if count == 0:
        return []
    pool = list(range(1, num_layers - 1)) if num_layers - 2 >= count else list(range(num_layers))
    return sorted({pool[int((i + 0.5) * len(pool) / count)] for i in range(count)})
