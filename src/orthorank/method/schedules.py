"""Plans from a formula rather than a search: where long prompts are concerned, which layers select and how many
tokens each keeps follows from depth alone, at a compute target.

- depth: OrthoRank (its policy, bypassed tokens' K/V kept) in the later layers only, from `start` to the last inner
  layer, every one at the same keep ratio, set so that the plan skips the target's compute share. Early layers,
  where the sink has not formed and where retrieval heads read the prompt, stay dense.
- progressive (LazyLLM-style, Fu et al. 2024, arXiv 2407.14057): from `start` on, every layer keeps fewer tokens
  than the one before (a linear ramp from 1 down to a final keep ratio, set for the target), a token left out
  stays out of every later layer and offers no keys there (its K/V still reach the cache, so decoding can revive
  it), scored by the attention the last token pays it (LazyLLM's rule; here this layer's own estimate, since SDPA
  does not return the previous layer's probabilities). The last token is always kept: it predicts the answer.

- local (beyond the paper; method/local_attention.py): local prefill attention (sinks + a 256-token window for the
  context, the prompt's last 64 tokens global) in the later full-attention layers, from the last one down, as many as
  the target takes; every token is still updated by every layer. `start` bounds how deep it may reach (default: all
  but the first layer).

Targets are compute shares at one sequence length (method/cost.py); the plans are hybrid plans (a keep ratio per
layer) and run through every command.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from orthorank.errors import UserError
from orthorank.method.cost import Arch
from orthorank.method.local_attention import LocalAttention
from orthorank.method.plan import Plan
from orthorank.method.selection import SelectionConfig

SCHEDULES = ("depth", "progressive", "local")
DEFAULT_START = {"depth": 0.5, "progressive": 0.25, "local": 0.0}  # share of the layers before the first selecting one
# LazyLLM's selection: the last token's attention, pruned tokens' keys hidden (the sink's kept visible), nested
PROGRESSIVE_SELECTION = SelectionConfig(policy="attention", attention_window=1, bypass_kv=False,
                                        sink_kv_visible=True, progressive=True, keep_recent=1)


def first_layer(num_layers: int, start: float) -> int:
    if not 0.0 <= start < 1.0:
        raise UserError(f"a schedule's start is a share of the layers in [0, 1), got {start}")
    return max(1, int(round(start * num_layers)))


def _ramp(first: int, last: int, final: float) -> dict[int, float]:
    """Keep ratios falling linearly from just under 1 at `first` to `final` at `last` (inclusive)."""
    n = last - first + 1
    return {first + j: 1.0 - (1.0 - final) * (j + 1) / n for j in range(n)}


def _solve(make, arch: Arch, seq_len: int, target: float, what: str) -> Plan:
    """The plan of `make(x)` (x in (0, 1], less skipped as x grows) whose compute share at seq_len is closest to
    the target from above or at it, by bisection on x."""
    most = make(1.0 / seq_len)
    if most.compute_sparsity(arch, seq_len) < target - 1e-9:
        raise UserError(f"the {what} schedule cannot skip {target:.3f} of the compute at {seq_len} tokens (at most "
                        f"{most.compute_sparsity(arch, seq_len):.3f}): start it earlier or lower the target")
    lo, hi = 1.0 / seq_len, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if make(mid).compute_sparsity(arch, seq_len) >= target:
            lo = mid
        else:
            hi = mid
    return make(lo)


def schedule_plan(kind: str, model: str, signature: dict[str, Any], arch: Arch, target: float, seq_len: int,
                  start: float | None = None, selection: SelectionConfig | None = None,
                  layer_types: list[str] | None = None, at_most_reach: bool = False) -> Plan:
    """A `kind` schedule (SCHEDULES) for a model that skips `target` of its compute at `seq_len` tokens.
    layer_types: the model's config.layer_types where it has them (local attention skips sliding layers).
    at_most_reach: a local schedule whose target is past its reach (a short prompt, few full-attention layers) is
    every full-attention layer it may use, rather than an error."""
    if kind not in SCHEDULES:
        raise UserError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    start = DEFAULT_START[kind] if start is None else start
    first = first_layer(arch.num_layers, start)
    return _BUILDERS[kind](_Schedule(kind, model, signature, arch, target, seq_len, start, first), selection,
                           layer_types, at_most_reach)


@dataclasses.dataclass(frozen=True)
class _Schedule:
    """What every schedule is built from: the model, the compute target at a length, and the first layer it uses."""
    kind: str
    model: str
    signature: dict[str, Any]
    arch: Arch
    target: float
    seq_len: int
    start: float
    first: int

    def ratios_plan(self, ratios: dict[int, float], selection: SelectionConfig) -> Plan:
        return _plan(self.model, self.signature, self.arch, ratios, selection, self.kind, self.start, self.target,
                     self.seq_len)

    def solve(self, make, last: int) -> Plan:
        if self.first > last:
            raise UserError(f"a {self.kind} schedule starting at layer {self.first} of {self.arch.num_layers} has "
                            "no layer to select in")
        return _solve(make, self.arch, self.seq_len, self.target, self.kind)


def _depth(s: _Schedule, selection: SelectionConfig | None, layer_types, at_most_reach: bool) -> Plan:
    sel = selection or SelectionConfig()
    last = s.arch.num_layers - 2  # the last layer stays dense, as in every search
    return s.solve(lambda x: s.ratios_plan({i: x for i in range(s.first, last + 1)}, sel), last)


def _progressive(s: _Schedule, selection: SelectionConfig | None, layer_types, at_most_reach: bool) -> Plan:
    sel = selection or PROGRESSIVE_SELECTION
    if not sel.progressive:
        sel = dataclasses.replace(sel, progressive=True, bypass_kv=False)
    last = s.arch.num_layers - 1
    return s.solve(lambda x: s.ratios_plan(_ramp(s.first, last, x), sel), last)


def _local(s: _Schedule, selection: SelectionConfig | None, layer_types, at_most_reach: bool) -> Plan:
    return _local_plan(s.model, s.signature, s.arch, s.target, s.seq_len, s.first, s.start, layer_types,
                       at_most_reach)


_BUILDERS = {"depth": _depth, "progressive": _progressive, "local": _local}


def _local_plan(model: str, signature: dict[str, Any], arch: Arch, target: float, seq_len: int, first: int,
                start: float, layer_types: list[str] | None, at_most_reach: bool = False) -> Plan:
    """The fewest full-attention layers, from the last one down to `first`, whose local attention skips at least
    the target's compute share at seq_len."""
    full = [i for i in range(first, arch.num_layers)
            if not isinstance(layer_types, list) or layer_types[i] == "full_attention"]
    provenance = {"search": "schedule-local", "schedule": "local", "start": start, "target_compute": round(target, 6),
                  "cost_seq_len": seq_len}
    for n in range(1, len(full) + 1):
        plan = Plan("local", full[-n:], model, signature, attention=LocalAttention(), arch=dataclasses.asdict(arch),
                    provenance=provenance)
        if plan.compute_sparsity(arch, seq_len) >= target - 1e-9:
            return plan
    most = Plan("local", full, model, signature, attention=LocalAttention(), arch=dataclasses.asdict(arch),
                provenance={**provenance, "at_most_reach": True})
    if at_most_reach and full:
        return most
    raise UserError(f"the local schedule cannot skip {target:.3f} of the compute at {seq_len} tokens (at most "
                    f"{most.compute_sparsity(arch, seq_len):.3f} with all {len(full)} full-attention layers from "
                    f"layer {first}): lower the target")


def _plan(model: str, signature: dict[str, Any], arch: Arch, ratios: dict[int, float], selection: SelectionConfig,
          kind: str, start: float, target: float, seq_len: int) -> Plan:
    return Plan("hybrid", sorted(ratios), model, signature, selection=dataclasses.replace(selection, ratio=1.0),
                target_sparsity=None, arch=dataclasses.asdict(arch), actions={i: round(r, 6) for i, r in ratios.items()},
                provenance={"search": f"schedule-{kind}", "schedule": kind, "start": start,
                            "target_compute": round(target, 6), "cost_seq_len": seq_len})
