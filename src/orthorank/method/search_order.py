"""Lower levels of a saved plan read from its search order: a greedy search is sequential, so the first n layers it
chose are what it would have chosen at that lower level. Layer removal's levels are counts of removed layers; token
selection's are the prefix whose compute is closest to a target (method/kinds/ choose which)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orthorank.method.cost import Arch
    from orthorank.method.plan import Plan


def saved_prefix(plan: Plan, n: int) -> Plan:
    """The first n layers of a saved plan's search order (a greedy search is sequential: what it would have chosen at
    that lower level), with its selection unchanged."""
    layers = [int(i) for i in plan.provenance["order"][:n]]
    provenance = {k: v for k, v in plan.provenance.items() if k not in ("measured", "matched")}
    return dataclasses.replace(plan, layers=sorted(layers), target_sparsity=None,
                               provenance={**provenance, "prefix_of": plan.label(), "prefix_layers": n})


def closest_prefix(plan: Plan, arch: Arch, seq_len: int, target: float) -> tuple[Plan, float]:
    """The prefix of a selecting plan's search order whose compute share at seq_len is closest to `target`, at the
    plan's keep ratio, and that share."""
    skipped = {k: saved_prefix(plan, k).compute_sparsity(arch, seq_len)
               for k in range(1, len(plan.provenance["order"]) + 1)}
    n = min(skipped, key=lambda k: abs(skipped[k] - target))
    return saved_prefix(plan, n), skipped[n]
