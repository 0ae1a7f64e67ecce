"""Selection policies: which K tokens a selection layer updates. One registry; the paper's rule is one entry.

A policy turns a layer's input into ascending keys [B, T] (the K lowest are updated; the sink always ranks last, pads
never count). Modifiers (`SelectionConfig.keep_recent`, `keep_first`) then give the last / first W real tokens the
lowest keys, so they are always among the K updated (within K: compute stays matched).

- orthogonal: |<x_sink, x_i>| (the paper): the tokens most orthogonal to the sink first;
- inverse, random: the paper's ablations (least orthogonal first; a reproducible random pattern per sequence);
- norm: the largest hidden-state norm first (of the layer's score input: the normed state, or the raw residual
  stream with `source=raw`): a rule any serving engine can compute without the sink;
- prev-update: the tokens the previous layer changed most, ||h_l - h_(l-1)|| (its input is kept by a hook while
  the plan is applied; not available to the layer searches, which run layers outside the model);
- oracle: the tokens whose update by this layer, ||f(x) - x||, is largest. The layer runs densely to know it (its
  K/V and every token's update are computed, then only the K largest updates are kept): an upper bound for any rule
  at that keep ratio, never a speed-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orthorank.errors import UserError


@dataclass(frozen=True)
class Policy:
    name: str
    what: str
    speedup: bool = True  # False: the layer runs densely to choose (an upper bound, not a saving)


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("orthogonal", "tokens most orthogonal to the attention sink first (the paper)"),
    Policy("random", "a random pattern per sequence (ablation)"),
    Policy("inverse", "tokens least orthogonal to the sink first (ablation)"),
    Policy("norm", "largest hidden-state norm first"),
    Policy("prev-update", "largest update by the previous layer first, ||h_l - h_(l-1)||"),
    Policy("oracle", "largest update by this layer, ||f(x) - x||, first: runs the layer densely (an upper bound, "
                     "never a speed-up)", speedup=False),
)}


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise UserError(f"unknown selection policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]


def policy_keys(name: str, sink_scores: torch.Tensor | None, src: torch.Tensor, random_draw: torch.Tensor | None,
                update_norms: torch.Tensor | None = None) -> torch.Tensor:
    """Ascending keys [B, T] of policy `name`. sink_scores: |<x_sink, x_i>| [B, T] (orthogonal, inverse);
    src: the score input [B, T, D] (norm); random_draw: [B, T] (random); update_norms: ||f(x) - x|| (oracle) or
    the previous layer's ||h_l - h_(l-1)|| (prev-update)."""
    if name == "orthogonal":
        return sink_scores
    if name == "inverse":
        return -sink_scores
    if name == "random":
        if random_draw is None:
            raise ValueError("the random policy needs per-sequence keys")
        return random_draw
    if name == "norm":
        return -torch.linalg.vector_norm(src, dim=-1, dtype=torch.float32)
    if name in ("oracle", "prev-update"):
        if update_norms is None:
            raise UserError(f"the {name} policy needs the {'layer' if name == 'oracle' else 'previous layer'}'s "
                            "update: apply the plan to the model (orthorank.method.apply_plan)")
        return -update_norms
    raise UserError(f"unknown selection policy {name!r}; choose one of {', '.join(POLICIES)}")


def always_update(valid: torch.Tensor | None, B: int, T: int, keep_recent: int, keep_first: int, past: int,
                  device: torch.device) -> torch.Tensor | None:
    """[B, T] bool: the real tokens the modifiers always update (the last `keep_recent` real tokens of this chunk;
    in a sequence's first chunk the `keep_first` real tokens after the sink), or None when there are none."""
    if keep_recent <= 0 and (keep_first <= 0 or past > 0):
        return None
    real = valid if valid is not None else torch.ones(B, T, dtype=torch.bool, device=device)
    counts = real.long()
    out = torch.zeros(B, T, dtype=torch.bool, device=device)
    if keep_recent > 0:
        from_right = counts.flip(1).cumsum(1).flip(1)  # 1 for the last real token
        out |= real & (from_right <= keep_recent)
    if keep_first > 0 and past == 0:
        from_left = counts.cumsum(1)  # 1 for the sink (the first real token)
        out |= real & (from_left >= 2) & (from_left <= keep_first + 1)
    return out
