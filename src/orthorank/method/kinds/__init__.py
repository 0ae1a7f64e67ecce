"""Plan kinds: what a plan does to a model, one module each (dense, prune, orthorank, hybrid, local).

A kind says, in one place, which fields its plans carry and how they are checked, which layers it removes and which
select tokens, what its plans skip (nominal and compute sparsity), and how a plan is applied. `Plan` (method/plan.py)
holds the data and asks its kind; `apply_plan` asks the kind; nothing outside these modules tests a plan's kind by
its name. Adding a kind is one module with a `@register` class, imported at the bottom of this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from orthorank.errors import UserError

if TYPE_CHECKING:
    from torch import nn

    from orthorank.method.cost import Arch
    from orthorank.method.plan import Plan
    from orthorank.method.selection import SelectionConfig


class PlanKind:
    """The behaviour shared by every plan of one kind (stateless: one instance per kind)."""

    name: ClassVar[str] = ""
    # Plan fields that belong to this kind alone (a plan of another kind must leave them None)
    own_fields: ClassVar[tuple[str, ...]] = ()
    dense: ClassVar[bool] = False  # the unchanged model
    selects: ClassVar[bool] = False  # some layers select tokens (a SelectionConfig applies)
    removes: ClassVar[bool] = False  # some layers are removed
    per_layer: ClassVar[bool] = False  # each changed layer has its own action (a hybrid plan's "remove" or ratio)
    from_layers: ClassVar[bool] = False  # a plan of it is a list of layers (`--method KIND --layers 3,5,7`)
    prefixes: ClassVar[bool] = False  # a saved plan's search order gives its lower levels (`level_prefix`)
    global_spans: ClassVar[bool] = False  # its plans carry local attention's global spans (head, tail)

    @property
    def one_selection(self) -> bool:
        """Every selection layer runs the same SelectionConfig (one keep ratio for the whole plan)."""
        return self.selects and not self.per_layer

    def check(self, plan: Plan) -> None:
        """Fill defaults and refuse what this kind's plans cannot be (called once, when the plan is made)."""

    def removed_layers(self, plan: Plan) -> list[int]:
        return []

    def selection_layers(self, plan: Plan) -> dict[int, SelectionConfig]:
        return {}

    def actions(self, plan: Plan) -> dict[int, str | float]:
        """The plan as per-layer actions, as cost tables price them: layer -> "remove" or its keep ratio (layers
        the kind leaves to run every token through every part are absent)."""
        return {}

    def ratio(self, plan: Plan) -> float:
        """The plan's one keep ratio (1.0 where no single ratio applies)."""
        return 1.0

    def nominal_sparsity(self, plan: Plan) -> float:
        return 0.0

    def compute_sparsity(self, plan: Plan, arch: Arch, seq_len: int) -> float:
        return 0.0

    def apply(self, model: nn.Module, plan: Plan) -> nn.Module:
        raise NotImplementedError

    def level_prefix(self, saved: Plan, arch: Arch, seq_len: int, removed: int, target: float) -> tuple[Plan, float]:
        """The plan at a lower level, read from a saved plan's search order, and the compute share it skips at
        seq_len: the level is pruning `removed` layers, which skips `target`. A UserError says why there is none."""
        raise UserError(f"a {self.name} plan records no search order to read lower levels from")

    def label(self, plan: Plan) -> str:
        name = plan.provenance.get("search", plan.method)
        if plan.target_sparsity is None and plan.provenance.get("target_speedup") is not None:
            return f"{name}@{plan.provenance['target_speedup']:g}x"
        return f"{name}@{plan.target_sparsity:g}" if plan.target_sparsity is not None else name

    def extra_fields(self, plan: Plan) -> dict[str, Any]:
        """Fields only this kind's plans write (to the plan file and its content hash): none by default, so the
        hashes of the first kinds' plans stay as they were."""
        return {}


KINDS: dict[str, PlanKind] = {}


def register(cls: type[PlanKind]) -> type[PlanKind]:
    KINDS[cls.name] = cls()
    return cls


def layer_list_kinds() -> list[str]:
    """Kinds whose plans a command line gives as a list of layers (`--method prune --layers 3,5`)."""
    return [name for name, kind in KINDS.items() if kind.from_layers]


def get_kind(name: str) -> PlanKind:
    try:
        return KINDS[name]
    except KeyError:
        raise UserError(f"unknown plan method {name!r}; choose one of {', '.join(KINDS)}") from None


# The kinds, in the order the plan format lists them; each registers itself.
from orthorank.method.kinds import dense, orthorank, prune, hybrid, local  # noqa: E402,F401
