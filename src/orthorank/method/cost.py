"""What a plan skips, in FLOPs: the fair measure of sparsity (notes, section 8).

Three measures travel with every plan and result row:
- nominal: the paper's (n / L) * (1 - r) for token selection, removed / L for pruning;
- compute: the share of the whole model's forward FLOPs per token (decoder layers, final norm, LM head) that the
  plan skips at a given sequence length. A removed layer skips everything in it. A selection layer keeping K of
  T tokens still runs the input norm, the K and V projections, RoPE on K and the scoring for every token; queries,
  RoPE on Q, the attention core, o_proj, the residual adds, the post-attention norm and the MLP run for K/T of the
  tokens. The attention core of a selected query costs keys up to its position; selected positions are taken to be
  spread like all positions (mean (T + 1) / 2 keys), which is what a dense layer pays per token on average.
- measured: a speed-up from `orthorank bench`, where one was run (None otherwise).

Counts are multiply-adds x 2 for matmuls plus a few FLOPs per element for norms, RoPE, activations and residual
adds (those are well under 1% of a layer; they are counted because bypassed tokens still pay some of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from orthorank.method.policies import ATTENTION, ATTENTION_WINDOW
from orthorank.method.selection import SelectionConfig, keep_count
from orthorank.models.arch import Arch  # noqa: F401  (plans and costs name it from here)

# The sequence length at which a plan's compute share is stated where no other is given
DEFAULT_COST_SEQ_LEN = 2048


@dataclass(frozen=True)
class LayerFlops:
    """FLOPs per token of one decoder layer, split by what a bypassed token still runs."""

    every_token: float  # input norm, K and V projections, RoPE on K (and, for selection, the scoring)
    per_updated_token: float  # queries, RoPE on Q, attention core, o_proj, residual adds, post norm, MLP

    @property
    def dense(self) -> float:
        return self.every_token + self.per_updated_token


def attention_core_flops(arch: Arch, keys: float) -> float:
    """QK^T, AV and the softmax of one query over `keys` keys."""
    return 2 * 2 * arch.heads * arch.head_dim * keys + 5 * arch.heads * keys


def layer_flops(arch: Arch, seq_len: int) -> LayerFlops:
    d, hd = arch.hidden, arch.head_dim
    q_out, kv_out = arch.heads * hd, arch.kv_heads * hd
    norm = 4 * d  # square, mean, rsqrt-scale, weight
    every = norm + 2 * (2 * d * kv_out) + 3 * kv_out  # K and V projections, RoPE on K
    attention = attention_core_flops(arch, (seq_len + 1) / 2)  # mean keys a causal query sees
    mlp = 2 * 3 * d * arch.ffn + 5 * arch.ffn  # gate, up, down; SiLU and product
    updated = 2 * d * q_out + 3 * q_out + attention + 2 * q_out * d + d + norm + mlp + d
    return LayerFlops(float(every), float(updated))


def head_flops(arch: Arch) -> float:
    """Final norm and LM head per token (never skipped; embeddings are a lookup)."""
    return float(4 * arch.hidden + 2 * arch.hidden * arch.vocab)


def prefill_sparsity(arch: Arch, seq_len: int, share: float) -> float:
    """A plan's share of the dense *prefill's* FLOPs skipped, from its per-token share (a plan's compute_sparsity,
    which prices the LM head on every position, as perplexity needs). Time to first token runs the head on the last
    position only, so the same skipped FLOPs are a larger share of less work: for Gemma 3's 262k-token head the
    per-token measure would understate every prefill plan's share about twofold."""
    total = model_flops(arch, seq_len)
    head = head_flops(arch)
    return share * total / (total - head + head / seq_len)


def kept_fraction(seq_len: int, ratio: float) -> float:
    return keep_count(seq_len, ratio) / seq_len


def selection_layer_flops(arch: Arch, seq_len: int, ratio: float, scoring: float | None = None,
                          pruned_keys: bool = False) -> float:
    """A selection layer's FLOPs per token. scoring: what choosing costs per token (the policy's
    `scoring_flops`; default the paper's sink dot product, 2D). pruned_keys: progressive pruning, whose kept queries
    attend the kept keys only ((K + 1) / 2 keys on average rather than (T + 1) / 2); the others' keys and values
    are still computed (for the KV cache)."""
    f = layer_flops(arch, seq_len)
    scoring = 2 * arch.hidden if scoring is None else scoring
    per_updated = f.per_updated_token
    if pruned_keys:
        kept = keep_count(seq_len, ratio)
        per_updated -= attention_core_flops(arch, (seq_len + 1) / 2) - attention_core_flops(arch, (kept + 1) / 2)
    return f.every_token + scoring + kept_fraction(seq_len, ratio) * per_updated


def attention_scoring_flops(arch: Arch, seq_len: int, window: int) -> float:
    """Per token, what the attention policies spend choosing: the last `window` queries (projection and RoPE,
    amortised over the chunk) and their logits and softmax over every key."""
    window = min(window, seq_len)
    q_out = arch.heads * arch.head_dim
    return window * (2 * q_out + 5 * arch.heads) + window * (2 * arch.hidden * q_out + 3 * q_out) / seq_len


