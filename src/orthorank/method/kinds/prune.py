"""Layer removal (SLEB, Shortened LLaMA, ShortGPT): the plan's layers leave the model."""

from __future__ import annotations

from orthorank.errors import UserError
from orthorank.method.apply import prune_layers
from orthorank.method.cost import removal_sparsity
from orthorank.method.kinds import PlanKind, register
from orthorank.method.kinds.hybrid import REMOVE
from orthorank.method.search_order import saved_prefix


@register
class Prune(PlanKind):
    name = "prune"
    removes = True
    from_layers = True
    prefixes = True

    def removed_layers(self, plan) -> list[int]:
        return list(plan.layers)

    def actions(self, plan) -> dict[int, str | float]:
        return {i: REMOVE for i in plan.layers}

    def nominal_sparsity(self, plan) -> float:
        return len(plan.layers) / plan.num_layers

    def compute_sparsity(self, plan, arch, seq_len) -> float:
        return removal_sparsity(arch, seq_len, len(plan.layers))

    def level_prefix(self, saved, arch, seq_len, removed, target):
        order = saved.provenance["order"]
        if removed > len(order):
            raise UserError(f"it removes {removed} layers, its saved search chose {len(order)}")
        return saved_prefix(saved, removed), target

    def apply(self, model, plan):
        return prune_layers(model, plan.layers)
