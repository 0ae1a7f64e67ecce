"""A plan says where OrthoRank runs (or which layers a pruning baseline removes) for one model."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.method.cost import (  # noqa: F401  (DEFAULT_COST_SEQ_LEN, selection_scoring_flops: named from here)
    DEFAULT_COST_SEQ_LEN, Arch, removal_sparsity, selection_layers_to_match, selection_scoring_flops,
)
from orthorank.method.kinds import KINDS, PlanKind, get_kind
from orthorank.method.kinds.hybrid import REMOVE  # noqa: F401  (named from here by its callers)
from orthorank.method.local_attention import LocalAttention
from orthorank.method.selection import SelectionConfig
from orthorank.files import atomic_write_text

PLAN_FORMAT = "orthorank-plan/1"
# The plan kinds (method/kinds/): what a plan does to the model
METHODS = tuple(KINDS)
# How many selection layers a sparsity level means for OrthoRank (pruning always removes ceil(s * L) layers):
# "compute": the fewest selection layers whose compute sparsity (FLOPs skipped at the evaluated sequence length,
# counting what bypassed tokens still run) is at least that of pruning ceil(s * L) layers - the fair default;
# "nominal": the paper's rule, round(s * L / (1 - r)) layers, equal nominal sparsity.
# `calibrate` makes compute-matched plans exact by raising the plans' one keep ratio until the compute shares are
# equal, and adds "speed": the same layers, the keep ratio set so that the measured prefill speed-up equals
# pruning's on the machine at hand.
MATCH_RULES = ("compute", "nominal", "speed")


def layers_for_sparsity(sparsity: float, num_layers: int, method: str, ratio: float = 0.33, *,
                        match: str = "nominal", arch: Arch | None = None,
                        seq_len: int = DEFAULT_COST_SEQ_LEN, inner_only: bool = True,
                        scoring: float | None = None) -> int:
    """Layers a method changes at a sparsity level. Pruning removes ceil(s * L) layers (as SLEB does). OrthoRank
    selects tokens in round(s * L / (1 - ratio)) layers under match="nominal" (the paper's rule), or in the fewest
    layers whose compute sparsity reaches pruning's under match="compute" (needs `arch`)."""
    check_sparsity(sparsity)
    removed = min(num_layers, math.ceil(sparsity * num_layers - 1e-9))
    if not get_kind(method).selects:
        return removed
    if ratio >= 1.0:
        raise UserError("ratio 1.0 skips no work, so no layer count reaches a sparsity above 0")
    if match == "nominal":
        return min(num_layers, round(sparsity * num_layers / (1.0 - ratio)))
    if match not in ("compute", "speed"):
        raise UserError(f"unknown sparsity matching rule {match!r}; choose one of {', '.join(MATCH_RULES)}")
    if arch is None:
        raise ValueError("match='compute' needs the model's architecture")
    target = removal_sparsity(arch, seq_len, removed)
    n = selection_layers_to_match(arch, seq_len, target, ratio, scoring)
    room = num_layers - 2 if inner_only else num_layers  # searches never touch the first and last layer
    if n > room:
        raise UserError(f"sparsity {sparsity:g} needs {n} selection layers at ratio {ratio:g} to match pruning's "
                        f"compute, more than the {room} {'inner ' if inner_only else ''}layers; lower the sparsity "
                        "or the ratio")
    return n


def check_sparsity(sparsity: float) -> None:
    if not (0.0 <= sparsity < 1.0) or math.isnan(sparsity):
        raise UserError(f"sparsity must be in [0, 1), got {sparsity}")


def parse_layers(text: str, num_layers: int | None = None) -> list[int]:
    try:
        layers = sorted({int(p) for p in text.replace(" ", "").split(",") if p != ""})
    except ValueError:
        raise UserError(f"--layers must be comma-separated integers, got {text!r}") from None
    if num_layers is not None:
        bad = [i for i in layers if not 0 <= i < num_layers]
        if bad:
            raise UserError(f"layer indices {bad} are out of range for a model with {num_layers} layers")
    return layers


@dataclass
class Plan:
    method: str
    layers: list[int]
    model: str
    signature: dict[str, Any]
    selection: SelectionConfig | None = None
    target_sparsity: float | None = None  # the level asked for (e.g. 0.2); see `match` in the provenance
    provenance: dict[str, Any] = field(default_factory=dict)
    arch: dict[str, int] | None = None  # Arch fields, for FLOP counts without loading the model
    # Hybrid plans only: layer -> "remove" or that selection layer's ratio (the other SelectionConfig fields come
    # from `selection`, whose own ratio is unused). `layers` is then every changed layer.
    actions: dict[int, str | float] | None = None
    attention: LocalAttention | None = None  # local plans only: the pattern their layers' prefill attends with

    def __post_init__(self) -> None:
        kind = get_kind(self.method)
        for name in ("actions", "attention"):
            if getattr(self, name) is not None and name not in kind.own_fields:
                owner = next(k.name for k in KINDS.values() if name in k.own_fields)
                what = "per-layer actions" if name == "actions" else "local attention"
                raise UserError(f"{what} belong{'s' if name == 'attention' else ''} to {owner} plans, not to a "
                                f"{self.method} plan")
        kind.check(self)
        n = self.signature.get("num_layers")
        if n is not None:
            parse_layers(",".join(map(str, self.layers)), n)
        self.layers = sorted(set(self.layers))
        if self.selection is not None and self.selection.progressive:
            ratios = [c.ratio for c in self.selection_layers.values()]
            if any(b > a for a, b in zip(ratios, ratios[1:])):
                raise UserError("a progressive plan keeps no more tokens in a layer than in the one before: its "
                                f"ratios {[round(r, 4) for r in ratios]} rise with depth")

    @property
    def kind(self) -> PlanKind:
        """What the plan does to the model (method/kinds/): every kind-specific answer below comes from it."""
        return get_kind(self.method)

    @property
    def removed_layers(self) -> list[int]:
        """Layers the plan removes (a prune plan's layers; a hybrid plan's "remove" actions)."""
        return self.kind.removed_layers(self)

    @property
    def selection_layers(self) -> dict[int, SelectionConfig]:
        """Selection layers and the SelectionConfig each runs (per-layer ratio in hybrid plans)."""
        return self.kind.selection_layers(self)

    @property
    def num_layers(self) -> int:
        return int(self.signature["num_layers"])

    @property
    def ratio(self) -> float:
        return self.kind.ratio(self)

    @property
    def nominal_sparsity(self) -> float:
        """The paper's measure: (n / L) * (1 - r), or removed / L (hybrid: (removed + sum of (1 - r)) / L)."""
        return self.kind.nominal_sparsity(self)

    # Old name of the nominal measure, kept for callers of the first plan format.
    effective_sparsity = nominal_sparsity

    def compute_sparsity(self, arch: Arch | None = None, seq_len: int = DEFAULT_COST_SEQ_LEN) -> float | None:
        """Share of the model's per-token FLOPs skipped at `seq_len` (None when the architecture is unknown)."""
        arch = arch or (Arch(**self.arch) if self.arch else None)
        return None if arch is None else self.kind.compute_sparsity(self, arch, seq_len)

    def sparsity(self, arch: Arch | None = None, seq_len: int = DEFAULT_COST_SEQ_LEN,
                 measured: float | None = None) -> dict[str, Any]:
        """The three measures: nominal, compute (at seq_len) and measured speed-up (None where not run)."""
        comp = self.compute_sparsity(arch, seq_len)
        return {"nominal": round(self.nominal_sparsity, 6), "compute": None if comp is None else round(comp, 6),
                "compute_seq_len": seq_len, "measured_speedup": measured}

    @property
    def recorded_speedup(self) -> float | None:
        """The prefill speed-up measured when the plan was made (`calibrate --measure-speed`), if it was."""
        return (self.provenance.get("measured") or {}).get("speedup")

    def label(self) -> str:
        return self.kind.label(self)

    def content_hash(self) -> str:
        """What the plan does (method, layers, selection, model), not where it came from: the result store's key."""
        body = {"method": self.method, "layers": self.layers, "model": self.model, "signature": self.signature,
                "selection": self.selection.key_dict() if self.selection else None}
        body.update(self.kind.extra_fields(self))  # only some kinds add keys: other plans' hashes stay as they were
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": PLAN_FORMAT,
            "model": self.model,
            "signature": self.signature,
            "method": self.method,
            "layers": self.layers,
            "selection": self.selection.to_dict() if self.selection else None,
            "target_sparsity": self.target_sparsity,
            "sparsity": self.sparsity(seq_len=int(self.provenance.get("cost_seq_len", DEFAULT_COST_SEQ_LEN)),
                                      measured=self.recorded_speedup),
            "arch": self.arch,
            "provenance": self.provenance,
        }
        out.update(self.kind.extra_fields(self))
        return out

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        path = Path(path)
        if path.exists() and not overwrite:
            raise UserError(f"{path} exists; pass --overwrite to replace it")

        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: Any, source: str = "plan") -> "Plan":
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise UserError(f"{source} is not an orthorank plan (expected \"format\": \"{PLAN_FORMAT}\")")
        try:
            sel = data.get("selection")
            return cls(
                method=data["method"],
                layers=[int(i) for i in data["layers"]],
                model=str(data["model"]),
                signature=dict(data["signature"]),
                selection=SelectionConfig.from_dict(sel) if sel else None,
                # plans of the first format called the requested level "nominal_sparsity"
                target_sparsity=data.get("target_sparsity", data.get("nominal_sparsity")),
                provenance=dict(data.get("provenance") or {}),
                arch=dict(data["arch"]) if data.get("arch") else None,
                actions=({int(k): v for k, v in dict(data["actions"]).items()}
                         if data.get("actions") is not None else None),
                attention=(LocalAttention.from_dict(data["attention"])
                           if data.get("attention") is not None else None),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source} is malformed: {type(exc).__name__}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        path = Path(path)
        if not path.is_file():
            raise UserError(f"plan file {path} does not exist")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"plan file {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data, source=f"plan file {path}")

    def check_model(self, name: str, signature: dict[str, Any]) -> None:
        if name != self.model or any(signature.get(k) != v for k, v in self.signature.items()):
            raise UserError(
                f"this plan was made for model {self.model!r} {self.signature}, not for {name!r} {signature}"
            )

