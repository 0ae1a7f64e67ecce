"""A token-selective decoder layer that wraps a model's own layer and calls its submodules.

Selected tokens get the full layer update; bypassed tokens leave the layer unchanged, but their keys and values
are still computed (at their true positions) so that selected queries attend to every key and the KV cache stays
complete.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orthorank.method.selection import (
    SelectionConfig,
    keep_to_indices,
    rank_keys,
    sink_scores,
    tokens_to_keep,
    topk_keep_mask,
)
from orthorank.models.adapters import FamilyAdapter


class SequenceContext:
    """Per-forward facts shared by all selection layers of one model: the 2-D padding mask of past + current
    tokens, captured by a pre-hook on the decoder stack (layers only get the 4-D mask, which may be None)."""

    def __init__(self) -> None:
        self.attention_mask: torch.Tensor | None = None

    def capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self.attention_mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None


def _gather_tokens(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t: [B or 1, T, C], idx: [B, K] -> [B, K, C]."""
    t = t.expand(idx.shape[0], -1, -1)
    return t.gather(1, idx.unsqueeze(-1).expand(-1, -1, t.shape[-1]))


class OrthoRankLayer(nn.Module):
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
        self.last_keep: torch.Tensor | None = None  # [B, T] of the latest call, for analysis and tests

    def extra_repr(self) -> str:
        c = self.config
        return f"ratio={c.ratio}, criterion={c.criterion}, source={c.source}, order={c.order}, bypass_kv={c.bypass_kv}"

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [B, H, T, d]; cos/sin: [B, T, d]
        return x * cos.unsqueeze(1) + self._rotate_half(x) * sin.unsqueeze(1)

    def _select(
        self, h: torch.Tensor, x: torch.Tensor, past: int
    ) -> torch.Tensor | None:
        """Returns keep [B, T], or None when the layer should run densely."""
        B, T, _ = h.shape
        cfg = self.config
        src = x if cfg.source == "normed" else h
        mask2d = self._context.attention_mask
        if mask2d is not None and mask2d.shape[1] == past + T:
            full_valid = mask2d.bool()
        else:
            full_valid = torch.ones(B, past + T, dtype=torch.bool, device=h.device)
        valid = full_valid[:, past:]
        sink_abs = full_valid.to(torch.int8).argmax(dim=1)  # first real token of each row
        sink_pos = sink_abs - past  # < 0: the sink sits in the cache

        in_chunk = sink_pos >= 0
        chunk_sink = src.gather(1, sink_pos.clamp_min(0).view(B, 1, 1).expand(B, 1, src.shape[-1])).squeeze(1)
        if bool(in_chunk.all()):
            sink = chunk_sink
        elif self._sink_state is not None and self._sink_state.shape == chunk_sink.shape:
            sink = torch.where(in_chunk.unsqueeze(1), chunk_sink, self._sink_state)
        else:
            return None  # sink unknown (cache built elsewhere): stay exact, run densely
        self._sink_state = sink

        seed = cfg.seed * 1_000_003 + self.layer_index
        keys = rank_keys(sink_scores(src, sink, cfg.criterion), cfg.order, seed)
        if past > 0 and cfg.decode == "threshold" and self._cutoff is not None:
            keep = valid & (keys <= self._cutoff.unsqueeze(1))
            keep &= sink_pos.unsqueeze(1) != torch.arange(T, device=h.device)
            return keep
        keep = topk_keep_mask(keys, valid, torch.where(in_chunk, sink_pos, -1), tokens_to_keep(valid.sum(1), cfg.ratio))
        if past == 0:
            kept_keys = torch.where(keep, keys.float(), torch.full_like(keys, float("-inf"), dtype=torch.float32))
            self._cutoff = kept_keys.amax(dim=1)
        return keep

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer, cfg = self.layer, self.config
        attn = layer.self_attn
        B, T, _ = hidden_states.shape
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length(attn.layer_idx)) if cache is not None else 0
        if past == 0:
            self._sink_state, self._cutoff = None, None
        if T == 1 and past > 0 and cfg.decode == "dense":
            self.last_keep = None
            return layer(hidden_states, *args, **kwargs)  # one new token: ceil(ratio * 1) = 1, the dense layer

        x = layer.input_layernorm(hidden_states)
        keep = self._select(hidden_states, x, past)
        self.last_keep = keep
        if keep is None:
            return layer(hidden_states, *args, **kwargs)
        idx, real = keep_to_indices(keep)  # [B, K]

        hd = attn.head_dim
        cos, sin = kwargs["position_embeddings"]  # [B|1, T, d], true positions
        k = attn.k_proj(x).view(B, T, -1, hd).transpose(1, 2)
        v = attn.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
        cos, sin = cos.expand(B, -1, -1), sin.expand(B, -1, -1)
        k = self._rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx)  # complete cache: every token's K/V
        S = k.shape[2]

        x_sel = _gather_tokens(x, idx)  # [B, K, D]
        q = attn.q_proj(x_sel).view(B, idx.shape[1], -1, hd).transpose(1, 2)
        q = self._rope(q, _gather_tokens(cos, idx), _gather_tokens(sin, idx))

        mask = self._attention_mask(kwargs.get("attention_mask", args[0] if args else None), idx, past, S, B)
        if not cfg.bypass_kv:
            # Ablation: bypassed tokens of this chunk offer no keys/values (cached past tokens still do).
            key_keep = torch.cat([torch.ones(B, past, dtype=torch.bool, device=keep.device), keep], dim=1)
            mask = mask & key_keep[:, None, None, :] if mask.dtype == torch.bool else mask.masked_fill(
                ~key_keep[:, None, None, :], torch.finfo(mask.dtype).min)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1]
        )  # [B, H, K, d]
        out = attn.o_proj(out.transpose(1, 2).reshape(B, idx.shape[1], -1))

        h_sel = _gather_tokens(hidden_states, idx)
        h_new = h_sel + out
        h_new = h_new + layer.mlp(layer.post_attention_layernorm(h_new))
        # Filler entries (rows with fewer kept tokens) write back their own unchanged state.
        h_new = torch.where(real.unsqueeze(-1), h_new, h_sel)
        return hidden_states.scatter(1, idx.unsqueeze(-1).expand_as(h_new), h_new)

    @staticmethod
    def _attention_mask(
        mask4d: torch.Tensor | None, idx: torch.Tensor, past: int, S: int, B: int
    ) -> torch.Tensor:
        """Rows of the model's mask for the selected queries, or a causal mask by true positions when the model
        passed none (SDPA's is_causal would align queries to the last keys, wrong for a subset of queries)."""
        if isinstance(mask4d, torch.Tensor) and mask4d.dim() == 4:
            m = mask4d.expand(B, -1, -1, -1)
            return m.gather(2, idx[:, None, :, None].expand(B, m.shape[1], idx.shape[1], m.shape[3]))[..., :S]
        q_pos = past + idx  # [B, K]
        return (torch.arange(S, device=idx.device)[None, None, :] <= q_pos[:, :, None]).unsqueeze(1)
