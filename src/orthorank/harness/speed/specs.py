"""What bench times: one spec per method, a saved plan or layers spread evenly (any shape, no search), with its
cost-model inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from orthorank.errors import UserError
from orthorank.method.apply import apply_hybrid, restore_dense
from orthorank.method.cost import Arch, removal_sparsity, hybrid_compute_sparsity
from orthorank.method.plan import Plan, layers_for_sparsity
from orthorank.method.plan_store import find_plan
from orthorank.method.kinds import PlanKind
from orthorank.method.registry import benched, get_method
from orthorank.method.selection import SelectionConfig
from orthorank.harness.runtime.costmodel import spread_layers


@dataclass
class MethodSpec:
    name: str
    kind: PlanKind  # method/kinds/: what the method does to the model
    layers: list[int]  # the layers it changes: the selection layers where its kind selects, else the removed ones
    source: str = "spread"  # "spread" (evenly spread at the sparsity) or the plan file it came from
    selection: SelectionConfig | None = None
    removed: list[int] = field(default_factory=list)  # hybrid: removed layers (`layers` are its selection layers)
    # a saved hybrid plan's own selection per layer (keep ratios may differ by layer); None: `selection` everywhere
    per_layer: dict[int, SelectionConfig] | None = None
    decode_only: bool = False  # a variant that differs only in its decode policy: timed in decode mode only

    @property
    def selection_layers(self) -> list[int]:
        return self.layers if self.kind.selects else []

    @property
    def removed_layers(self) -> list[int]:
        """Layers this method does not run at all."""
        return self.removed if self.kind.selects else self.layers

    def ratios(self) -> list[float]:
        """The keep ratio of each selection layer."""
        if self.per_layer is not None:
            return [self.per_layer[i].ratio for i in self.selection_layers]
        return [self.selection.ratio for _ in self.selection_layers]

    def effective_sparsity(self, num_layers: int) -> float:
        """The paper's nominal measure: (removed + the skipped share of each selection layer) / L."""
        return (len(self.removed_layers) + sum(1.0 - r for r in self.ratios())) / num_layers

    def apply(self, model: nn.Module) -> None:
        if self.kind.dense:
            restore_dense(model)
        else:
            apply_hybrid(model, self.removed_layers,
                         self.per_layer or {i: self.selection for i in self.selection_layers})


def method_specs(methods: list[str], num_layers: int, sparsity: float, selection: SelectionConfig,
                 plans: list[tuple[str, Plan]] = (), model_name: str | None = None,
                 arch: Arch | None = None, seq_len: int | None = None) -> list[MethodSpec]:
    """Layers per method (names from orthorank.method.registry): a searched method's saved plan at the sparsity, evenly
    spread layers for spread-prune / spread-orthorank; a --plan file of the same kind overrides either."""

    specs = []
    for name in methods:
        method = get_method(name, benched())
        kind = method.kind
        if kind.dense:
            specs.append(MethodSpec(name, kind, [], source="-"))
            continue
        spec = MethodSpec(name, kind, [], selection=selection if kind.selects and not kind.per_layer else None)
        override = [(path, plan) for path, plan in plans if plan.kind is kind]
        if override:
            path, plan = override[-1]
            spec.layers, spec.source = list(plan.layers), str(path)
        elif method.layers == "plan":
            if model_name is None:
                raise UserError(f"method {name} uses its saved plan; pass --plan FILE")
            path = find_plan(model_name, method.plan_label, sparsity)
            plan = Plan.load(path)
            spec.layers, spec.source = list(plan.layers), str(path)
        from_plan = bool(override) or method.layers == "plan"
        if kind.per_layer and from_plan:  # a saved hybrid plan: its removals and its selection per layer
            spec.removed, spec.per_layer = list(plan.removed_layers), dict(plan.selection_layers)
            spec.layers = sorted(spec.per_layer)
            spec.selection = next(iter(spec.per_layer.values()), selection)
        elif kind.per_layer:
            spec.selection = selection
            spec.removed, spec.layers = spread_hybrid_layers(sparsity, num_layers, selection.ratio, arch,
                                                             seq_len or 2048)
        elif not from_plan:
            count = layers_for_sparsity(sparsity, num_layers, kind.name, selection.ratio, match=method.match,
                                        arch=arch, seq_len=seq_len or 2048, inner_only=False)
            spec.layers = spread_layers(count, num_layers)
        if kind.selects and not kind.per_layer and from_plan:
            spec.selection = plan.selection
        if len(spec.removed_layers) >= num_layers:
            raise UserError("layer removal at this sparsity would remove every layer")
        specs.append(spec)
    if len({s.name for s in specs}) != len(specs):
        raise UserError("--methods lists a method twice")
    return specs


def spread_hybrid_layers(sparsity: float, num_layers: int, ratio: float, arch: Arch | None,
                         seq_len: int) -> tuple[list[int], list[int]]:
    """A hybrid point for speed measurements on random shapes (no calibration): half of layer removal's
    ceil(s L) layers removed (evenly spread), and the fewest evenly spread selection layers among the rest whose
    FLOPs at seq_len make up the other half's compute (all of the rest when even that falls short)."""
    p = layers_for_sparsity(sparsity, num_layers, "prune", 1.0, inner_only=False)
    removed = spread_layers(p // 2, num_layers)
    rest = [i for i in range(num_layers) if i not in removed]
    if arch is None or p - len(removed) == 0:
        return removed, []
    target = removal_sparsity(arch, seq_len, p)
    for n in range(1, len(rest) + 1):
        if hybrid_compute_sparsity(arch, seq_len, len(removed), [ratio] * n) >= target - 1e-12:
            break
    picks = spread_layers(n, len(rest))
    return removed, [rest[j] for j in picks]