def model_flops(arch: Arch, seq_len: int, removed: int = 0, selection_layers: int = 0, ratio: float = 1.0,
                scoring: float | None = None) -> float:
    """Forward FLOPs per token of the model with `removed` layers removed and `selection_layers` selecting tokens."""
    dense_layer = layer_flops(arch, seq_len).dense
    plain = arch.num_layers - removed - selection_layers
    sel = selection_layer_flops(arch, seq_len, ratio, scoring) * selection_layers if selection_layers else 0.0
    return plain * dense_layer + sel + head_flops(arch)


def removal_sparsity(arch: Arch, seq_len: int, count: int) -> float:
    """Share of the dense model's per-token FLOPs that removing `count` layers skips."""
    if count == 0:
        return 0.0
    return 1.0 - model_flops(arch, seq_len, removed=count) / model_flops(arch, seq_len)


def selection_sparsity(arch: Arch, seq_len: int, count: int, ratio: float = 1.0,
                       scoring: float | None = None) -> float:
    """Share of the dense model's per-token FLOPs that `count` selection layers at `ratio` skip, each paying
    `scoring` FLOPs per token to choose (negative where choosing costs more than it skips)."""
    if count == 0:
        return 0.0
    return 1.0 - model_flops(arch, seq_len, selection_layers=count, ratio=ratio, scoring=scoring) / model_flops(
        arch, seq_len)


def selection_layers_to_match(arch: Arch, seq_len: int, target: float, ratio: float,
                              scoring: float | None = None) -> int:
    """The fewest selection layers at `ratio` whose compute sparsity is at least `target`."""
    saved = layer_flops(arch, seq_len).dense - selection_layer_flops(arch, seq_len, ratio, scoring)
    if saved <= 0:
        raise ValueError(f"ratio {ratio} saves no compute at sequence length {seq_len}")
    total = model_flops(arch, seq_len)
    n = max(0, math.ceil(target * total / saved - 1e-9))
    while n > 0 and selection_sparsity(arch, seq_len, n - 1, ratio, scoring) >= target:
        n -= 1
    while n <= arch.num_layers and selection_sparsity(arch, seq_len, n, ratio, scoring) < target - 1e-12:
        n += 1
    return n


def selection_scoring_flops(selection: SelectionConfig, arch: Arch, seq_len: int) -> float:
    """What a selection layer spends choosing, per token (the cost model's scoring term): the attention policies'
    observation window, the router's features and score, or the sink dot product."""
    if ATTENTION in selection.rule.needs:
        return attention_scoring_flops(arch, seq_len, selection.attention_window or ATTENTION_WINDOW)
    return selection.rule.scoring_flops(arch.hidden)


def local_compute_sparsity(arch: Arch, seq_len: int, count: int, mean_keys: float) -> float:
    """Share of the dense model's per-token FLOPs skipped by `count` layers of local prefill attention whose queries
    read `mean_keys` keys on average (method/local_attention.py) instead of the causal (seq_len + 1) / 2; the rest
    of those layers runs for every token."""
    if count == 0:
        return 0.0
    saved = attention_core_flops(arch, (seq_len + 1) / 2) - attention_core_flops(arch, mean_keys)
    return count * saved / model_flops(arch, seq_len)


def hybrid_compute_sparsity(arch: Arch, seq_len: int, removed: int, ratios: list[float],
                            scoring: float | None = None, pruned_keys: bool = False) -> float:
    """Share of the dense model's per-token FLOPs a hybrid plan skips: `removed` layers removed and one selection
    layer per entry of `ratios`, each at its own ratio."""
    if removed == 0 and not ratios:
        return 0.0
    dense_layer = layer_flops(arch, seq_len).dense
    plain = arch.num_layers - removed - len(ratios)
    flops = (plain * dense_layer
             + sum(selection_layer_flops(arch, seq_len, r, scoring, pruned_keys) for r in ratios)
             + head_flops(arch))
    return 1.0 - flops / model_flops(arch, seq_len)


def ratio_to_match(arch: Arch, seq_len: int, target: float, count: int, base_ratio: float,
                   scoring: float | None = None) -> float:
    """The keep ratio, at least `base_ratio`, with which `count` selection layers skip the compute share closest to
    `target` at `seq_len` (exact matching: the layer count alone overshoots, since each selection layer skips a
    fixed share). Ratios are K / seq_len for a whole number of kept tokens K, so the plan keeps exactly K tokens of
    a window of seq_len; the remaining error is under one token per layer."""
    def skipped(k: int) -> float:
        return selection_sparsity(arch, seq_len, count, k / seq_len, scoring=scoring)

    lo = keep_count(seq_len, base_ratio)
    if count <= 0 or skipped(lo) <= target:
        return base_ratio
    # skipped(seq_len) < target: a layer keeping every token still pays the scoring
    return closest_count(skipped, lo, seq_len, target) / seq_len


def closest_count(value: Callable[[int], float], lo: int, hi: int, target: float) -> int:
    """The whole k in [lo, hi] whose value(k) is closest to `target`, for value decreasing in k with
    value(lo) > target >= value(hi) (bisection: kept tokens against the compute or speed they give)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if value(mid) > target:
            lo = mid
        else:
            hi = mid
    return lo if abs(value(lo) - target) <= abs(value(hi) - target) else hi
