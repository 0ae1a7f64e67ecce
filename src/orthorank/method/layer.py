"""A token-selective decoder layer that wraps a model's own layer and calls its submodules.

Selected tokens get the full layer update; bypassed tokens leave the layer unchanged, but their keys and values
are still computed (at their true positions) so that selected queries attend to every key and the KV cache stays
complete.

Cost: everything except the input norm, K/V projections and RoPE on K runs on the selected rows only.
- Rows are gathered and written back with index_select / index_copy on the flattened [B*T, D] states: one
  read of the kept rows each, and one out-of-place copy of the input (callers may still hold it).
- With no padding and no cache (prefill), every row keeps the same K = ceil(ratio * T) tokens and the sink is
  position 0, so selection needs no device-to-host sync; facts that need one with padding (which rows are padded,
  the largest K) are computed once per forward for all selection layers (SequenceContext.facts).
- Grouped-query attention folds the query heads of each KV head into the query axis ([B, Hkv, K*G, d]), so
  K/V are never repeated and SDPA's masked kernels (which do not take GQA) need no fallback.
- A subset of queries needs a mask (SDPA's is_causal aligns queries to the last keys). The selected queries are
  in position order, so long sequences are attended in a few query chunks, each against only the keys up to its
  last position: the masked work falls from K*S towards K*S/2, as for a causal dense layer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orthorank.method.selection import (
    SelectionConfig,
    keep_count,
    keep_to_indices,
    rank_keys,
    random_keys,
    sequence_seed,
    sink_scores,
    token_hash,
    tokens_to_keep,
    top_k_indices,
    topk_keep_mask,
)
from orthorank.models.adapters import FamilyAdapter


class _Facts:
    """What every selection layer of one forward shares: padding, sink positions, tokens to keep."""

    __slots__ = ("key", "padded", "valid", "sink_pos", "in_chunk", "all_in_chunk", "k", "kmax", "uniform")


class SequenceContext:
    """Per-forward facts shared by all selection layers of one model: the 2-D padding mask of past + current
    tokens, captured by a pre-hook on the decoder stack (layers only get the 4-D mask, which may be None)."""

    def __init__(self) -> None:
        self.attention_mask: torch.Tensor | None = None
        self.input_ids: torch.Tensor | None = None
        self._facts: _Facts | None = None
        self._row_hashes: tuple[Any, list[int]] | None = None

    def capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self.attention_mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.input_ids = ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
        self._facts = None
        self._row_hashes = None

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

    def facts(self, B: int, T: int, past: int, device: torch.device, ratio: float) -> _Facts:
        mask2d = self.attention_mask
        key = (B, T, past, ratio, device, id(mask2d))
        f = self._facts
        if f is not None and f.key == key:
            return f
        f = _Facts()
        f.key = key
        full_valid = None
        if mask2d is not None and mask2d.shape[1] == past + T:
            full_valid = mask2d.bool()
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


def _rows(t: torch.Tensor, idx: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Rows of a [1 or B, T, C] tensor at idx [B, K] -> [B*K, C]; flat = idx + row offsets."""
    if t.shape[0] == 1:
        return t[0].index_select(0, idx.reshape(-1))
    return t.reshape(-1, t.shape[-1]).index_select(0, flat)


