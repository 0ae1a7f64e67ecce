"""OrthoRank on a decoder layer, installed on the layer instance: the model's modules stay where they are.

Selected tokens get the full layer update; bypassed tokens leave the layer unchanged, but their keys and values
are still computed (at their true positions) so that selected queries attend to every key and the KV cache stays
complete.

How it composes with transformers and accelerate: `SelectiveLayer` replaces the layer *instance's* forward (inside
accelerate's hook where there is one), runs the family's own layer forward on the gathered selected rows, and for
that call routes the attention module to the selected queries (method/attention_routing.py). So state_dict keys
do not change, hooks on the layer and attention modules fire (output_hidden_states, output_attentions), and
accelerate moves weights and inputs as for the dense layer. What a policy needs beyond the layer's input is
gathered by method/policy_inputs.py; what every selection layer of a forward shares, by method/sequence_context.py.

Cost: everything except the input norm, K/V projections and RoPE on K runs on the selected rows only.
- With no padding and no cache (prefill), every row keeps the same K = ceil(ratio * T) tokens and the sink is
  position 0, so selection needs no device-to-host sync; facts that need one with padding (which rows are padded,
  the largest K) are computed once per forward for all selection layers (SequenceContext.facts).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from orthorank.method import dense_first, one_token_step, policy_inputs
from orthorank.method.attention import backend_for
from orthorank.method.attention_routing import (RowCall, gather_rows, key_keep, keys_values, route_attention, run_routed,
                                                scatter_rows)
from orthorank.method.phase_marks import phase
from orthorank.method.policies import FITTED, always_update
from orthorank.method.policy_inputs import Chunk, Scoring
from orthorank.method.selection import SelectionConfig, keep_to_indices, top_k_indices, topk_keep_mask
from orthorank.method.sequence_context import Facts, SequenceContext
from orthorank.models.adapters import FamilyAdapter


def _cache_arg(kwargs: dict[str, Any]) -> Any:
    # transformers >= 5.20 calls it `cache`; earlier releases `past_key_values`
    return kwargs.get("cache", kwargs.get("past_key_values"))


class NonFiniteHiddenStates(ValueError):
    """A selection layer received NaN or inf: ranking tokens on them would be silent garbage."""


def _non_finite(layer_index: int) -> str:
    return (f"layer {layer_index}: hidden states contain NaN or inf; OrthoRank cannot rank tokens on them (check the "
            "model's dtype and weights)")


def check_finite(scores: torch.Tensor, layer_index: int) -> None:
    if scores.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(torch.isfinite(scores).all()):
            raise NonFiniteHiddenStates(_non_finite(layer_index))
    else:  # no host sync on accelerators or in a compiled graph: a device-side assert
        torch._assert_async(torch.isfinite(scores).all(), f"layer {layer_index}: NaN or inf in hidden states")


class SelectiveLayer:
    """OrthoRank on one decoder layer, installed as that layer instance's forward (see apply.py).

    It runs the family's own layer forward on the selected rows (so residuals, norms, MLP/MoE are the family's code
    and every hook on the layer and its attention module fires) and routes the attention module to
    `selective_attention` for that call: queries of the selected rows against every token's keys and values.
    Bypassed rows leave the layer unchanged. With output_attentions (eager), selected rows report their weights;
    bypassed rows report zeros.
    """

    # Attention over long sequences runs in up to this many query chunks of at least min_chunk_keys keys each, so
    # the chunks' causal rectangles approach the triangle (measured on CPU at 16k tokens, SmolLM2 shape: 4 chunks
    # reached 71% of the selective layer's ideal cost, 16 chunks 98%). Exact either way. On CPU the chunk ends
    # cost one host read per layer; on accelerators the layer stays sync-free (one masked call, see attention.py).
    max_attention_chunks = 32
    min_chunk_keys = 512
    # Threshold decode steps run the layer on the kept rows only (batch-compacted); off: every row runs and the
    # bypassed rows' updates are discarded (the same result, the reference for tests).
    compact_decode_rows = True
    # A threshold decode step of one sequence decides its one token with a single comparison, then runs either the
    # family's dense layer (kept: the same update as the selective path's) or only its K/V (bypassed), without the
    # general selection's masks, gathers and routed attention (SmolLM2-135M at batch 1, ten selection layers all
    # keeping: 0.08-0.10 of a dense step cheaper; scripts/decode_step_parts.py). Off: the general path (the
    # reference for tests).
    fast_threshold_step = True

    def __init__(self, layer: nn.Module, adapter: FamilyAdapter, config: SelectionConfig,
                 context: SequenceContext, layer_index: int, inner: Callable[..., Any] | None = None) -> None:
        self.layer = layer
        self.adapter = adapter
        self.config = config
        self.layer_index = layer_index
        self._context = context
        # the forward this one replaces: the class's, or whatever an earlier patch installed
        self.inner = inner if inner is not None else type(layer).forward.__get__(layer)
        attn = layer.self_attn
        self._window = adapter.sliding_window(attn)
        self._softcap = adapter.softcap(attn)
        # Sink state and prefill cut-off per row, kept for chunks whose sink lies in the KV cache.
        self._sink_state: torch.Tensor | None = None
        self._cutoff: torch.Tensor | None = None
        self._last: tuple[torch.Tensor, torch.Tensor | None, int] | None = None
        self.call: RowCall | None = None  # the selective call in progress, read by the routed attention
        self.attention_routed = False  # route_attention installed (method/attention_routing.py)
        self._hidden: torch.Tensor | None = None  # the residual stream entering the layer, for the policy
        self._given: torch.Tensor | None = None  # the per-token quantity a policy ranks by, during its selection
        self.prev_input: torch.Tensor | None = None  # prev-update: the previous layer's input (its hook sets it)
        self.chunk_kv: tuple | None = None  # (attention input, K, V) the attention policy computed for this call
        self.rule = config.rule  # the policy object (method/policies.py), resolved once by the configuration
        self._dense_first = policy_inputs.dense_first(self.rule)
        # this layer's fitted parameters (the router's): a plan without them for this layer is refused here
        self._fitted = config.fitted.layer(layer_index) if FITTED in self.rule.needs else None
        # causal decisions: a token is updated where its key (minus its router score) is at most this, in prefill
        # and decoding alike; the threshold decode's cut-off, fixed by the fit instead of set by each prefill
        self._fixed_cutoff = (torch.tensor([-self._fitted.threshold], dtype=torch.float32)
                              if config.decode == "causal" else None)
        self.on_keys: Callable[[torch.Tensor, torch.Tensor | None], None] | None = None  # (keys, valid): fit-thresholds
        self._one_token = one_token_step.OneTokenStep()

    @property
    def backend(self) -> str:
        attn = self.layer.self_attn
        return backend_for(getattr(attn.config, "_attn_implementation", None), self._softcap)

    @property
    def last_keep(self) -> torch.Tensor | None:
        """[B, T] bool: the tokens the latest call updated (None when it ran densely), for analysis and tests."""
        if self._last is None:
            return None
        idx, real, T = self._last
        keep = torch.zeros(idx.shape[0], T, dtype=torch.bool, device=idx.device)
        return keep.scatter_(1, idx, True if real is None else real)

    def __repr__(self) -> str:
        c = self.config
        return (f"SelectiveLayer(layer={self.layer_index}, ratio={c.ratio}, criterion={c.criterion}, "
                f"source={c.source}, policy={c.policy}, bypass_kv={c.bypass_kv}, decode={c.decode}"
                + (f", keep_recent={c.keep_recent}" if c.keep_recent else "")
                + (f", keep_first={c.keep_first}" if c.keep_first else "") + ")")

    # -- selection -----------------------------------------------------------------------------------------------

    def select_indices(self, h: torch.Tensor, x: torch.Tensor, past: int = 0):
        """(idx [B, K] positions to update, real [B, K] or None when every entry is real), or None: run densely."""
        B, T, _ = h.shape
        facts = self._context.facts(B, T, past, h.device, self.config.ratio)
        self._hidden = h
        try:
            return self._select(h, x, past, facts)
        finally:
            self._hidden = None

    def _scores(self, src: torch.Tensor, sink: torch.Tensor, facts: Facts, B: int, T: int, past: int):
        """The policy's ascending keys [B, T], with the modifiers' always-updated tokens first."""
        cfg, rule = self.config, self.rule
        inputs = policy_inputs.policy_inputs(rule, Scoring(self, src, sink, facts, past), self._hidden, self._given,
                                             cfg.criterion)
        keys = rule.keys(inputs)
        if rule.finite_keys:
            check_finite(keys if facts.valid is None else keys.masked_fill(~facts.valid, 0.0), self.layer_index)
        alive = self._context.alive if cfg.progressive and past == 0 else None
        if alive is not None and alive.shape == keys.shape:  # pruned by an earlier layer: out for good
            keys = keys.float().masked_fill(~alive, float("inf"))
        always = always_update(facts.valid, B, T, cfg.keep_recent, cfg.keep_first, past, keys.device)
        if always is not None:
            keys = torch.where(always, torch.full_like(keys, float("-inf"), dtype=torch.float32), keys.float())
        return keys

    def _select(self, h: torch.Tensor, x: torch.Tensor, past: int, facts: Facts):
        cfg = self.config
        B, T, _ = h.shape
        src = x if cfg.source == "normed" else h

        if not facts.padded and past == 0:
            # Fast path: every token valid, sink at position 0, the same K per row: no sync.
            sink = src[:, 0]
            self._sink_state = sink.clone()
            if cfg.decode == "causal":  # every token against the fixed cut-off: as many per row as pass it
                with phase("scoring"):
                    keys = self._scores(src, sink, facts, B, T, past)
                return self._causal_keep(keys, None)
            K = facts.kmax
            keys = None
            if K < T:
                with phase("scoring"):
                    keys = self._scores(src, sink, facts, B, T, past)
                with phase("top-K"):
                    idx = top_k_indices(keys, K, sink_pos=0)
            else:
                idx = torch.arange(T, device=h.device).expand(B, T)
            if cfg.decode == "threshold":
                if keys is None:
                    keys = self._scores(src, sink, facts, B, T, past)
                self._cutoff = keys.gather(1, idx).float().amax(dim=1)
            return idx, None

        valid = facts.valid if facts.valid is not None else torch.ones(B, T, dtype=torch.bool, device=h.device)
        sink_pos = facts.sink_pos
        in_chunk = facts.in_chunk if facts.in_chunk is not None else sink_pos >= 0
        chunk_sink = src.gather(1, sink_pos.clamp_min(0).view(B, 1, 1).expand(B, 1, src.shape[-1])).squeeze(1)
        if facts.all_in_chunk:
            sink = chunk_sink
        elif self._sink_state is not None and self._sink_state.shape == chunk_sink.shape:
            sink = torch.where(in_chunk.unsqueeze(1), chunk_sink, self._sink_state)
        else:
            return None  # sink unknown (cache built elsewhere): stay exact, run densely
        self._sink_state = sink

        with phase("scoring"):
            keys = self._scores(src, sink, facts, B, T, past)
        if cfg.decode == "causal":
            return self._causal_keep(keys, valid)
        if past > 0 and cfg.decode == "threshold" and self._cutoff is not None:
            keep = valid & (keys <= self._cutoff.unsqueeze(1))
            keep &= sink_pos.unsqueeze(1) != torch.arange(T, device=h.device)
            return keep_to_indices(keep)  # data-dependent count: one sync
        with phase("top-K"):
            keep = topk_keep_mask(keys, valid, torch.where(in_chunk, sink_pos, -1), facts.k)
        if past == 0 and cfg.decode == "threshold":
            kept_keys = torch.where(keep, keys.float(), torch.full_like(keys, float("-inf"), dtype=torch.float32))
            self._cutoff = kept_keys.amax(dim=1)
        with phase("top-K"):
            idx, real = keep_to_indices(keep, facts.kmax)
        return idx, (None if facts.uniform else real)

    def _causal_keep(self, keys: torch.Tensor, valid: torch.Tensor | None):
        """(idx, real) of the tokens whose keys are at most the fixed cut-off (the sink too: a threshold of minus
        infinity is the dense layer). One sync for the largest row count."""
        if self.on_keys is not None:
            self.on_keys(keys, valid)
        keep = keys <= self._cutoff.unsqueeze(1)
        if valid is not None:
            keep &= valid
        idx, real = keep_to_indices(keep)
        return idx, (None if keep.shape[0] == 1 else real)

    # -- forward -------------------------------------------------------------------------------------------------

    def route_attention(self) -> Callable[[], None]:
        """Route the attention module through this layer while a plan is applied (method/attention_routing.py);
        returns the undo."""
        return route_attention(self)

    def __call__(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._forward(hidden_states, *args, **kwargs)
        finally:
            self._hidden = None  # the layer's input is the policy's only while it chooses: not kept past the call
            self.chunk_kv = None

    def _forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        layer, cfg = self.layer, self.config
        B, T, _ = hidden_states.shape
        if T == 1 and cfg.decode == "dense":
            # One token: ceil(ratio * 1) = 1, the dense layer. Decided before reading the cache length, which a
            # static cache computes with a host read: a dense-decode step stays capturable (CUDA graphs, compile).
            self._last = None
            return self.inner(hidden_states, *args, **kwargs)
        cache = _cache_arg(kwargs)
        past = int(cache.get_seq_length(layer.self_attn.layer_idx)) if cache is not None else 0
        if past == 0:
            self._sink_state, self._cutoff = None, None
        if self._fixed_cutoff is not None:
            if self._fixed_cutoff.device != hidden_states.device:
                self._fixed_cutoff = self._fixed_cutoff.to(hidden_states.device)
            self._cutoff = self._fixed_cutoff
        recorder = self._context.recorder
        if recorder is not None:
            return dense_first.recorded(self, recorder, hidden_states, args, kwargs, past)

        with phase("input norm"):
            x = self.adapter.attention_input(layer, hidden_states)
        with phase("scoring"):
            src = self.adapter.score_input(hidden_states, x) if cfg.source == "normed" else hidden_states
        self._hidden = hidden_states
        facts = self._context.facts(B, T, past, hidden_states.device, cfg.ratio)
        if self._dense_first:
            return dense_first.oracle(self, hidden_states, args, kwargs, src, past, facts)
        if T == 1 and B == 1 and past > 0 and one_token_step.applies(self, facts):
            return self._threshold_step(hidden_states, x, src, args, kwargs, cache, facts, past)
        with phase("scoring"):
            given = policy_inputs.measure(self.rule, Chunk(self, hidden_states, x, kwargs["position_embeddings"],
                                                           facts, cache, past))
        sel = self._select_given(given, hidden_states, src, past, facts)
        if sel is None:
            self._last = None
            return self.inner(hidden_states, *args, **kwargs)
        idx, real = sel
        self._last = (idx, real, T)
        if cfg.progressive and past == 0:
            self._context.alive = self.last_keep
        if idx.shape[1] == 0:  # threshold decode kept no token: write its keys/values, leave its state as it is
            return self._bypass(hidden_states, x, kwargs, cache)
        call = self._row_call(hidden_states, x, idx, real, past, cache, facts, args, kwargs)
        if real is not None and T == 1 and not args and self.compact_decode_rows:
            # A decode step with some rows kept and some not (threshold policy): run the layer on the kept rows
            # only, batch-compacted, instead of on every row with the others' updates discarded.
            rows = real[:, 0].nonzero().squeeze(1)
            if rows.numel() < B:
                return self._compacted(hidden_states, kwargs, call, rows)
        return self._update_rows(hidden_states, call, real, args, kwargs)

    def _row_call(self, hidden_states: torch.Tensor, x: torch.Tensor, idx: torch.Tensor, real: torch.Tensor | None,
                  past: int, cache: Any, facts: Facts, args: tuple, kwargs: dict[str, Any]) -> RowCall:
        """What the routed attention needs for this call (method/attention_routing.py)."""
        B, T, _ = hidden_states.shape
        call = RowCall()
        call.x, call.idx, call.past, call.cache = x, idx, past, cache
        call.q_pos = past + idx
        call.padded = facts.padded
        call.pos_emb = kwargs["position_embeddings"]
        mask = kwargs.get("attention_mask", args[0] if args else None)
        call.mask4d = mask if isinstance(mask, torch.Tensor) and mask.dim() == 4 else None
        call.key_keep = key_keep(self, idx, real, B, T, past, facts, hidden_states.device)
        call.rows = call.h_sel = call.x_sel = None
        return call

    def _update_rows(self, hidden_states: torch.Tensor, call: RowCall, real: torch.Tensor | None, args: tuple,
                     kwargs: dict[str, Any]) -> Any:
        """The family's layer forward on the selected rows only, at their own RoPE positions, written back into
        the residual stream; the other rows pass unchanged."""
        idx = call.idx
        sel_kwargs = dict(kwargs)
        cos, sin = call.pos_emb
        with phase("gather"):
            sel_kwargs["position_embeddings"] = (gather_rows(cos, idx), gather_rows(sin, idx))
            h_sel = gather_rows(hidden_states, idx)  # [B, K, D]
            x_sel = gather_rows(call.x, idx)
        out = run_routed(self, call, h_sel, x_sel, args, sel_kwargs)
        h_new = out[0] if isinstance(out, tuple) else out
        with phase("scatter"):
            if real is not None:
                # Filler entries (rows with fewer kept tokens) write back their own unchanged state.
                h_new = torch.where(real.unsqueeze(-1), h_new, h_sel)
            # in place where nothing else holds the layer's input: no copy of the whole residual stream
            result = scatter_rows(hidden_states, idx, h_new, self._context.inplace_ok())
        return (result, *out[1:]) if isinstance(out, tuple) else result

    def _threshold_step(self, hidden_states: torch.Tensor, x: torch.Tensor, src: torch.Tensor, args: tuple,
                        kwargs: dict[str, Any], cache: Any, facts: Facts, past: int) -> Any:
        """One new token of one sequence (method/one_token_step.py): decided, then the dense layer or the bypass."""
        kept = self._one_token.decide(self, src, hidden_states, facts, past)
        if kept is None:
            raise NonFiniteHiddenStates(_non_finite(self.layer_index))
        self._last = (self._one_token.index(kept, hidden_states.device), None, 1)
        if kept:  # the selected query attends to every key: the dense layer's update on this one token
            return self.inner(hidden_states, *args, **kwargs)
        return self._bypass(hidden_states, x, kwargs, cache)

    def _bypass(self, hidden_states: torch.Tensor, x: torch.Tensor, kwargs: dict[str, Any], cache: Any) -> torch.Tensor:
        """No token updated: only every token's keys and values go into the cache; the states pass unchanged."""
        if cache is not None:
            k, v = keys_values(self, x, kwargs["position_embeddings"])
            cache.update(k, v, self.layer.self_attn.layer_idx)
        return hidden_states

    def _select_given(self, given: torch.Tensor | None, h: torch.Tensor, src: torch.Tensor, past: int,
                      facts: Facts):
        """_select with the per-token quantity a policy ranks by (PolicyInputs.given) in place for it."""
        self._given = given
        try:
            return self._select(h, src, past, facts)
        finally:
            self._given = None

    def _compacted(self, hidden_states: torch.Tensor, kwargs: dict[str, Any], call: RowCall,
                   rows: torch.Tensor) -> Any:
        """One new token per row, `rows` [n] of the B rows updated: the family's layer forward on [n, 1, D]; every
        row's keys and values still reach the cache (the attention router computes them for call.x, all rows)."""
        B = hidden_states.shape[0]
        call.rows = rows
        sel_kwargs = {}
        for key, value in kwargs.items():
            if key == "position_embeddings":
                value = tuple(t.index_select(0, rows) if t.shape[0] == B else t for t in value)
            elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == B:
                value = value.index_select(0, rows)
            sel_kwargs[key] = value
        h_sel = hidden_states.index_select(0, rows)  # [n, 1, D]
        out = run_routed(self, call, h_sel, call.x.index_select(0, rows), (), sel_kwargs)
        h_new = out[0] if isinstance(out, tuple) else out
        result = hidden_states.index_copy(0, rows, h_new)
        return (result, *out[1:]) if isinstance(out, tuple) else result
