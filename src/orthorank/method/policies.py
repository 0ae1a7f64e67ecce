"""Selection policies: which K tokens a selection layer updates. One registry of policy objects; the paper's rule is
one entry, and no policy name is tested outside this module.

A policy declares what it needs from the layer (`needs`: the sink's state, a random draw, the previous layer's input,
the layer's dense update, an attention estimate, the loss effect of a dense forward and backward, fitted parameters)
and turns a `PolicyInputs` into ascending keys [B, T] (the K lowest are updated; the sink always ranks last, pads
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
- router: a linear score fitted on calibration text (method/router.py) from what the layer already has (its normed
  input, the sink score, norms, position); its parameters travel inside the plan;
- oracle: the tokens whose update by this layer, ||f(x) - x||, is largest. The layer runs densely to know it (its
  K/V and every token's update are computed, then only the K largest updates are kept): an upper bound for any
  update-norm rule at that keep ratio, never a speed-up;
- loss-oracle: the tokens whose update lowers the loss most to first order, <dL/dh_i, f(x)_i - x_i> (most negative
  first), from one dense forward and backward per window on the window's own next tokens. It reads the labels, so
  no rule reaches it: a reference for the headroom of any rule, never a speed-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from orthorank.errors import UserError, comma_items
from orthorank.method import router
from orthorank.method.orthogonality import sink_scores

# how a selection layer treats one decoded token (method/layer.py): "dense" updates it; "threshold" compares its key
# with the prefill's K-th; "causal" compares its router score with the layer's fitted threshold, and the prefill
# decides every token the same way (no top-K), so a teacher-forced forward makes the decisions decoding makes
DECODE_MODES = ("dense", "threshold", "causal")
ATTENTION_WINDOW = 32  # queries whose attention the `attention` policy sums (the end of the chunk)

# What a policy may need from its selection layer (Policy.needs).
SINK = "sink"  # the sink's score-input state (PolicyInputs.sink)
RANDOM = "random"  # a reproducible random draw per sequence (PolicyInputs.random_draw)
PREV_INPUT = "prev-input"  # the previous layer's input, kept by a hook (PolicyInputs.given: ||h_l - h_(l-1)||)
DENSE_UPDATE = "dense-update"  # the layer's dense update of every token (PolicyInputs.given: ||f(x) - x||)
ATTENTION = "attention"  # attention received from the chunk's last queries (PolicyInputs.given)
LOSS_EFFECT = "loss-effect"  # <dL/dh_i, f(x)_i - x_i> of a dense forward and backward (PolicyInputs.given)
FITTED = "fitted"  # fitted parameters carried by the plan (SelectionConfig.fitted)
NEEDS = (SINK, RANDOM, PREV_INPUT, DENSE_UPDATE, ATTENTION, LOSS_EFFECT, FITTED)


@dataclass
class PolicyInputs:
    """What a selection layer hands its policy for one chunk. B rows, T tokens, D hidden size."""

    src: torch.Tensor  # [B, T, D] the score input: the normed state (source=normed) or the residual stream (raw)
    hidden: torch.Tensor  # [B, T, D] the residual stream entering the layer
    past: int = 0  # tokens before this chunk (cache length)
    positions: torch.Tensor | None = None  # [B, T] each token's distance from its row's sink (None: 0..T-1)
    criterion: str = "dot"
    sink: torch.Tensor | None = None  # [B, D] the sink's score input (SINK)
    random_draw: torch.Tensor | None = None  # [B, T] (RANDOM)
    given: torch.Tensor | None = None  # [B, T] the per-token quantity the layer measured (PREV_INPUT, ...)
    fitted: Any = None  # the layer's own fitted parameters (FITTED), e.g. router.LayerRouter


@dataclass(frozen=True)
class Policy:
    name: str
    what: str
    rank: Callable[[PolicyInputs], torch.Tensor] = field(repr=False)  # ascending keys [B, T]
    needs: frozenset[str] = frozenset()
    speedup: bool = True  # False: the policy needs a dense pass to choose (an upper bound, not a saving)
    # keys of a token depend only on its own state and the sink's: a decode step can rank its one token alone
    pointwise: bool = False
    finite_keys: bool = True  # keys are finite on real tokens (checked: NaN states would rank silently)
    no_kv_ablation: bool = True  # whether the no-KV ablation (bypass_kv=False) can be combined with it

    def keys(self, inp: PolicyInputs) -> torch.Tensor:
        for need, value in ((SINK, inp.sink), (RANDOM, inp.random_draw), (FITTED, inp.fitted)):
            if need in self.needs and value is None:
                raise ValueError(f"the {self.name} policy needs its {need} input")
        if self.needs & {PREV_INPUT, DENSE_UPDATE, ATTENTION, LOSS_EFFECT} and inp.given is None:
            raise UserError(f"the {self.name} policy needs what the model gives while the plan is applied: apply the "
                            "plan to the model (orthorank.method.apply_plan)")
        return self.rank(inp)

    def scoring_flops(self, hidden: int) -> float:
        """FLOPs per token a selection layer spends choosing, beyond the layer's own work (the cost model's
        scoring term; method/cost.py). A sink dot product by default; the router adds its features and score."""
        if FITTED in self.needs:
            return router.flops_per_token(hidden)
        return 2.0 * hidden


def _sink_scores(inp: PolicyInputs) -> torch.Tensor:
    return sink_scores(inp.src, inp.sink, inp.criterion)


def _norm(inp: PolicyInputs) -> torch.Tensor:
    return -torch.linalg.vector_norm(inp.src, dim=-1, dtype=torch.float32)


def _largest_given(inp: PolicyInputs) -> torch.Tensor:
    return -inp.given


def _router(inp: PolicyInputs) -> torch.Tensor:
    return -inp.fitted.score(inp.src, inp.hidden, inp.sink, inp.positions)


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("orthogonal", "tokens most orthogonal to the attention sink first (the paper)", _sink_scores,
           frozenset({SINK}), pointwise=True),
    Policy("random", "a random pattern per sequence (ablation)", lambda inp: inp.random_draw, frozenset({RANDOM}),
           finite_keys=False),  # +inf off the real tokens by construction
    Policy("inverse", "tokens least orthogonal to the sink first (ablation)", lambda inp: -_sink_scores(inp),
           frozenset({SINK}), pointwise=True),
    Policy("norm", "largest hidden-state norm first", _norm),
    Policy("prev-update", "largest update by the previous layer first, ||h_l - h_(l-1)||", _largest_given,
           frozenset({PREV_INPUT})),
    Policy("attention", f"most attention received from the last {ATTENTION_WINDOW} queries of this layer first (an "
                        "estimate)", _largest_given, frozenset({ATTENTION})),
    Policy("router", "highest score of a linear router fitted on calibration text first (`orthorank fit-router`)",
           _router, frozenset({SINK, FITTED}), pointwise=True),
    Policy("oracle", "largest update by this layer, ||f(x) - x||, first: runs the layer densely (an upper bound, "
                     "never a speed-up)", _largest_given, frozenset({DENSE_UPDATE}), speedup=False,
           no_kv_ablation=False),
    Policy("loss-oracle", "largest first-order loss decrease of the update, <dL/dh_i, f(x)_i - x_i>, first: a dense "
                          "forward and backward on the window's own next tokens (reads the labels: a reference, "
                          "never a speed-up)", lambda inp: inp.given, frozenset({LOSS_EFFECT}), speedup=False),
)}


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise UserError(f"unknown selection policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]


def attention_received(q: torch.Tensor, k: torch.Tensor, scale: float, valid: torch.Tensor | None,
                       past: int = 0) -> torch.Tensor:
    """q: [B, H, W, d] the last W queries of the chunk (RoPE applied), k: [B, Hkv, S, d] every key of the chunk and
    its past (S = past + T). Returns [B, T] the attention probability mass each of the chunk's tokens receives from
    those queries, summed over heads and queries (pads and future keys masked; padded queries count nothing)."""
    B, H, W, _ = q.shape
    S = k.shape[2]
    T = S - past
    Hkv = k.shape[1]
    # the query heads of one KV head fold into its rows (head h reads KV head h // G): K is not repeated per head
    qg = q.float().reshape(B, Hkv, (H // Hkv) * W, q.shape[-1])
    logits = torch.matmul(qg, k.float().transpose(-1, -2)).view(B, H, W, S) * scale  # [B, H, W, S]
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


_MODIFIERS = {"recent": "keep_recent", "first": "keep_first", "window": "attention_window", "decode": "decode"}
_VARIANT_FORM = "NAME[+recent=W][+first=W][+window=W][+decode=dense|threshold]"


def parse_variant(spec: str) -> dict[str, object]:
    """A policy variant, NAME[+recent=W][+first=W][+window=W][+decode=MODE] (e.g. "orthogonal+recent=64",
    "attention+window=64" for the attention of the prompt's last 64 tokens, or "+decode=threshold" for the plan's own
    policy with the threshold decode policy), as SelectionConfig changes."""
    name, *mods = spec.strip().split("+")
    change: dict[str, object] = {}
    if name:
        get_policy(name)
        change["policy"] = name
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
