"""What a selection layer gathers for its policy (method/policies.py), one entry per input a policy may need.

A policy declares its needs by name (`Policy.needs`); each name here says how the layer obtains it:
- at scoring, from the chunk being ranked (`scoring`: the sink's state, a random draw, the layer's fitted
  parameters), filling fields of `PolicyInputs`;
- once per chunk, before ranking (`measure`: a per-token quantity, `PolicyInputs.given`), such as the attention
  each token receives or the previous layer's update;
- while the plan is applied (`install`: a hook the need puts on the model, such as the previous layer's pre-hook);
- or by running the layer densely first (`dense_first`: the oracle ranks by the dense update itself).
A new policy that needs a new input adds its entry here and names it in its `needs`; the layer's forward does not
change.

Shapes: B rows, T tokens in the chunk, D hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.method.attention_routing import keys_values
from orthorank.method.policies import (
    ATTENTION, ATTENTION_WINDOW, DENSE_UPDATE, FITTED, LOSS_EFFECT, NEEDS, PREV_INPUT, RANDOM, SINK, Policy,
    PolicyInputs, attention_received,
)
from orthorank.method.recording import loss_effect_hook
from orthorank.method.selection import random_keys, sequence_seed

if TYPE_CHECKING:
    from orthorank.method.layer import SelectiveLayer
    from orthorank.method.sequence_context import Facts, SequenceContext


@dataclass
class Chunk:
    """The chunk a selection layer is ranking: its input, the attention input and RoPE, shared facts, the cache."""

    sel: SelectiveLayer
    hidden: torch.Tensor  # [B, T, D] the residual stream entering the layer
    x: torch.Tensor  # [B, T, D] the attention input (the layer's input norm applied)
    pos_emb: Any
    facts: Facts
    cache: Any
    past: int


@dataclass
class Scoring:
    """What the layer knows when it ranks: the chunk's score input and the sink's state it settled on."""

    sel: SelectiveLayer
    src: torch.Tensor  # [B, T, D]
    sink: torch.Tensor  # [B, D]
    facts: Facts
    past: int


@dataclass
class Site:
    """Where a plan is applied: the model, its layers (before removal), the removed ones, the shared context."""

    model: nn.Module
    layers: list[nn.Module]
    removed: set[int]
    context: SequenceContext
    head_logits: Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Need:
    name: str
    scoring: Callable[[Scoring], dict[str, Any]] | None = None  # PolicyInputs fields at ranking time
    measure: Callable[[Chunk], torch.Tensor | None] | None = None  # PolicyInputs.given, once per chunk
    install: Callable[[Site, int, SelectiveLayer], Any] | None = None  # a hook handle, or None (already there)
    dense_first: bool = False  # the layer runs densely first; its update norms are the policy's `given`


def _sink(s: Scoring) -> dict[str, Any]:
    return {"sink": s.sink}


def _random_draw(s: Scoring) -> dict[str, Any]:
    """The random ablation's keys: a fresh pattern per sequence, reproducible from the seed and the sequence's own
    tokens (independent of batch size, the row's place in the batch and its padding)."""
    sel, facts = s.sel, s.facts
    B, T = s.src.shape[:2]
    valid = facts.valid
    hashes = sel._context.row_hashes(B, T, s.past, valid)
    seeds = [sequence_seed(sel.config.seed, sel.layer_index, hsh) for hsh in hashes]
    counts = [T] * B if valid is None else valid.sum(1).tolist()
    return {"random_draw": random_keys(counts, T, seeds, valid, facts.sink_pos.device)}


def _fitted(s: Scoring) -> dict[str, Any]:
    # each token's distance from its row's sink: pads before it and the cache's tokens counted right (sink_pos < 0)
    T = s.src.shape[1]
    positions = torch.arange(T, device=s.src.device).view(1, T) - s.facts.sink_pos.view(-1, 1)
    return {"fitted": s.sel._fitted, "positions": positions}


def _prev_update(c: Chunk) -> torch.Tensor | None:
    """prev-update: ||h_l - h_(l-1)|| from the previous layer's input, kept by the need's pre-hook."""
    prev, c.sel.prev_input = c.sel.prev_input, None
    if prev is None or prev.shape != c.hidden.shape:
        return None
    return torch.linalg.vector_norm((c.hidden - prev).float(), dim=-1)


def _keep_previous_input(site: Site, i: int, sel: SelectiveLayer):
    """A pre-hook on the layer that runs before layer i keeps its input for layer i's selection."""
    before = [j for j in range(i) if j not in site.removed]
    if not before:
        raise UserError(f"the prev-update policy needs a layer before selection layer {i}")

    def keep(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        sel.prev_input = h.clone()  # a selective layer may update its input in place
    return site.layers[before[-1]].register_forward_pre_hook(keep, with_kwargs=True)


def _attention_estimate(c: Chunk) -> torch.Tensor:
    """The `attention` policy's estimate [B, T], from this layer's own queries and keys (the chunk's keys, and the
    cached ones where a cache holds them)."""
    sel, x, past = c.sel, c.x, c.past
    attn, adapter = sel.layer.self_attn, sel.adapter
    T = x.shape[1]
    W = min(sel.config.attention_window or ATTENTION_WINDOW, T)
    cos, sin = c.pos_emb
    q = adapter.rope(attn, adapter.queries(attn, x[:, T - W:]), cos[:, T - W:], sin[:, T - W:])
    k, v = keys_values(sel, x, c.pos_emb)  # [B, Hkv, T, d]
    sel.chunk_kv = (x, k, v)  # the selective call's attention reuses them (one K/V projection per layer)
    if past > 0 and c.cache is not None:
        layer_cache = c.cache.layers[attn.layer_idx] if hasattr(c.cache, "layers") else None
        cached = getattr(layer_cache, "keys", None)
        if cached is not None and cached.shape[2] == past:
            k = torch.cat([cached.to(k.dtype), k], dim=2)
        else:
            past = 0  # cached keys not readable here: the estimate sees this chunk only
    return attention_received(q.transpose(1, 2), k, attn.scaling, c.facts.valid, past)


def _loss_effect(c: Chunk) -> torch.Tensor:
    """The loss-oracle's keys [B, T]: this layer's <dL/dh_i, f(x)_i - x_i> from the dense pass that the context's
    before-forward hook ran on this forward's input (method/recording.py)."""
    B, T = c.hidden.shape[:2]
    effect = c.sel._context.given.get(c.sel.layer_index)
    if c.past > 0 or effect is None or effect.shape != (B, T):
        raise UserError("the loss-oracle policy reads each window's own next tokens: it applies to whole-window "
                        "perplexity (ppl, compare), not to cached generation or chunked prefill")
    return effect


def _loss_effect_pass(site: Site, i: int, sel: SelectiveLayer):
    """One dense forward and backward per forward of the model, shared by every layer that needs it."""
    if not any(getattr(h, "orthorank_need", None) == LOSS_EFFECT for h in site.context.before_forward):
        hook = loss_effect_hook(site.model, site.head_logits)
        hook.orthorank_need = LOSS_EFFECT
        site.context.before_forward.append(hook)
    return None


INPUTS: dict[str, Need] = {n.name: n for n in (
    Need(SINK, scoring=_sink),
    Need(RANDOM, scoring=_random_draw),
    Need(FITTED, scoring=_fitted),
    Need(PREV_INPUT, measure=_prev_update, install=_keep_previous_input),
    Need(ATTENTION, measure=_attention_estimate),
    Need(LOSS_EFFECT, measure=_loss_effect, install=_loss_effect_pass),
    Need(DENSE_UPDATE, dense_first=True),
)}
assert set(INPUTS) == set(NEEDS), "every need a policy may declare says how a layer gathers it"


def dense_first(rule: Policy) -> bool:
    """Whether the layer must run densely before its policy can rank (the oracle)."""
    return any(INPUTS[n].dense_first for n in rule.needs)


def measure(rule: Policy, chunk: Chunk) -> torch.Tensor | None:
    """The per-token quantity the policy ranks by (PolicyInputs.given), or None where it needs none."""
    for name in rule.needs:
        if INPUTS[name].measure is not None:
            return INPUTS[name].measure(chunk)
    return None


def policy_inputs(rule: Policy, scoring: Scoring, hidden: torch.Tensor, given: torch.Tensor | None,
                  criterion: str) -> PolicyInputs:
    """The policy's inputs for one ranking: the score input, and what each of its needs supplies."""
    fields: dict[str, Any] = {}
    for name in rule.needs:
        if INPUTS[name].scoring is not None:
            fields.update(INPUTS[name].scoring(scoring))
    return PolicyInputs(src=scoring.src, hidden=hidden, past=scoring.past, criterion=criterion, given=given, **fields)


def install(rule: Policy, site: Site, i: int, sel: SelectiveLayer) -> list[Any]:
    """The hooks selection layer i's policy needs while the plan is applied (handles with .remove())."""
    handles = []
    for name in rule.needs:
        if INPUTS[name].install is not None:
            handle = INPUTS[name].install(site, i, sel)
            if handle is not None:
                handles.append(handle)
    return handles
