"""Per-family adapters: where a decoder family keeps what a selective layer needs.

A selective layer runs the family's own decoder-layer forward on the selected rows (so residuals, post-norms,
residual multipliers, dropout, MLP or MoE blocks are the family's code) and takes over only the attention
module's computation, which needs to know where the family keeps its projections, q/k norms, RoPE, scaling,
soft-capping and sliding window. A new family is a registry entry here, usually a line.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn

from orthorank.errors import UserError


@dataclass(frozen=True)
class FamilyAdapter:
    """Defaults describe the Llama layout: model.model.layers[i] with input_layernorm and self_attn.{q,k,v,o}_proj.

    input_norm: the layer's pre-attention norm, or None for post-norm families (OLMo-2), whose attention reads the
        raw residual stream; those score tokens on the RMS-normalised state (no weight).
    qkv: "separate" projections or one "fused" qkv_proj laid out [q | k | v] (Phi-3).
    qk_norm: None, "head" (RMSNorm over each head's dims: Qwen3, Gemma 3) or "full" (over the whole projection
        before the head split: OLMo-2).
    """

    family: str
    input_norm: str | None = "input_layernorm"
    qkv: Literal["separate", "fused"] = "separate"
    qk_norm: Literal["head", "full"] | None = None

    # -- where the layers are ------------------------------------------------------------------------------------

    def decoder(self, model: nn.Module) -> nn.Module:
        return model.model

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return self.decoder(model).layers

    def set_layers(self, model: nn.Module, layers: nn.ModuleList) -> None:
        self.decoder(model).layers = layers

    # -- what the selective layer reads ---------------------------------------------------------------------------

    def attention_input(self, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """What the attention module receives: the input norm's output, or h itself for post-norm families."""
        return getattr(layer, self.input_norm)(h) if self.input_norm else h

    def score_input(self, h: torch.Tensor, attn_input: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """The normalised hidden state OrthoRank scores: the input norm's output where the family has one."""
        if self.input_norm:
            return attn_input
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)

    def queries(self, attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """[B, K, D] -> [B, K, H, d] (projection and q norm, no RoPE)."""
        hd = attn.head_dim
        if self.qkv == "fused":
            n = attn.config.num_attention_heads * hd
            q = nn.functional.linear(x, attn.qkv_proj.weight[:n],
                                     None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[:n])
        else:
            q = attn.q_proj(x)
        if self.qk_norm == "full":
            q = attn.q_norm(q)
        q = q.view(*x.shape[:-1], -1, hd)
        return attn.q_norm(q) if self.qk_norm == "head" else q

    def keys_values(self, attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, D] -> k, v [B, T, Hkv, d] (projections and k norm, no RoPE)."""
        hd = attn.head_dim
        if self.qkv == "fused":
            n = attn.config.num_attention_heads * hd
            m = attn.config.num_key_value_heads * hd
            w, b = attn.qkv_proj.weight[n:], None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[n:]
            k, v = nn.functional.linear(x, w, b).split(m, dim=-1)
        else:
            k, v = attn.k_proj(x), attn.v_proj(x)
        if self.qk_norm == "full":
            k = attn.k_norm(k)
        k, v = k.view(*x.shape[:-1], -1, hd), v.view(*x.shape[:-1], -1, hd)
        return (attn.k_norm(k) if self.qk_norm == "head" else k), v

    def rope(self, attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The family's own apply_rotary_pos_emb on x [B, T, H, d] with cos/sin [B|1, T, d] (partial rotary,
        dtype rules and all). It rotates q and k together; the k slot gets a one-head slice of x (1/H extra)."""
        apply = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        return apply(x, x[:, :, :1], cos, sin, unsqueeze_dim=2)[0]

    def rotate_half(self, layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        return sys.modules[type(layer.self_attn).__module__].rotate_half

    def sliding_window(self, attn: nn.Module) -> int | None:
        """The window this attention module hands its attention function (None: full causal attention)."""
        if hasattr(attn, "sliding_window"):
            return attn.sliding_window
        return getattr(attn.config, "sliding_window", None)

    def softcap(self, attn: nn.Module) -> float | None:
        return getattr(attn, "attn_logit_softcapping", None)

    def position_embeddings(self, model: nn.Module, h: torch.Tensor, position_ids: torch.Tensor,
                            layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for one layer, as the model computes them (per layer type where the family has several)."""
        rotary = self.decoder(model).rotary_emb
        layer_types = getattr(model.config, "layer_types", None)
        if layer_types and "layer_type" in inspect.signature(rotary.forward).parameters:
            return rotary(h, position_ids, layer_types[layer_index])
        return rotary(h, position_ids)

    def logits(self, model: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """The causal-LM head on the last layer's output, with the family's final soft-capping or scaling."""
        return self.head_logits(model, self.decoder(model).norm(h))

    def head_logits(self, model: nn.Module, normed: torch.Tensor) -> torch.Tensor:
        """The causal-LM head on the decoder's (final-normed) output, with the family's soft-capping or scaling."""
        logits = model.lm_head(normed)
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        scale = getattr(model.config, "logits_scaling", None)
        if scale:
            logits = logits / scale
        return logits


_ADAPTERS: dict[str, FamilyAdapter] = {}


def register_adapter(model_type: str, adapter: FamilyAdapter) -> None:
    _ADAPTERS[model_type] = adapter


for _name in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "granite", "gemma", "gemma2"):
    register_adapter(_name, FamilyAdapter(_name))
for _name in ("qwen3", "qwen3_moe", "gemma3_text"):
    register_adapter(_name, FamilyAdapter(_name, qk_norm="head"))
register_adapter("olmo2", FamilyAdapter("olmo2", input_norm=None, qk_norm="full"))
register_adapter("phi3", FamilyAdapter("phi3", qkv="fused"))


def supported_families() -> list[str]:
    return sorted(_ADAPTERS)


def get_adapter(model: nn.Module) -> FamilyAdapter:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _ADAPTERS:
        raise UserError(
            f"model family {model_type!r} is not supported; supported families: {', '.join(supported_families())}"
        )
    return _ADAPTERS[model_type]
