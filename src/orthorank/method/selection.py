"""OrthoRank token selection: score tokens by orthogonality to the attention sink and keep the top K.

Shapes: B batch rows, T tokens in the current chunk, D hidden size.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from orthorank.errors import UserError

CRITERIA = ("dot", "cos")  # |<x_sink, x_i>| (paper) or |cos(x_sink, x_i)|
SOURCES = ("normed", "raw")  # input-RMSNorm output (paper) or the raw residual stream
ORDERS = ("orthogonal", "random", "inverse")  # paper's method and its two ablations
DECODE_MODES = ("dense", "threshold")


@dataclass(frozen=True)
class SelectionConfig:
    """How a selection layer picks tokens. Defaults are the paper's method."""

    ratio: float = 0.33
    criterion: str = "dot"
    source: str = "normed"
    order: str = "orthogonal"
    # Ablation "no KV": bypassed tokens contribute no keys/values to the selected queries.
    bypass_kv: bool = True
    # Decoding one token at a time: "dense" updates every new token (ceil(ratio * 1) = 1, the natural reading);
    # "threshold" updates a new token only if it is at least as orthogonal as the prefill's K-th token was.
    decode: str = "dense"
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0.0 < self.ratio <= 1.0) or math.isnan(self.ratio):
            raise UserError(f"ratio must be in (0, 1], got {self.ratio}")
        for name, value, allowed in (
            ("criterion", self.criterion, CRITERIA),
            ("source", self.source, SOURCES),
            ("order", self.order, ORDERS),
            ("decode", self.decode, DECODE_MODES),
        ):
            if value not in allowed:
                raise UserError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")

    def to_dict(self) -> dict:
        return asdict(self)


def sink_scores(x: torch.Tensor, sink: torch.Tensor, criterion: str = "dot") -> torch.Tensor:
    """x: [B, T, D], sink: [B, D] -> [B, T]; smaller means more orthogonal to the sink, i.e. more important."""
    x32, s32 = x.float(), sink.float()
    dot = torch.einsum("btd,bd->bt", x32, s32)
    if criterion == "cos":
        dot = dot / (x32.norm(dim=-1) * s32.norm(dim=-1, keepdim=True)).clamp_min(1e-12)
    return dot.abs()


def tokens_to_keep(n_valid: torch.Tensor, ratio: float) -> torch.Tensor:
    """K = ceil(ratio * n) per row; the epsilon keeps e.g. 0.33 * 100 from rounding up to 34 by float error."""
    return torch.ceil(n_valid.to(torch.float64) * ratio - 1e-9).clamp_min(0).to(torch.long)


def rank_keys(
    scores: torch.Tensor, order: str, layer_seed: int | None = None
) -> torch.Tensor:
    """Turn scores into ascending ranking keys for the chosen order (the method or its ablations)."""
    if order == "orthogonal":
        return scores
    if order == "inverse":
        return -scores
    gen = torch.Generator(device="cpu").manual_seed(int(layer_seed or 0))
    return torch.rand(scores.shape, generator=gen).to(scores.device)


def topk_keep_mask(
    keys: torch.Tensor, valid: torch.Tensor, sink_pos: torch.Tensor | None, k: torch.Tensor
) -> torch.Tensor:
    """keys, valid: [B, T]; sink_pos: [B] (index in this chunk, or -1 if the sink lies in the past); k: [B].

    Returns keep: [B, T] bool with exactly k[b] True entries among valid tokens of row b. The sink ranks after
    every other valid token; pads rank after everything and are never kept.
    """
    B, T = keys.shape
    keys = keys.float().clone()
    big = torch.finfo(torch.float32).max
    if sink_pos is not None:
        has_sink = sink_pos >= 0
        rows = torch.nonzero(has_sink).squeeze(-1)
        keys[rows, sink_pos[rows]] = big
    keys = torch.where(valid, keys, torch.full_like(keys, float("inf")))
    order = torch.argsort(keys, dim=1, stable=True)  # ties broken by position: deterministic
    rank_ok = torch.arange(T, device=keys.device).unsqueeze(0) < k.clamp(max=T).unsqueeze(1)
    keep = torch.zeros_like(valid)
    keep.scatter_(1, order, rank_ok)
    return keep & valid


def keep_to_indices(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keep: [B, T] bool -> (idx [B, Kmax] in original order, real [B, Kmax] bool marking kept entries).

    Rows with fewer kept tokens are filled with unkept positions whose updates the caller discards.
    """
    kmax = int(keep.sum(dim=1).max().item()) if keep.numel() else 0
    idx = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :kmax]
    return idx, keep.gather(1, idx)
