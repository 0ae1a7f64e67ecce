"""The unchanged model: the baseline every other kind is measured against."""

from __future__ import annotations

from orthorank.method.apply import restore_dense
from orthorank.method.kinds import PlanKind, register


@register
class Dense(PlanKind):
    name = "dense"
    dense = True

    def apply(self, model, plan):
        return restore_dense(model)

    def label(self, plan) -> str:
        return "dense"
