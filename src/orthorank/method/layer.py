"""OrthoRank on a decoder layer, installed on the layer instance: the model's modules stay where they are.

Selected tokens get the full layer update; bypassed tokens leave the layer unchanged, but their keys and values
are still computed (at their true positions) so that selected queries attend to every key and the KV cache stays
complete.

How it composes with transformers and accelerate: `SelectiveLayer` replaces the layer *instance's* forward (inside
accelerate's hook where there is one), runs the family's own layer forward on the gathered selected rows, and for
that call routes the attention module's forward to `selective_attention` (method/attention.py). So state_dict keys
do not change, hooks on the layer and attention modules fire (output_hidden_states, output_attentions), and
accelerate moves weights and inputs as for the dense layer.

Cost: everything except the input norm, K/V projections and RoPE on K runs on the selected rows only.
- With no padding and no cache (prefill), every row keeps the same K = ceil(ratio * T) tokens and the sink is
  position 0, so selection needs no device-to-host sync; facts that need one with padding (which rows are padded,
  the largest K) are computed once per forward for all selection layers (SequenceContext.facts).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from orthorank.method.attention import backend_for, selective_attention
from orthorank.method.policies import (
    ATTENTION, ATTENTION_WINDOW, DENSE_UPDATE, FITTED, LOSS_EFFECT, PREV_INPUT, RANDOM, SINK, PolicyInputs,
    always_update, attention_received,
)
from orthorank.method.selection import (
    SelectionConfig,
    keep_count,
    keep_to_indices,
    random_keys,
    sequence_seed,
    token_hash,
    tokens_to_keep,
    top_k_indices,
    topk_keep_mask,
)
from orthorank.errors import UserError
from orthorank.models.adapters import FamilyAdapter


class _Facts:
    """What every selection layer of one forward shares: padding, sink positions, tokens to keep."""

    __slots__ = ("key", "padded", "valid", "sink_pos", "in_chunk", "all_in_chunk", "k", "kmax", "uniform")


def padding_from_4d(mask: Any, config: Any) -> torch.Tensor | None:
    """[B, S] bool: the keys that some query of this forward may attend under a full-attention 4-D mask ([B, 1, q,
    S], boolean or additive): the real tokens of past + current positions, False for padding and for static-cache
    slots not yet written. None where no such mask exists: sliding-window masks also hide old keys, so a model whose
    layers are all sliding is read as unpadded, as without any mask."""
    if isinstance(mask, dict):
        mask = mask.get("full_attention")
    elif isinstance(mask, torch.Tensor) and config is not None:
        types = getattr(config, "layer_types", None)
        if getattr(config, "sliding_window", None) and (types is None or "full_attention" not in types):
            return None
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 4):
        return None
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed.any(dim=2)[:, 0]


class SequenceContext:
    """Per-forward facts shared by all selection layers of one model: the 2-D padding mask of past + current
    tokens, captured by a pre-hook on the decoder stack (layers only get the 4-D mask, which may be None)."""

    def __init__(self) -> None:
        self.attention_mask: torch.Tensor | None = None
        self.input_ids: torch.Tensor | None = None
        self.decoder: nn.Module | None = None
        self.record_states = True  # whether this forward keeps layer outputs (hidden states): no in-place writes
        self._facts: _Facts | None = None
        self._row_hashes: tuple[Any, list[int]] | None = None
        # A recorder (method/recording.py) while one is active: selection layers run densely for it and report
        # what they computed (the loss-oracle's dense pass, the router's fit).
        self.recorder: Any = None
        # Hooks run at the start of every forward this context captures (the loss-oracle's dense pass); each gets
        # (context, decoder kwargs) and may fill `given`, layer index -> [B, T], for the layers' policies.
        self.before_forward: list[Callable[["SequenceContext", dict], None]] = []
        self.given: dict[int, torch.Tensor] = {}
        # Progressive pruning: [B, T] bool, the tokens the latest progressive selection layer of this forward kept
        # (the others stay out of every later one); None before the first.
        self.alive: torch.Tensor | None = None

    def capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        config = getattr(module, "config", None)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            self.attention_mask = mask
        else:  # generation on a static cache hands the decoder 4-D masks, built by `generate` from the 2-D one
            self.attention_mask = padding_from_4d(mask, config)
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.input_ids = ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
        self.decoder = module
        self.alive = None
        self.record_states = bool(kwargs.get("output_hidden_states") or getattr(config, "output_hidden_states", False))
        self._facts = None
        self._row_hashes = None
        if self.recorder is None:  # a recorder's own forward is the dense pass the hooks would start
            self.given = {}
            for hook in self.before_forward:
                hook(self, kwargs)

    def row_hashes(self, B: int, T: int, past: int, valid: torch.Tensor | None) -> list[int]:
        """One hash per row of its real token ids in this chunk (and the cache length): the random ablation's
        per-sequence seed. Without input ids (inputs_embeds, calibration runner) rows are told apart by index."""
        key = (B, T, past)
        if self._row_hashes is not None and self._row_hashes[0] == key:
            return self._row_hashes[1]
        ids = self.input_ids
        if ids is None or ids.shape != (B, T):
            hashes = list(range(B))
        else:
            hashes = [token_hash(ids[b] if valid is None else ids[b][valid[b]], past) for b in range(B)]
        self._row_hashes = (key, hashes)
        return hashes

    def inplace_ok(self) -> bool:
        """May a selection layer write its rows into its input? Only inside a decoder forward this context saw
        begin (the decoder loop drops its reference to a layer's input), with autograd off, no hidden states
        recorded and no hooks on the layers (either could hold the previous layer's output)."""
        if self.record_states or self.decoder is None or torch.is_grad_enabled():
            return False
        layers = getattr(self.decoder, "layers", None)
        return layers is not None and not any(l._forward_hooks or l._forward_pre_hooks for l in layers)

    def facts(self, B: int, T: int, past: int, device: torch.device, ratio: float) -> _Facts:
        mask2d = self.attention_mask
        key = (B, T, past, ratio, device, id(mask2d))
        f = self._facts
        if f is not None and f.key == key:
            return f
        f = _Facts()
        f.key = key
        full_valid = None
        if mask2d is not None and mask2d.shape[1] >= past + T:
            # generation on a static cache may hand over the mask of every cache slot: the first past + T are ours
            full_valid = mask2d[:, :past + T].bool()
            if bool(full_valid.all()):  # one sync per forward, not per layer
                full_valid = None
        f.padded = full_valid is not None
        if not f.padded:
            f.valid = None
            f.sink_pos = torch.full((B,), -past, dtype=torch.long, device=device)
            f.in_chunk = None
            f.all_in_chunk = past == 0
            f.kmax = keep_count(T, ratio)
            f.k = torch.full((B,), f.kmax, dtype=torch.long, device=device)
            f.uniform = True
        else:
            f.valid = full_valid[:, past:]
            sink_abs = full_valid.to(torch.int8).argmax(dim=1)  # first real token of each row
            f.sink_pos = sink_abs - past  # < 0: the sink sits in the cache
            f.in_chunk = f.sink_pos >= 0
            f.k = tokens_to_keep(f.valid.sum(1), ratio)
            kmin, kmax, n_in = torch.stack([f.k.min(), f.k.max(), f.in_chunk.sum()]).tolist()
            f.kmax, f.uniform, f.all_in_chunk = int(kmax), kmin == kmax, n_in == B
        self._facts = f
        return f


def _gather_rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows of a [1 or B, T, C] tensor at idx [B, K] -> [B, K, C]."""
    B, K = idx.shape
    if t.shape[0] == 1 and B > 1:
        return t[0].index_select(0, idx.reshape(-1)).view(B, K, -1)
    return t.gather(1, idx.unsqueeze(-1).expand(B, K, t.shape[-1]))


def _cache_arg(kwargs: dict[str, Any]) -> Any:
    # transformers >= 5.20 calls it `cache`; earlier releases `past_key_values`
    return kwargs.get("cache", kwargs.get("past_key_values"))


class NonFiniteHiddenStates(ValueError):
    """A selection layer received NaN or inf: ranking tokens on them would be silent garbage."""


def check_finite(scores: torch.Tensor, layer_index: int) -> None:
    if scores.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(torch.isfinite(scores).all()):
            raise NonFiniteHiddenStates(
                f"layer {layer_index}: hidden states contain NaN or inf; OrthoRank cannot rank tokens on them "
                "(check the model's dtype and weights)")
    else:  # no host sync on accelerators or in a compiled graph: a device-side assert
        torch._assert_async(torch.isfinite(scores).all(), f"layer {layer_index}: NaN or inf in hidden states")


class _RowCall:
    """What one selective call hands its attention module: every token's attention input and RoPE, the selected
    rows and positions, the cache and the model's mask."""

    __slots__ = ("x", "pos_emb", "idx", "q_pos", "past", "cache", "mask4d", "key_keep", "padded", "rows")


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
    # keeping: 0.08-0.10 of a dense step cheaper; benchmarks/decode_step_parts.py). Off: the general path (the
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
        self._call: _RowCall | None = None  # the selective call in progress, read by the attention router
        self._routed = False
        self._hidden: torch.Tensor | None = None  # the residual stream entering the layer, for the policy
        self._given: torch.Tensor | None = None  # the per-token quantity a policy ranks by, during its selection
        self._prev_input: torch.Tensor | None = None  # prev-update: the previous layer's input (a hook sets it)
        self._chunk_kv: tuple | None = None  # (attention input, K, V) the attention policy computed for this call
        self.rule = config.rule  # the policy object (method/policies.py)
        # this layer's fitted parameters (the router's): a plan without them for this layer is refused here
        self._fitted = config.fitted.layer(layer_index) if FITTED in self.rule.needs else None

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

    def _scores(self, src: torch.Tensor, sink: torch.Tensor, facts: _Facts, B: int, T: int, past: int):
        """The policy's ascending keys [B, T], with the modifiers' always-updated tokens first."""
        cfg, rule = self.config, self.rule
        # distance from the row's sink: pads before it and the cache's tokens counted right (sink_pos < 0: in cache)
        positions = (torch.arange(T, device=src.device).view(1, T) - facts.sink_pos.view(-1, 1)
                     if FITTED in rule.needs else None)
        inputs = PolicyInputs(src=src, hidden=self._hidden, past=past, positions=positions, criterion=cfg.criterion,
                              sink=sink if SINK in rule.needs else None,
                              random_draw=self._random_draw(facts, B, T, past) if RANDOM in rule.needs else None,
                              given=self._given, fitted=self._fitted)
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

    def _select(self, h: torch.Tensor, x: torch.Tensor, past: int, facts: _Facts):
        cfg = self.config
        B, T, _ = h.shape
        src = x if cfg.source == "normed" else h

        if not facts.padded and past == 0:
            # Fast path: every token valid, sink at position 0, the same K per row: no sync.
            sink = src[:, 0]
            self._sink_state = sink.clone()
            K = facts.kmax
            keys = None
            if K < T:
                keys = self._scores(src, sink, facts, B, T, past)
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

        keys = self._scores(src, sink, facts, B, T, past)
        if past > 0 and cfg.decode == "threshold" and self._cutoff is not None:
            keep = valid & (keys <= self._cutoff.unsqueeze(1))
            keep &= sink_pos.unsqueeze(1) != torch.arange(T, device=h.device)
            return keep_to_indices(keep)  # data-dependent count: one sync
        keep = topk_keep_mask(keys, valid, torch.where(in_chunk, sink_pos, -1), facts.k)
        if past == 0 and cfg.decode == "threshold":
            kept_keys = torch.where(keep, keys.float(), torch.full_like(keys, float("-inf"), dtype=torch.float32))
            self._cutoff = kept_keys.amax(dim=1)
        idx, real = keep_to_indices(keep, facts.kmax)
        return idx, (None if facts.uniform else real)

    def _random_draw(self, facts: _Facts, B: int, T: int, past: int) -> torch.Tensor | None:
        """The random ablation's keys: a fresh pattern per sequence, reproducible from the seed and the sequence's
        own tokens (independent of batch size, the row's place in the batch and its padding)."""
        valid = facts.valid
        hashes = self._context.row_hashes(B, T, past, valid)
        seeds = [sequence_seed(self.config.seed, self.layer_index, hsh) for hsh in hashes]
        counts = [T] * B if valid is None else valid.sum(1).tolist()
        return random_keys(counts, T, seeds, valid, facts.sink_pos.device)

    # -- forward -------------------------------------------------------------------------------------------------

    def __call__(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._forward(hidden_states, *args, **kwargs)
        finally:
            self._hidden = None  # the layer's input is the policy's only while it chooses: not kept past the call
            self._chunk_kv = None

    def _forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        layer, cfg = self.layer, self.config
        attn = layer.self_attn
        B, T, _ = hidden_states.shape
        if T == 1 and cfg.decode == "dense":
            # One token: ceil(ratio * 1) = 1, the dense layer. Decided before reading the cache length, which a
            # static cache computes with a host read: a dense-decode step stays capturable (CUDA graphs, compile).
            self._last = None
            return self.inner(hidden_states, *args, **kwargs)
        cache = _cache_arg(kwargs)
        past = int(cache.get_seq_length(attn.layer_idx)) if cache is not None else 0
        if past == 0:
            self._sink_state, self._cutoff = None, None
        recorder = self._context.recorder
        if recorder is not None:
            return self._recorded(recorder, hidden_states, args, kwargs, past)

        x = self.adapter.attention_input(layer, hidden_states)
        src = self.adapter.score_input(hidden_states, x) if cfg.source == "normed" else hidden_states
        self._hidden = hidden_states
        facts = self._context.facts(B, T, past, hidden_states.device, cfg.ratio)
        needs = self.rule.needs
        if DENSE_UPDATE in needs:
            return self._oracle(hidden_states, args, kwargs, src, past, facts)
        if T == 1 and B == 1 and past > 0 and self._plain_threshold_step(facts):
            return self._threshold_step(hidden_states, x, src, args, kwargs, cache, facts, past)
        given = None
        if PREV_INPUT in needs:
            prev, self._prev_input = self._prev_input, None
            if prev is not None and prev.shape == hidden_states.shape:
                given = torch.linalg.vector_norm((hidden_states - prev).float(), dim=-1)
        elif ATTENTION in needs:
            given = self._attention_received(x, kwargs["position_embeddings"], facts, cache, past)
        elif LOSS_EFFECT in needs:
            given = self._loss_effect(B, T, past)
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

        call = _RowCall()
        call.x, call.idx, call.past, call.cache = x, idx, past, cache
        call.q_pos = past + idx
        call.padded = facts.padded
        call.pos_emb = kwargs["position_embeddings"]
        mask = kwargs.get("attention_mask", args[0] if args else None)
        call.mask4d = mask if isinstance(mask, torch.Tensor) and mask.dim() == 4 else None
        call.key_keep = self._key_keep(idx, real, B, T, past, facts, hidden_states.device)
        call.rows = None
        if real is not None and T == 1 and not args and self.compact_decode_rows:
            # A decode step with some rows kept and some not (threshold policy): run the layer on the kept rows
            # only, batch-compacted, instead of on every row with the others' updates discarded.
            rows = real[:, 0].nonzero().squeeze(1)
            if rows.numel() < B:
                return self._compacted(hidden_states, kwargs, call, rows)

        # The family's layer forward on the selected rows only, at their own RoPE positions.
        sel_kwargs = dict(kwargs)
        cos, sin = call.pos_emb
        sel_kwargs["position_embeddings"] = (_gather_rows(cos, idx), _gather_rows(sin, idx))
        h_sel = _gather_rows(hidden_states, idx)  # [B, K, D]
        if self._routed:  # installed by apply_orthorank: no module attribute changes during the forward
            self._call = call
            try:
                out = self.inner(h_sel, *args, **sel_kwargs)
            finally:
                self._call = None
        else:  # a bare wrapper (search runner, layer benchmarks): route for this call only
            with patched_forward(attn, self._attention_forward(call)):  # inside any accelerate hook
                out = self.inner(h_sel, *args, **sel_kwargs)
        h_new = out[0] if isinstance(out, tuple) else out
        if real is not None:
            # Filler entries (rows with fewer kept tokens) write back their own unchanged state.
            h_new = torch.where(real.unsqueeze(-1), h_new, h_sel)
        index = idx.unsqueeze(-1).expand_as(h_new)
        if self._context.inplace_ok():
            result = hidden_states.scatter_(1, index, h_new)  # no copy of the whole residual stream
        else:
            result = hidden_states.scatter(1, index, h_new)
        return (result, *out[1:]) if isinstance(out, tuple) else result

    def _plain_threshold_step(self, facts: _Facts) -> bool:
        """May this decode step take `_threshold_step`: the threshold policy on a sink-score order with default K/V
        handling and no always-updated tokens, one unpadded sequence whose sink state and cut-off are known."""
        cfg = self.config
        return (self.fast_threshold_step and cfg.decode == "threshold" and self.rule.pointwise
                and cfg.bypass_kv and not cfg.sink_kv_visible and not cfg.keep_recent and not cfg.keep_first
                and not facts.padded and self._cutoff is not None and self._sink_state is not None
                and self._sink_state.shape[0] == 1)

    def _threshold_step(self, hidden_states: torch.Tensor, x: torch.Tensor, src: torch.Tensor, args: tuple,
                        kwargs: dict[str, Any], cache: Any, facts: _Facts, past: int) -> Any:
        """One new token of one sequence under the threshold policy: the general path's decision (its key against
        the prefill's cut-off; the sink lies in the cache), then the dense layer or the bypass."""
        keys = self._scores(src, self._sink_state, facts, 1, 1, past)  # [1, 1]
        kept = bool(keys[0, 0] <= self._cutoff[0])  # the step's one host read
        self._last = (torch.zeros(1, int(kept), dtype=torch.long, device=hidden_states.device), None, 1)
        if kept:  # the selected query attends to every key: the dense layer's update on this one token
            return self.inner(hidden_states, *args, **kwargs)
        return self._bypass(hidden_states, x, kwargs, cache)

    def _bypass(self, hidden_states: torch.Tensor, x: torch.Tensor, kwargs: dict[str, Any], cache: Any) -> torch.Tensor:
        """No token updated: only every token's keys and values go into the cache; the states pass unchanged."""
        if cache is not None:
            k, v = self._keys_values(x, kwargs["position_embeddings"])
            cache.update(k, v, self.layer.self_attn.layer_idx)
        return hidden_states

    def _select_given(self, given: torch.Tensor | None, h: torch.Tensor, src: torch.Tensor, past: int,
                      facts: _Facts):
        """_select with the per-token quantity a policy ranks by (PolicyInputs.given) in place for it."""
        self._given = given
        try:
            return self._select(h, src, past, facts)
        finally:
            self._given = None

    def _oracle(self, hidden_states: torch.Tensor, args: tuple, kwargs: dict[str, Any], src: torch.Tensor,
                past: int, facts: _Facts) -> Any:
        """The oracle policy: the dense layer (every token's update, every key and value into the cache), then only
        the K largest updates kept. A selected token's update equals its dense update (its query sees every key
        either way), so this is exactly the selective layer with the best choice of tokens: an upper bound."""
        out = self.inner(hidden_states, *args, **kwargs)
        h_new = out[0] if isinstance(out, tuple) else out
        norms = torch.linalg.vector_norm((h_new - hidden_states).float(), dim=-1)
        sel = self._select_given(norms, hidden_states, src, past, facts)
        if sel is None:
            self._last = None
            return out
        idx, real = sel
        B, T, _ = hidden_states.shape
        self._last = (idx, real, T)
        keep = torch.zeros(B, T, dtype=torch.bool, device=hidden_states.device)
        keep.scatter_(1, idx, True if real is None else real)
        result = torch.where(keep.unsqueeze(-1), h_new, hidden_states)
        return (result, *out[1:]) if isinstance(out, tuple) else result

    def _loss_effect(self, B: int, T: int, past: int) -> torch.Tensor:
        """The loss-oracle's keys [B, T]: this layer's <dL/dh_i, f(x)_i - x_i> from the dense pass that the
        context's before-forward hook ran on this forward's input (method/recording.py)."""
        effect = self._context.given.get(self.layer_index)
        if past > 0 or effect is None or effect.shape != (B, T):
            raise UserError("the loss-oracle policy reads each window's own next tokens: it applies to whole-window "
                            "perplexity (ppl, compare), not to cached generation or chunked prefill")
        return effect

    def _recorded(self, recorder: Any, hidden_states: torch.Tensor, args: tuple, kwargs: dict[str, Any],
                  past: int) -> Any:
        """The layer for a recorder (method/recording.py): the dense update of every token, then either every
        update kept (recorder.select False: the dense model) or only those the layer's own policy selects, with
        what the layer computed handed to the recorder. Autograd stays on: recorders take gradients through it."""
        if past > 0:
            raise UserError("recording a selection layer needs whole windows (no KV cache)")
        if torch.is_grad_enabled() and not hidden_states.requires_grad:
            hidden_states = hidden_states.detach().requires_grad_(True)  # the first layer gradients must reach
        x = self.adapter.attention_input(self.layer, hidden_states)
        src = self.adapter.score_input(hidden_states, x) if self.config.source == "normed" else hidden_states
        out = self.inner(hidden_states, *args, **kwargs)
        h_new = out[0] if isinstance(out, tuple) else out
        result, keep = h_new, None
        if recorder.select:
            B, T, _ = hidden_states.shape
            with torch.no_grad():
                self._hidden = hidden_states.detach()
                facts = self._context.facts(B, T, 0, hidden_states.device, self.config.ratio)
                sel = self._select_given(None, hidden_states.detach(), src.detach(), 0, facts)
            if sel is not None:
                idx, real = sel
                keep = torch.zeros(B, T, dtype=torch.bool, device=h_new.device)
                keep.scatter_(1, idx, True if real is None else real)
                result = torch.where(keep.unsqueeze(-1), h_new, hidden_states)
        recorder.add(self, hidden_states=hidden_states, src=src, dense_out=h_new, out=result, keep=keep)
        return (result, *out[1:]) if isinstance(out, tuple) else result

    def _attention_received(self, x: torch.Tensor, pos_emb, facts: _Facts, cache, past: int) -> torch.Tensor:
        """The `attention` policy's estimate [B, T] (method/policies.py), from this layer's own queries and keys
        (the chunk's keys, and the cached ones where a cache holds them)."""
        attn, adapter = self.layer.self_attn, self.adapter
        T = x.shape[1]
        W = min(self.config.attention_window or ATTENTION_WINDOW, T)
        cos, sin = pos_emb
        q = adapter.rope(attn, adapter.queries(attn, x[:, T - W:]), cos[:, T - W:], sin[:, T - W:])
        k, v = self._keys_values(x, pos_emb)  # [B, Hkv, T, d]
        self._chunk_kv = (x, k, v)  # the selective call's attention reuses them (one K/V projection per layer)
        if past > 0 and cache is not None:
            layer_cache = cache.layers[attn.layer_idx] if hasattr(cache, "layers") else None
            cached = getattr(layer_cache, "keys", None)
            if cached is not None and cached.shape[2] == past:
                k = torch.cat([cached.to(k.dtype), k], dim=2)
            else:
                past = 0  # cached keys not readable here: the estimate sees this chunk only
        return attention_received(q.transpose(1, 2), k, attn.scaling, facts.valid, past)

    def _compacted(self, hidden_states: torch.Tensor, kwargs: dict[str, Any], call: _RowCall,
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
        if self._routed:
            self._call = call
            try:
                out = self.inner(h_sel, **sel_kwargs)
            finally:
                self._call = None
        else:
            with patched_forward(self.layer.self_attn, self._attention_forward(call)):
                out = self.inner(h_sel, **sel_kwargs)
        h_new = out[0] if isinstance(out, tuple) else out
        result = hidden_states.index_copy(0, rows, h_new)
        return (result, *out[1:]) if isinstance(out, tuple) else result

    def _key_keep(self, idx, real, B, T, past, facts, device) -> torch.Tensor | None:
        """Ablation (bypass_kv=False): bypassed tokens of this chunk offer no keys/values (cached ones still do).
        [B, past + T] bool, or None when every key stays."""
        cfg = self.config
        if cfg.bypass_kv:
            return None
        keep = torch.zeros(B, T, dtype=torch.bool, device=device).scatter_(1, idx, True if real is None else real)
        if cfg.sink_kv_visible:  # variant: the sink's keys/values stay visible although it is bypassed
            rows = torch.nonzero(facts.sink_pos >= 0).squeeze(-1)
            keep[rows, facts.sink_pos[rows]] = True
        return torch.cat([torch.ones(B, past, dtype=torch.bool, device=device), keep], dim=1)

    def _keys_values(self, x: torch.Tensor, pos_emb) -> tuple[torch.Tensor, torch.Tensor]:
        """Every token's keys (RoPE at its true position) and values: [B, Hkv, T, d] each."""
        attn = self.layer.self_attn
        k, v = self.adapter.keys_values(attn, x)
        cos, sin = pos_emb
        return self.adapter.rope(attn, k, cos, sin).transpose(1, 2), v.transpose(1, 2)

    def install_router(self) -> Callable[[], None]:
        """Route the attention module through this layer for as long as it is installed: during a selective call
        it runs selective attention, otherwise its own forward. Nothing on the modules changes during a forward
        (what torch.compile needs). Returns the undo."""
        attn = self.layer.self_attn
        inner = current_forward(attn)

        def route(hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
            call = self._call
            if call is None:
                return inner(hidden_states, *args, **kwargs)
            return self._attention_forward(call)(hidden_states, *args, **kwargs)

        undo = install_forward(attn, route)
        self._routed = True

        def restore() -> None:
            undo()
            self._routed = False

        return restore

    def _attention_forward(self, call: _RowCall) -> Callable[..., Any]:
        layer, adapter = self.layer, self.adapter
        attn = layer.self_attn

        def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
            # hidden_states: the attention input of the selected rows [B, K, D]; position_embeddings: theirs
            cos_q, sin_q = kwargs.get("position_embeddings", args[0] if args else None)
            q = adapter.rope(attn, adapter.queries(attn, hidden_states), cos_q, sin_q)  # [B, K, H, d]
            kept = self._chunk_kv
            if kept is not None and kept[0] is call.x:
                k, v = kept[1], kept[2]
            else:
                k, v = self._keys_values(call.x, call.pos_emb)  # [B, Hkv, T, d]
            if call.cache is not None:
                k, v = call.cache.update(k, v, attn.layer_idx)  # complete cache: every token's K/V
            B, T = call.x.shape[:2]
            S = k.shape[2]
            k_offset = 0 if S >= call.past + T else call.past + T - S  # sliding caches keep the latest keys
            mask = None
            if call.mask4d is not None:
                m = call.mask4d.expand(B, -1, -1, -1)
                mask = m.gather(2, call.idx[:, None, :, None].expand(B, m.shape[1], call.idx.shape[1], m.shape[3]))
                mask = mask[..., :S]
            if self._gathers_keys(call, mask, S):
                return attn.o_proj(self._pruned_attention(q, call, k, v)), None
            key_valid = self._key_valid(call, B, T, S, k_offset, mask is not None)
            q_pos, idx = call.q_pos, call.idx
            if call.rows is not None:  # batch-compacted decode step: the kept rows' keys, values and masks
                r = call.rows
                k, v, q_pos, idx = k.index_select(0, r), v.index_select(0, r), q_pos[r], idx[r]
                mask = None if mask is None else mask.index_select(0, r)
                key_valid = None if key_valid is None else key_valid.index_select(0, r)
                B = r.numel()
            o, w = selective_attention(
                q, q_pos, k, v, scale=attn.scaling, k_offset=k_offset, key_valid=key_valid,
                window=self._window, softcap=self._softcap, mask=mask, backend=self.backend, attn_module=attn,
                max_chunks=self.max_attention_chunks, min_chunk_keys=self.min_chunk_keys)
            out = attn.o_proj(o)
            if w is not None:  # rows that ran attention report their weights; bypassed rows report zeros
                full = w.new_zeros(B, w.shape[1], T, w.shape[-1])
                w = full.scatter(2, idx[:, None, :, None].expand_as(w), w)
                if call.rows is not None:
                    w = w.new_zeros(call.x.shape[0], *w.shape[1:]).index_copy(0, call.rows, w)
            return out, w

        return forward

    def _gathers_keys(self, call: _RowCall, mask: torch.Tensor | None, S: int) -> bool:
        """Whether progressive pruning's prefill takes the gathered path: the kept keys only, in full-attention
        layers of unpadded whole sequences (elsewhere the pruned keys are masked instead: the same result, no saving),
        and not under eager attention, whose weights a caller may read."""
        return (self.config.progressive and call.key_keep is not None and call.past == 0 and not call.padded
                and mask is None and call.rows is None and self._window is None and S == call.x.shape[1]
                and self.backend != "eager")

    def _pruned_attention(self, q: torch.Tensor, call: _RowCall, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The kept queries [B, K, H, d] against the kept keys only (and the sink's where it stays visible), gathered:
        the attention core costs K x K per head instead of K x T. Causality holds in the kept tokens' own order, so
        each query's position becomes its place among the kept keys (positions already sit in RoPE)."""
        attn = self.layer.self_attn
        kidx, _ = keep_to_indices(call.key_keep)  # [B, S'] every row keeps as many: no padding
        B, Hkv, _, d = k.shape
        gather = kidx[:, None, :, None].expand(B, Hkv, kidx.shape[1], d)
        k_sel = k.gather(2, gather)
        v_sel = v.gather(2, kidx[:, None, :, None].expand(B, Hkv, kidx.shape[1], v.shape[-1]))
        q_place = torch.searchsorted(kidx, call.q_pos, right=True) - 1  # every query is itself a kept key
        o, _ = selective_attention(q, q_place, k_sel, v_sel, scale=attn.scaling, softcap=self._softcap,
                                   backend=self.backend, attn_module=attn, max_chunks=self.max_attention_chunks,
                                   min_chunk_keys=self.min_chunk_keys)
        return o

    def _key_valid(self, call: _RowCall, B: int, T: int, S: int, k_offset: int, have_mask: bool):
        """[B, S] bool or None: keys that may be attended apart from causality and the window."""
        parts = [] if call.key_keep is None else [call.key_keep]
        pad = self._context.attention_mask
        if not have_mask and call.padded and pad is not None and pad.shape[0] == B and pad.shape[1] >= call.past + T:
            # No 4-D mask from the model (SDPA's causal shortcut, flash's 2-D mask, flex's block mask): padding
            # comes from the 2-D mask of past + current tokens that the context captured.
            parts.append(pad[:, :call.past + T].bool())
        if not parts:
            return None
        valid = parts[0] if len(parts) == 1 else parts[0] & parts[1]
        valid = valid[:, k_offset:k_offset + S]
        if valid.shape[1] < S:  # static caches: unfilled slots lie beyond every query (causally masked anyway)
            valid = F.pad(valid, (0, S - valid.shape[1]), value=False)
        return valid


@contextmanager
def patched_forward(module: nn.Module, forward: Callable[..., Any]):
    restore = install_forward(module, forward)
    try:
        yield
    finally:
        restore()


def install_forward(module: nn.Module, forward: Callable[..., Any]) -> Callable[[], None]:
    """Replace the instance's forward (keeping class, hooks and state_dict keys), composing with accelerate: where
    its hook wraps forward, replace the `_old_forward` it calls. Returns a function that undoes it."""
    attr = "_old_forward" if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward") else "forward"
    had = attr in module.__dict__
    previous = module.__dict__.get(attr)
    setattr(module, attr, forward)

    def restore() -> None:
        if had:
            setattr(module, attr, previous)
        else:
            delattr(module, attr)

    return restore


def current_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward an installed replacement should call through to."""
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        return module._old_forward
    return module.__dict__.get("forward") or type(module).forward.__get__(module)
