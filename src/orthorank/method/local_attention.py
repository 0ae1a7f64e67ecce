"""Local prefill attention with a global tail: the prompt's context tokens attend to the first few tokens (the sink)
and a local window; the prompt's last `tail` tokens (the question) and every generated token attend to everything.

Beyond the paper. The attention core is most of a long prompt's prefill (74% of SmolLM2-135M's at 4k tokens,
bfloat16 on this CPU) and grows with length; OrthoRank and layer removal cut it only by dropping whole queries or
layers. This cuts the keys each context query reads instead. It is the sink + window pattern of StreamingLLM (Xiao
et al. 2024) and MInference's A-shape heads (Jiang et al. 2024), with the queries of the prompt's end kept global so
that the question still reads the whole prompt: every token's K/V is computed from its full layer input, so a needle
anywhere stays visible to the tail's queries in every layer.

Three global spans. The sink and the prompt's instruction head are global keys: every query reads the first
G = max(sinks, head) keys, so a document read locally still sees the instruction before it ("Summarise the report
below: ..."). The tail is global queries: the prompt's last `tail` tokens read every key, so the question (or the
cue after a question-first prompt) reads the whole prompt. A question longer than the tail loses its first part's
global reads; the head is how a question placed before the document stays visible to every query.

The pattern, for a prompt of N real tokens at positions 0..N-1 (a token of a left-padded row at its real position):
- a query at p >= N - tail sees every key at or before p (causal, as dense);
- a query at p < N - tail sees the G first keys and the keys from max(G, floor(p / block) * block - window) to p:
  at least `window` and at most `window + block - 1` keys back, block-aligned so that a block of queries shares one
  key range and runs as one causal kernel call.

    local_attention(q, k, v, scale=..., cfg=LocalAttention(window=256))   # q [B, H, N, d], k/v [B, Hkv, N, d]

Decoding steps and prompts continued from a cache attend densely (the pattern is a prefill's), so cached generation
equals an uncached forward over prompt and generated tokens with the tail reaching to the prompt's end
(`local_allowed(..., prompt_len=N)`). Without padding the kernels of method/local_kernel.py run the pattern without
a mask over the keys (each block's window prefix unmasked, its diagonal causal); left-padded rows take one masked
call built from the real positions.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from orthorank.errors import UserError
from orthorank.method import local_kernel
from orthorank.method.sequence_context import padding_from_4d
from orthorank.models.sliding_attention import IMPLEMENTATION as SLIDING


@dataclass(frozen=True)
class LocalAttention:
    window: int = 256  # keys before a query's block it reads (the block's own keys come on top)
    sinks: int = 4  # the first keys every query reads (the attention sink; StreamingLLM keeps 4)
    tail: int = 64  # the prompt's last tokens, which attend globally (the question)
    block: int = 256  # queries per kernel call; a query reads between window and window + block - 1 keys back
    head: int = 0  # the prompt's first tokens (its instruction), keys every query reads, as the sinks

    def __post_init__(self) -> None:
        for name in ("window", "block"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"local attention's {name} must be a positive number of tokens, got {getattr(self, name)}")
        for name in ("sinks", "tail", "head"):
            if int(getattr(self, name)) < 0:
                raise UserError(f"local attention's {name} must be 0 or more tokens, got {getattr(self, name)}")

    @property
    def global_keys(self) -> int:
        """The first keys every query reads: the sinks and the instruction head."""
        return max(int(self.sinks), int(self.head))

    def to_dict(self) -> dict[str, int]:
        # no head: the fields plans had before it, so their files and result-store keys stay as they were
        return {k: int(v) for k, v in asdict(self).items() if k != "head" or v}

    @classmethod
    def from_dict(cls, data: Any) -> "LocalAttention":
        if not isinstance(data, dict):
            raise UserError(f"a plan's local attention must be an object, got {data!r}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise UserError(f"unknown local attention fields {unknown}; known: {', '.join(cls.__dataclass_fields__)}")
        try:
            return cls(**{k: int(v) for k, v in data.items()})
        except (TypeError, ValueError):
            raise UserError(f"local attention fields must be whole numbers, got {data!r}") from None


def first_local_key(p: np.ndarray | torch.Tensor, cfg: LocalAttention):
    """The first non-sink key a context query at position p reads."""
    lo = (p // cfg.block) * cfg.block - cfg.window
    g = cfg.global_keys
    return np.maximum(lo, g) if isinstance(p, np.ndarray) else torch.clamp(lo, min=g)


def keys_read(seq_len: int, cfg: LocalAttention) -> np.ndarray:
    """[N] how many keys each query of an N-token prompt reads (the cost model's count)."""
    p = np.arange(seq_len)
    g = cfg.global_keys
    local = np.where(p < g, p + 1, g + p - first_local_key(p, cfg) + 1)
    return np.where(p >= seq_len - cfg.tail, p + 1, np.minimum(local, p + 1))


def mean_keys_read(seq_len: int, cfg: LocalAttention) -> float:
    return float(keys_read(seq_len, cfg).mean())


def local_allowed(valid: torch.Tensor, cfg: LocalAttention, prompt_len: torch.Tensor | None = None) -> torch.Tensor:
    """[B, 1, T, T] bool, True where a query may attend a key, for rows of T tokens whose real ones are `valid`
    ([B, T] bool, left padding). The tail reaches to each row's last real token, or to its `prompt_len`-th real token
    ([B]) where generated tokens follow the prompt (the reference for cached generation). A padding query sees only
    itself, so no row of the softmax is empty."""
    B, T = valid.shape
    r = valid.long().cumsum(-1) - 1  # real positions
    n = valid.sum(-1) if prompt_len is None else prompt_len.to(valid.device)
    rq, rk = r[:, :, None], r[:, None, :]
    causal = (rk <= rq) & valid[:, None, :] & valid[:, :, None]
    local = (rk < cfg.global_keys) | (rk >= first_local_key(rq, cfg))
    tail = rq >= (n - cfg.tail)[:, None, None]
    allowed = causal & (local | tail)
    allowed |= torch.eye(T, dtype=torch.bool, device=valid.device)[None] & ~valid[:, :, None]
    return allowed[:, None]


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, cfg: LocalAttention,
                    valid: torch.Tensor | None = None, kernel: str = "auto") -> torch.Tensor:
    """q [B, H, N, d], k/v [B, Hkv, N, d] (a whole prompt, no past keys; `valid` [B, N] marks the real tokens of
    left-padded rows, None for none) -> [B, H, N, d]. kernel: method/local_kernel.py's KERNELS, or "auto"."""
    if valid is not None and not bool(valid.all()):
        mask = local_allowed(valid, cfg)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return local_kernel.run(q, k, v, scale=scale, global_keys=cfg.global_keys, window=cfg.window, block=cfg.block,
                            tail=cfg.tail, kernel=kernel)


