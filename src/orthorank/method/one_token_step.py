"""One new token of one sequence in a threshold or causal selection layer: a batch-1 decoding step.

At batch 1 on CPU a decoding step is dispatch-bound: what a skipped layer saves is set by how many operator calls
it still runs (scripts/decode_skip_ops.py). So such a step decides its one token apart from the general selection
(no masks, gathers or routed attention), then runs the family's dense layer (kept: the selective path's update on
this one token) or only its keys and values (skipped).
- threshold decode: the token's key against the prefill's cut-off, through the policy's general scoring;
- causal decode: the router's score against the layer's fitted threshold, by `router.StepScorer` (a few operator
  calls and one host read), built once per sequence's sink state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from orthorank.method.router import StepScorer

if TYPE_CHECKING:
    from orthorank.method.layer import SelectiveLayer
    from orthorank.method.sequence_context import Facts


def applies(sel: SelectiveLayer, facts: Facts) -> bool:
    """May this decode step take the one-token path: the threshold or causal policy on a pointwise order with default
    K/V handling and no always-updated tokens, one unpadded sequence whose sink state and cut-off are known."""
    cfg = sel.config
    return (sel.fast_threshold_step and cfg.decode in ("threshold", "causal") and sel.rule.pointwise
            and cfg.bypass_kv and not cfg.sink_kv_visible and not cfg.keep_recent and not cfg.keep_first
            and not facts.padded and sel._cutoff is not None and sel._sink_state is not None
            and sel._sink_state.shape[0] == 1)


class OneTokenStep:
    """A layer's state for one-token steps: the causal scorer of the current sink state, the index tensors."""

    def __init__(self) -> None:
        self._scorer: tuple[torch.Tensor, object, StepScorer] | None = None  # (sink state, router, its scorer)
        self._indices: dict[tuple[int, torch.device], torch.Tensor] = {}

    # The decision is host arithmetic by design (one host read, numpy on six features): under torch.compile it runs
    # eagerly between the compiled parts of the step, which dynamo cannot trace through numpy scalars.
    @torch.compiler.disable
    def decide(self, sel: SelectiveLayer, src: torch.Tensor, hidden: torch.Tensor, facts: Facts,
               past: int) -> bool | None:
        """Whether the layer updates the token (None: its score is not finite). src, hidden: [1, 1, D]."""
        if sel.config.decode == "causal":
            score = self._scorer_for(sel)(src, hidden, past)  # the step's one host read
            return score >= sel._fitted.threshold if math.isfinite(score) else None
        keys = sel._scores(src, sel._sink_state, facts, 1, 1, past)  # [1, 1], checked finite by the policy
        return bool(keys[0, 0] <= sel._cutoff[0])  # the step's one host read

    def index(self, kept: bool, device: torch.device) -> torch.Tensor:
        """[1, 0] or [1, 1] zeros: the positions the step updated (none or the token), made once per device."""
        key = (int(kept), device)
        got = self._indices.get(key)
        if got is None:
            got = self._indices[key] = torch.zeros(1, int(kept), dtype=torch.long, device=device)
        return got

    def _scorer_for(self, sel: SelectiveLayer) -> StepScorer:
        got = self._scorer
        if got is None or got[0] is not sel._sink_state or got[1] is not sel._fitted:
            got = self._scorer = (sel._sink_state, sel._fitted, sel._fitted.step_scorer(sel._sink_state))
        return got[2]