class OrthoRankLayer(nn.Module):
    # Attention over long sequences runs in up to this many query chunks of at least min_chunk_keys keys each
    # (exact either way; more chunks skip more masked work but cost one small device-to-host copy per layer).
    max_attention_chunks = 4
    min_chunk_keys = 512

    def __init__(
        self,
        layer: nn.Module,
        adapter: FamilyAdapter,
        config: SelectionConfig,
        context: SequenceContext,
        layer_index: int,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.config = config
        self.layer_index = layer_index
        self._context = context
        self._rotate_half = adapter.rotate_half(layer)
        # Sink state and prefill cut-off per row, kept for chunks whose sink lies in the KV cache.
        self._sink_state: torch.Tensor | None = None
        self._cutoff: torch.Tensor | None = None
        self._last: tuple[torch.Tensor, torch.Tensor | None, int] | None = None

    @property
    def last_keep(self) -> torch.Tensor | None:
        """[B, T] bool: the tokens the latest call updated (None when it ran densely), for analysis and tests."""
        if self._last is None:
            return None
        idx, real, T = self._last
        keep = torch.zeros(idx.shape[0], T, dtype=torch.bool, device=idx.device)
        return keep.scatter_(1, idx, True if real is None else real)

    def extra_repr(self) -> str:
        c = self.config
        return f"ratio={c.ratio}, criterion={c.criterion}, source={c.source}, order={c.order}, bypass_kv={c.bypass_kv}"

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # The family's formula, op for op (x * cos + rotate_half(x) * sin); cos/sin broadcast against x.
        return x * cos + self._rotate_half(x) * sin

    # -- selection -----------------------------------------------------------------------------------------------

    def select_indices(self, h: torch.Tensor, x: torch.Tensor, past: int = 0):
        """(idx [B, K] positions to update, real [B, K] or None when every entry is real), or None: run densely."""
        B, T, _ = h.shape
        facts = self._context.facts(B, T, past, h.device, self.config.ratio)
        return self._select(h, x, past, facts)

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
                keys = rank_keys(sink_scores(src, sink, cfg.criterion), cfg.order, self._random_draw(facts, B, T, past))
                idx = top_k_indices(keys, K, sink_pos=0)
            else:
                idx = torch.arange(T, device=h.device).expand(B, T)
            if cfg.decode == "threshold":
                if keys is None:
                    keys = rank_keys(sink_scores(src, sink, cfg.criterion), cfg.order,
                                     self._random_draw(facts, B, T, past))
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

        keys = rank_keys(sink_scores(src, sink, cfg.criterion), cfg.order, self._random_draw(facts, B, T, past))
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
        if self.config.order != "random":
            return None
        valid = facts.valid
        hashes = self._context.row_hashes(B, T, past, valid)
        seeds = [sequence_seed(self.config.seed, self.layer_index, hsh) for hsh in hashes]
        counts = [T] * B if valid is None else valid.sum(1).tolist()
        return random_keys(counts, T, seeds, valid, self._device_of(facts))

    @staticmethod
    def _device_of(facts: _Facts) -> torch.device:
        return facts.sink_pos.device

    # -- forward -------------------------------------------------------------------------------------------------

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer, cfg = self.layer, self.config
        attn = layer.self_attn
        B, T, _ = hidden_states.shape
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length(attn.layer_idx)) if cache is not None else 0
        if past == 0:
            self._sink_state, self._cutoff = None, None
        if T == 1 and past > 0 and cfg.decode == "dense":
            self._last = None
            return layer(hidden_states, *args, **kwargs)  # one new token: ceil(ratio * 1) = 1, the dense layer

        x = layer.input_layernorm(hidden_states)
        facts = self._context.facts(B, T, past, hidden_states.device, cfg.ratio)
        sel = self._select(hidden_states, x, past, facts)
        if sel is None:
            self._last = None
            return layer(hidden_states, *args, **kwargs)
        idx, real = sel
        self._last = (idx, real, T)
        mask4d = kwargs.get("attention_mask", args[0] if args else None)
        return self._update(hidden_states, x, idx, real, past, cache, mask4d, kwargs["position_embeddings"])

    def _update(self, h, x, idx, real, past, cache, mask4d, position_embeddings) -> torch.Tensor:
        layer, cfg = self.layer, self.config
        attn = layer.self_attn
        B, T, D = h.shape
        K = idx.shape[1]
        hd = attn.head_dim
        flat = (idx + torch.arange(0, B * T, T, device=h.device).unsqueeze(1)).reshape(-1)  # [B*K]
        h2, x2 = h.reshape(B * T, D), x.reshape(B * T, D)

        # Keys and values of every token, at their true positions.
        cos, sin = position_embeddings  # [B|1, T, d]
        k = attn.k_proj(x).view(B, T, -1, hd)
        v = attn.v_proj(x).view(B, T, -1, hd)
        k = self._rope(k, cos.unsqueeze(2), sin.unsqueeze(2)).transpose(1, 2)  # [B, Hkv, T, d]
        v = v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx)  # complete cache: every token's K/V
        Hkv, S = k.shape[1], k.shape[2]

        # Queries of the selected tokens only. RoPE runs on the contiguous [B*K, H, d] rows; for SDPA, the G query
        # heads that share a KV head are then laid out next to each other along the query axis: [B, Hkv, K, G, d].
        q = attn.q_proj(x2.index_select(0, flat))  # [B*K, H*d]
        H = q.shape[-1] // hd
        G = H // Hkv
        q = self._rope(q.view(B * K, H, hd), _rows(cos, idx, flat).unsqueeze(1), _rows(sin, idx, flat).unsqueeze(1))
        q = q.view(B, K, Hkv, G, hd).permute(0, 2, 1, 3, 4)  # a view; chunks are copied as SDPA needs them

        key_keep = None
        if not cfg.bypass_kv:
            # Ablation: bypassed tokens of this chunk offer no keys/values (cached past tokens still do).
            keep = torch.zeros(B, T, dtype=torch.bool, device=h.device).scatter_(
                1, idx, True if real is None else real)
            if cfg.sink_kv_visible:  # variant: the sink's keys/values stay visible although it is bypassed
                sink_pos = self._context.facts(B, T, past, h.device, cfg.ratio).sink_pos
                rows = torch.nonzero(sink_pos >= 0).squeeze(-1)
                keep[rows, sink_pos[rows]] = True
            key_keep = torch.cat([torch.ones(B, past, dtype=torch.bool, device=h.device), keep], dim=1)
        model_mask = isinstance(mask4d, torch.Tensor) and mask4d.dim() == 4
        if model_mask:
            m = mask4d.expand(B, -1, -1, -1)
            rows = m.gather(2, idx[:, None, :, None].expand(B, m.shape[1], K, m.shape[3]))[..., :S]
            if rows.shape[1] != 1:  # a per-head mask (no HF model makes one): plain GQA layout, one call
                return self._finish(h2, flat, real, B, T, self._attend_per_head(q, k, v, rows, key_keep))
        q_pos = past + idx  # [B, K]

        chunks = self._chunks(K, S)
        if len(chunks) > 1:
            ends = torch.stack([q_pos[:, a:b].amax() for a, b in chunks]).tolist()  # one sync per layer
        else:
            ends = [S - 1]
        out = torch.empty((B, K, Hkv, G, hd), dtype=q.dtype, device=q.device)
        for (a, b), last in zip(chunks, ends):
            # Keys up to the chunk's last query position, rounded up to a multiple of 64 (aligned shapes for the
            # kernels; the extra keys are masked anyway).
            Sc = min(S, -(-(int(last) + 1) // 64) * 64)
            if model_mask:
                mask = rows[:, :, a:b, :Sc]
            else:
                mask = (torch.arange(Sc, device=h.device)[None, None, :] <= q_pos[:, a:b, None]).unsqueeze(1)
            if key_keep is not None:
                kk = key_keep[:, None, None, :Sc]
                mask = mask & kk if mask.dtype == torch.bool else mask.masked_fill(~kk, torch.finfo(mask.dtype).min)
            if G > 1:  # the mask row of a selected token serves its G query heads
                mask = mask.unsqueeze(3).expand(B, 1, b - a, G, Sc).reshape(B, 1, (b - a) * G, Sc)
            qc = q[:, :, a:b]  # [B, Hkv, Kc, G, d]
            qc = qc.squeeze(3) if G == 1 else qc.reshape(B, Hkv, (b - a) * G, hd)
            o = F.scaled_dot_product_attention(qc, k[:, :, :Sc], v[:, :, :Sc], attn_mask=mask, scale=attn.scaling)
            out[:, a:b] = o.view(B, Hkv, b - a, G, hd).transpose(1, 2)
        return self._finish(h2, flat, real, B, T, out.view(B * K, Hkv * G * hd))

    def _chunks(self, K: int, S: int) -> list[tuple[int, int]]:
        n = max(1, min(self.max_attention_chunks, S // max(1, self.min_chunk_keys), K // 16))
        bounds = [round(i * K / n) for i in range(n + 1)]
        return [(bounds[i], bounds[i + 1]) for i in range(n) if bounds[i + 1] > bounds[i]]

    def _attend_per_head(self, q, k, v, mask, key_keep) -> torch.Tensor:
        attn = self.layer.self_attn
        B, Hkv, K, G, hd = q.shape
        if key_keep is not None:
            kk = key_keep[:, None, None, :]
            mask = mask & kk if mask.dtype == torch.bool else mask.masked_fill(~kk, torch.finfo(mask.dtype).min)
        qh = q.permute(0, 1, 3, 2, 4).reshape(B, Hkv * G, K, hd)  # q: [B, Hkv, K, G, d]
        o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=G > 1)
        return o.transpose(1, 2).reshape(B * K, Hkv * G * hd)

    def _finish(self, h2, flat, real, B, T, attn_heads) -> torch.Tensor:
        layer = self.layer
        out = layer.self_attn.o_proj(attn_heads)  # [B*K, D]
        h_sel = h2.index_select(0, flat)
        h_new = h_sel + out
        h_new = h_new + layer.mlp(layer.post_attention_layernorm(h_new))
        if real is not None:
            # Filler entries (rows with fewer kept tokens) write back their own unchanged state.
            h_new = torch.where(real.reshape(-1, 1), h_new, h_sel)
        return h2.index_copy(0, flat, h_new).view(B, T, -1)
