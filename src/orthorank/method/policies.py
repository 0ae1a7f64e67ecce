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
- attention: the tokens that receive the most attention, H2O/SnapKV-style. A cheap estimate, not the previous
  layer's attention (SDPA does not return it): the attention probabilities of the last ATTENTION_WINDOW queries of
  this chunk in this layer, from this layer's own queries and keys (causal, pads masked; no sliding window or
  soft-capping), summed over heads and those queries;
- oracle: the tokens whose update by this layer, ||f(x) - x||, is largest. The layer runs densely to know it (its
  K/V and every token's update are computed, then only the K largest updates are kept): an upper bound for any rule
  at that keep ratio, never a speed-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orthorank.errors import UserError, comma_items

# how a selection layer treats one decoded token: as in prefill (its K/V only when not selected), or against the
# prefill's cut-off score (method/layer.py)
DECODE_MODES = ("dense", "threshold")
ATTENTION_WINDOW = 32  # queries whose attention the `attention` policy sums (the end of the chunk)


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
    Policy("attention", f"most attention received from the last {32} queries of this layer first (an estimate)"),
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
    the previous layer's ||h_l - h_(l-1)|| (prev-update), or the attention each token receives (attention)."""
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
    if name in ("oracle", "prev-update", "attention"):
        if update_norms is None:
            raise UserError(f"the {name} policy needs the {'layer' if name == 'oracle' else 'previous layer'}'s "
                            "update: apply the plan to the model (orthorank.method.apply_plan)")
        return -update_norms
    raise UserError(f"unknown selection policy {name!r}; choose one of {', '.join(POLICIES)}")


def attention_received(q: torch.Tensor, k: torch.Tensor, scale: float, valid: torch.Tensor | None,
                       past: int = 0) -> torch.Tensor:
    """q: [B, H, W, d] the last W queries of the chunk (RoPE applied), k: [B, Hkv, S, d] every key of the chunk and
    its past (S = past + T). Returns [B, T] the attention probability mass each of the chunk's tokens receives from
    those queries, summed over heads and queries (pads and future keys masked; padded queries count nothing)."""
    B, H, W, _ = q.shape
    S = k.shape[2]
    T = S - past
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [B, H, W, S]
    q_pos = past + T - W + torch.arange(W, device=q.device)
    allowed = torch.arange(S, device=q.device).view(1, S) <= q_pos.view(W, 1)  # causal
    allowed = allowed.view(1, 1, W, S)
    if valid is not None:
        key_ok = torch.cat([torch.ones(B, past, dtype=torch.bool, device=q.device), valid], dim=1)
        allowed = allowed & key_ok.view(B, 1, 1, S)
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    if valid is not None:
        probs = probs * valid[:, -W:].view(B, 1, W, 1)
    return probs.sum(dim=(1, 2))[:, past:]


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


_MODIFIERS = {"recent": "keep_recent", "first": "keep_first", "decode": "decode"}
_VARIANT_FORM = "NAME[+recent=W][+first=W][+decode=dense|threshold]"


def parse_variant(spec: str) -> dict[str, object]:
    """A policy variant, NAME[+recent=W][+first=W][+decode=MODE] (e.g. "orthogonal+recent=64", or "+decode=threshold"
    for the plan's own policy with the threshold decode policy), as SelectionConfig changes."""
    name, *mods = spec.strip().split("+")
    change: dict[str, object] = {}
    if name:
        get_policy(name)
        change["order"] = name
    for mod in mods:
        key, _, value = mod.partition("=")
        ok = value in DECODE_MODES if key == "decode" else value.isdigit()
        if key not in _MODIFIERS or not ok:
            raise UserError(f"cannot read the policy variant {spec!r}: write {_VARIANT_FORM}, e.g. "
                            "orthogonal+recent=64 (policies: " + ", ".join(POLICIES) + ")")
        change[_MODIFIERS[key]] = value if key == "decode" else int(value)
    if not change:
        raise UserError(f"the policy variant {spec!r} names no policy or modifier")
    return change


def parse_variants(text: str) -> list[str]:
    """Comma-separated variant specs, each checked; returns them stripped, in order, without repeats."""
    specs = comma_items(text)
    if not specs:
        raise UserError(f"no policy variant in {text!r}")
    for s in specs:
        parse_variant(s)
    return specs
