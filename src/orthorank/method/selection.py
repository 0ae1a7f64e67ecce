"""OrthoRank token selection: score tokens by orthogonality to the attention sink and keep the top K.

Shapes: B batch rows, T tokens in the current chunk, D hidden size.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import torch

from orthorank.errors import UserError
from orthorank.method.policies import ATTENTION, DECODE_MODES, FITTED, POLICIES, Policy, get_policy
from orthorank.method.router import RouterState

CRITERIA = ("dot", "cos")  # |<x_sink, x_i>| (paper) or |cos(x_sink, x_i)|
SOURCES = ("normed", "raw")  # input-RMSNorm output (paper) or the raw residual stream
ORDERS = tuple(POLICIES)  # selection policies (method/policies.py)


@dataclass(frozen=True)
class SelectionConfig:
    """How a selection layer picks tokens. Defaults are the paper's method."""

    ratio: float = 0.33
    criterion: str = "dot"
    source: str = "normed"
    # a name in method/policies.POLICIES or the Policy itself (plans before the router called it `order`); resolved
    # once, here: `policy` keeps the name (what plans and store keys hold), `rule` the registry's object
    policy: str | Policy = "orthogonal"
    # Ablation "no KV": bypassed tokens contribute no keys/values to the selected queries.
    bypass_kv: bool = True
    # Under the no-KV ablation, whether the sink's keys/values stay visible although the sink is bypassed (the paper
    # does not say; both variants are reported). Ignored when bypass_kv is True.
    sink_kv_visible: bool = False
    # Decoding one token at a time: "dense" updates every new token (ceil(ratio * 1) = 1, the natural reading);
    # "threshold" updates a new token only if it is at least as orthogonal as the prefill's K-th token was.
    decode: str = "dense"
    seed: int = 0
    # Policy modifiers: always update the last / first W real tokens (within K), e.g. a question at the end of a
    # long prompt. 0 = off (and then left out of to_dict, so plans and stored results from before stay valid).
    keep_recent: int = 0
    keep_first: int = 0
    # The attention policies' observation window: the last W queries of the chunk whose attention ranks the tokens
    # (0 = policies.ATTENTION_WINDOW; 1 = the last token alone, as LazyLLM scores; a question's length = SnapKV's
    # observation window).
    attention_window: int = 0
    # Progressive pruning (LazyLLM-style, method/progressive.py): a token one selection layer leaves out is left
    # out of every later selection layer of the forward as well, and (with bypass_kv=False) offers no keys there
    # either; its keys and values still reach the KV cache, so decoding can revive it. Needs non-increasing ratios.
    progressive: bool = False
    # A fitted policy's parameters (the router's, method/router.py): saved inside the plan, None for rules.
    fitted: RouterState | None = None
    rule: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (0.0 < self.ratio <= 1.0) or math.isnan(self.ratio):
            raise UserError(f"ratio must be in (0, 1], got {self.ratio}")
        rule = self.policy if isinstance(self.policy, Policy) else get_policy(self.policy)
        object.__setattr__(self, "policy", rule.name)
        object.__setattr__(self, "rule", rule)
        if not rule.no_kv_ablation and not self.bypass_kv:
            raise UserError(f"the {self.policy} policy runs the layer densely: it has no no-KV ablation")
        if FITTED in rule.needs and self.fitted is None:
            raise UserError(f"the {self.policy} policy needs fitted parameters, and this plan has none: fit them "
                            "for the plan's layers with `orthorank fit-router --plan PLAN`")
        if self.attention_window and ATTENTION not in rule.needs:
            raise UserError(f"an attention window belongs to a policy that ranks by attention (attention), not to "
                            f"{self.policy}")
        if self.decode == "causal":
            self._check_causal(rule)
        if self.progressive and self.decode != "dense":
            raise UserError("progressive pruning decodes densely (pruned tokens are revived from the KV cache); "
                            "it has no threshold decode")
        for name, value in (("keep_recent", self.keep_recent), ("keep_first", self.keep_first),
                            ("attention_window", self.attention_window)):
            if not isinstance(value, int) or value < 0:
                raise UserError(f"{name} must be a whole number of tokens >= 0, got {value!r}")
        for name, value, allowed in (
            ("criterion", self.criterion, CRITERIA),
            ("source", self.source, SOURCES),
            ("decode", self.decode, DECODE_MODES),
        ):
            if value not in allowed:
                raise UserError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")

    def _check_causal(self, rule: Policy) -> None:
        """Causal decisions read a token's own state and a threshold per layer: a router with thresholds, every
        token's keys and values kept, nothing that looks at other tokens or the prompt's end."""
        if FITTED not in rule.needs or not rule.pointwise:
            raise UserError(f"causal decoding needs the router policy with fitted thresholds, not {rule.name}: "
                            "fit them with `orthorank fit-thresholds --plan ROUTER_PLAN`")
        if self.fitted is not None and not self.fitted.causal:
            raise UserError("causal decoding needs a threshold in every selection layer's router, and this plan's "
                            "router has none: fit them with `orthorank fit-thresholds --plan ROUTER_PLAN`")
        if self.keep_recent or self.keep_first or self.progressive or not self.bypass_kv:
            raise UserError("causal decoding decides each token from its own state alone: it takes no keep_recent, "
                            "keep_first, progressive pruning or no-KV ablation")

    def to_dict(self) -> dict:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("fitted", "rule")}
        for name in ("keep_recent", "keep_first", "attention_window", "progressive"):
            if not out[name]:
                del out[name]
        if self.fitted is not None:
            out["fitted"] = self.fitted.to_dict()
        return out

    def key_dict(self) -> dict:
        """What identifies this selection in result-store and checkpoint keys: to_dict under the field names of
        plans before the router (`order`), so every stored result of an unfitted policy keeps its key."""
        out = {("order" if k == "policy" else k): v for k, v in self.to_dict().items() if k != "fitted"}
        # the fitted weights (not the fit's timings) identify the results, where the policy reads them: a plan's
        # variant with another policy (compare --policies random) shares its results with the unfitted plan's
        if self.fitted is not None and FITTED in self.rule.needs:
            out["fitted"] = self.fitted.digest()
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "SelectionConfig":
        """A saved selection; reads plans that call the policy `order` (before the router) as well."""
        data = dict(data)
        if "order" in data:
            if "policy" in data and data["policy"] != data["order"]:
                raise UserError(f"the selection names two policies: order={data['order']!r}, "
                                f"policy={data['policy']!r}")
            data["policy"] = data.pop("order")
        fitted = data.pop("fitted", None)
        unknown = sorted(set(data) - {f for f in cls.__dataclass_fields__ if f != "rule"})
        if unknown:
            raise UserError(f"unknown selection field(s) {', '.join(unknown)}")
        return cls(**data, fitted=RouterState.from_dict(fitted) if fitted is not None else None)


