"""Token selection (the paper's method and every policy on it): in the plan's layers the K = ceil(r N) chosen
tokens are updated, the others bypass the layer; one SelectionConfig for every layer."""

from __future__ import annotations

from orthorank.method.apply import apply_orthorank
from orthorank.method.cost import hybrid_compute_sparsity, selection_scoring_flops, selection_sparsity
from orthorank.method.kinds import PlanKind, register
from orthorank.method.search_order import closest_prefix
from orthorank.method.selection import SelectionConfig


@register
class Orthorank(PlanKind):
    name = "orthorank"
    selects = True
    from_layers = True
    prefixes = True

    def check(self, plan) -> None:
        if plan.selection is None:
            plan.selection = SelectionConfig()

    def selection_layers(self, plan) -> dict[int, SelectionConfig]:
        return {i: plan.selection for i in plan.layers}

    def actions(self, plan) -> dict[int, str | float]:
        return {i: plan.selection.ratio for i in plan.layers}

    def ratio(self, plan) -> float:
        return plan.selection.ratio

    def nominal_sparsity(self, plan) -> float:
        return len(plan.layers) / plan.num_layers * (1.0 - plan.selection.ratio) if plan.layers else 0.0

    def compute_sparsity(self, plan, arch, seq_len) -> float:
        sel = plan.selection
        if not sel.rule.speedup:
            return 0.0  # a policy that runs its layers densely to choose skips nothing there
        scoring = selection_scoring_flops(sel, arch, seq_len)
        if sel.progressive and not sel.bypass_kv:  # pruned keys: the kept queries attend the kept keys only
            return hybrid_compute_sparsity(arch, seq_len, 0, [sel.ratio] * len(plan.layers), scoring=scoring,
                                           pruned_keys=True)
        return selection_sparsity(arch, seq_len, len(plan.layers), sel.ratio, scoring=scoring)

    def level_prefix(self, saved, arch, seq_len, removed, target):
        """The prefix whose compute is closest to pruning's at this length, at the saved plan's ratio."""
        return closest_prefix(saved, arch, seq_len, target)

    def apply(self, model, plan):
        return apply_orthorank(model, plan.layers, plan.selection)