# -- the Hugging Face side: one registered attention function, switched on per attention module ----------------------

IMPLEMENTATION = "orthorank_local"
_CONFIG = "_orthorank_local"  # on a local layer's attention module: (LocalAttention, the model's implementation)


def hf_local_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function a local layer's module calls (its config copy names IMPLEMENTATION): the local pattern
    for a whole prompt in one call, the model's own implementation for everything else (decoding steps, prompts
    continued from a cache, static-cache slots)."""
    # transformers' modeling utilities load lazily (seconds); a local layer is only called once they are loaded
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cfg, original = getattr(module, _CONFIG)
    if query.shape[2] == 1 or key.shape[2] != query.shape[2]:
        return ALL_ATTENTION_FUNCTIONS[original](module, query, key, value, attention_mask, scaling=scaling,
                                                 dropout=dropout, **kwargs)
    valid = padding_from_4d(attention_mask, None) if attention_mask is not None else None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = local_attention(query, key, value, scale=scale, cfg=cfg, valid=valid)
    return out.transpose(1, 2).contiguous(), None


def install(attn: torch.nn.Module, cfg: LocalAttention):
    """Make one attention module attend locally; returns the undo. The module gets its own shallow copy of the
    config naming IMPLEMENTATION (the model's config, its fingerprint and the other layers stay as they were)."""
    from transformers import AttentionInterface  # lazily, as above: plans load without the modeling code

    original = attn.config._attn_implementation or "sdpa"
    if original not in ("sdpa", "eager", SLIDING):  # the last: the blocked sliding kernel, SDPA's masks
        raise UserError(f"local attention runs on models loaded with sdpa, eager or {SLIDING} (the blocked "
                        f"sliding-window kernel) attention, not {original!r}")
    AttentionInterface.register(IMPLEMENTATION, hf_local_attention)
    shared = attn.config
    own = copy.copy(shared)
    own.__dict__["_attn_implementation_internal"] = IMPLEMENTATION
    attn.config = own
    setattr(attn, _CONFIG, (cfg, original))

    def undo() -> None:
        attn.config = shared
        delattr(attn, _CONFIG)
    return undo