# The epsilon keeps e.g. 0.33 * 100 from rounding up to 34 by float error.
_ROUNDING_EPS = 1e-9


def keep_count(n: int, ratio: float) -> int:
    """K = ceil(ratio * n) for one row of n real tokens, on the host (no device sync)."""
    return max(0, math.ceil(n * ratio - _ROUNDING_EPS))


def tokens_to_keep(n_valid: torch.Tensor, ratio: float) -> torch.Tensor:
    """K = ceil(ratio * n) per row, the same rule as keep_count."""
    return torch.ceil(n_valid.to(torch.float64) * ratio - _ROUNDING_EPS).clamp_min(0).to(torch.long)


def sequence_seed(seed: int, layer: int, row_hash: int) -> int:
    """The random ablation's seed for one sequence in one layer: a function of the sequence's own tokens, so the
    pattern does not depend on batch size, the row's place in the batch or its padding."""
    digest = hashlib.blake2b(f"{seed}:{layer}:{row_hash}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def token_hash(ids: torch.Tensor, past: int = 0) -> int:
    """A stable hash of one row's real token ids (1-D) and the number of tokens before them."""
    data = ids.detach().to("cpu", torch.int64).numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(data + past.to_bytes(8, "little"), digest_size=8).digest(), "little")


def random_keys(valid_counts: list[int], T: int, seeds: list[int], left_aligned: torch.Tensor | None,
                device: torch.device) -> torch.Tensor:
    """[B, T] uniform keys, row b drawn from its own generator for its n_b real tokens in order; positions that
    are not real tokens get +inf. `left_aligned`: [B, T] bool of real tokens, or None when all are real."""
    out = torch.full((len(seeds), T), float("inf"))
    for b, (n, s) in enumerate(zip(valid_counts, seeds)):
        draw = torch.rand(n, generator=torch.Generator(device="cpu").manual_seed(s))
        if left_aligned is None:
            out[b, :n] = draw
        else:
            out[b, left_aligned[b].cpu()] = draw
    return out.to(device)


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


def top_k_indices(keys: torch.Tensor, k: int, sink_pos: int | None = 0) -> torch.Tensor:
    """Every token valid (no padding), the same k per row: the positions of the k lowest keys, in original order.

    Same choice as topk_keep_mask + keep_to_indices (the sink ranks after every other token, ties go to the
    earlier position) without a boolean mask or a device-to-host sync. keys: [B, T]; returns idx [B, k].
    """
    keys = keys.float().clone() if keys.dtype == torch.float32 else keys.float()
    if sink_pos is not None:
        keys[:, sink_pos] = torch.finfo(torch.float32).max
    order = torch.argsort(keys, dim=1, stable=True)[:, :k]
    return order.sort(dim=1).values


def keep_to_indices(keep: torch.Tensor, kmax: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """keep: [B, T] bool -> (idx [B, Kmax] in original order, real [B, Kmax] bool marking kept entries).

    Rows with fewer kept tokens are filled with unkept positions whose updates the caller discards. Pass kmax
    (the largest row count) when it is known, to avoid a device-to-host sync.
    """
    if kmax is None:
        kmax = int(keep.sum(dim=1).max().item()) if keep.numel() else 0
    idx = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :kmax]
    return idx, keep.gather(1, idx)
