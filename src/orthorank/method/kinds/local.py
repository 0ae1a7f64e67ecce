"""Local prefill attention (beyond the paper; method/local_attention.py): in the plan's layers each query reads the
sinks, the global head and a window of keys, the prompt's global tail reads every key; every token is still updated
by every layer."""

from __future__ import annotations

from typing import Any

from orthorank.method.apply import apply_local
from orthorank.method.cost import DEFAULT_COST_SEQ_LEN, local_compute_sparsity
from orthorank.method.kinds import PlanKind, register
from orthorank.method.local_attention import LocalAttention, mean_keys_read


@register
class Local(PlanKind):
    name = "local"
    own_fields = ("attention",)
    global_spans = True

    def check(self, plan) -> None:
        if plan.attention is None:
            plan.attention = LocalAttention()

    def nominal_sparsity(self, plan) -> float:
        # the paper's measure has no term for it: the compute share at the plan's length
        seq_len = int(plan.provenance.get("cost_seq_len", DEFAULT_COST_SEQ_LEN))
        return plan.compute_sparsity(seq_len=seq_len) or 0.0

    def compute_sparsity(self, plan, arch, seq_len) -> float:
        return local_compute_sparsity(arch, seq_len, len(plan.layers), mean_keys_read(seq_len, plan.attention))

    def apply(self, model, plan):
        return apply_local(model, plan.layers, plan.attention)

    def extra_fields(self, plan) -> dict[str, Any]:
        return {"attention": plan.attention.to_dict()}
