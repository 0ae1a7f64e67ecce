"""Hybrid plans: per layer, removal or token selection at that layer's own keep ratio (the hybrid searches, the
per-layer-ratio search and the depth and progressive schedules make them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from orthorank.errors import UserError
from orthorank.method.apply import apply_hybrid
from orthorank.method.cost import hybrid_compute_sparsity, selection_scoring_flops
from orthorank.method.kinds import PlanKind, register
from orthorank.method.selection import SelectionConfig

# A hybrid plan's per-layer actions: layer -> "remove" or the selection ratio of that layer.
REMOVE = "remove"


@register
class Hybrid(PlanKind):
    name = "hybrid"
    own_fields = ("actions",)
    selects = True
    removes = True
    per_layer = True

    def check(self, plan) -> None:
        plan.actions = check_actions(plan.actions)
        plan.layers = sorted(plan.actions)
        if plan.selection is None:
            plan.selection = SelectionConfig()
        n = plan.signature.get("num_layers")
        if n is not None and len(self.removed_layers(plan)) >= n:
            raise UserError("a plan cannot remove every layer")

    def removed_layers(self, plan) -> list[int]:
        return sorted(i for i, a in plan.actions.items() if a == REMOVE)

    def selection_layers(self, plan) -> dict[int, SelectionConfig]:
        return {i: dataclasses.replace(plan.selection, ratio=float(a))
                for i, a in sorted(plan.actions.items()) if a != REMOVE}

    def actions(self, plan) -> dict[int, str | float]:
        return dict(plan.actions)

    def nominal_sparsity(self, plan) -> float:
        skipped = len(self.removed_layers(plan)) + sum(1.0 - c.ratio for c in self.selection_layers(plan).values())
        return skipped / plan.num_layers

    def compute_sparsity(self, plan, arch, seq_len) -> float:
        sel = plan.selection
        dense_choice = not sel.rule.speedup  # its selection layers run densely to choose: only removals skip
        return hybrid_compute_sparsity(
            arch, seq_len, len(self.removed_layers(plan)),
            [1.0 if dense_choice else c.ratio for c in self.selection_layers(plan).values()],
            scoring=selection_scoring_flops(sel, arch, seq_len), pruned_keys=sel.progressive and not sel.bypass_kv)

    def apply(self, model, plan):
        return apply_hybrid(model, self.removed_layers(plan), self.selection_layers(plan))

    def extra_fields(self, plan) -> dict[str, Any]:
        return {"actions": actions_json(plan.actions)}


def check_actions(actions: Any) -> dict[int, str | float]:
    """A hybrid plan's actions, checked: {layer: "remove" | ratio in (0, 1)}."""
    if not isinstance(actions, dict) or not actions:
        raise UserError("a hybrid plan needs per-layer actions: {layer: \"remove\" or a ratio in (0, 1)}")
    out: dict[int, str | float] = {}
    for k, a in actions.items():
        try:
            i = int(k)
        except (TypeError, ValueError):
            raise UserError(f"hybrid plan action for layer {k!r}: layer indices must be integers") from None
        if a == REMOVE:
            out[i] = REMOVE
            continue
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 < float(a) < 1.0:
            raise UserError(f"hybrid plan action for layer {i} must be \"remove\" or a ratio in (0, 1), got {a!r}")
        out[i] = float(a)
    return dict(sorted(out.items()))


def actions_json(actions: dict[int, str | float]) -> dict[str, str | float]:
    return {str(i): a for i, a in sorted(actions.items())}
