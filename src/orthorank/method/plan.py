"""A plan says where OrthoRank runs (or which layers a pruning baseline removes) for one model."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.method.selection import SelectionConfig

PLAN_FORMAT = "orthorank-plan/1"
METHODS = ("dense", "orthorank", "prune")


def layers_for_sparsity(sparsity: float, num_layers: int, method: str, ratio: float = 0.33) -> int:
    """Layer pruning removes ceil(s * L) layers (as SLEB does); OrthoRank selects tokens in
    round(s * L / (1 - ratio)) layers, so that both skip about the same share of per-token layer work."""
    check_sparsity(sparsity)
    if method == "prune":
        return min(num_layers, math.ceil(sparsity * num_layers - 1e-9))
    if ratio >= 1.0:
        raise UserError("ratio 1.0 skips no work, so no layer count reaches a sparsity above 0")
    return min(num_layers, round(sparsity * num_layers / (1.0 - ratio)))


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
    nominal_sparsity: float | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"unknown plan method {self.method!r}; choose one of {', '.join(METHODS)}")
        n = self.signature.get("num_layers")
        if n is not None:
            parse_layers(",".join(map(str, self.layers)), n)
        self.layers = sorted(set(self.layers))
        if self.method == "orthorank" and self.selection is None:
            self.selection = SelectionConfig()

    @property
    def num_layers(self) -> int:
        return int(self.signature["num_layers"])

    @property
    def effective_sparsity(self) -> float:
        """Skipped share of per-token layer work that this plan really achieves."""
        if self.method == "dense":
            return 0.0
        share = len(self.layers) / self.num_layers
        return share * (1.0 - self.selection.ratio) if self.method == "orthorank" else share

    def label(self) -> str:
        if self.method == "dense":
            return "dense"
        name = self.provenance.get("search", self.method)
        return f"{name}@{self.nominal_sparsity:g}" if self.nominal_sparsity is not None else name

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "model": self.model,
            "signature": self.signature,
            "method": self.method,
            "layers": self.layers,
            "selection": self.selection.to_dict() if self.selection else None,
            "nominal_sparsity": self.nominal_sparsity,
            "effective_sparsity": round(self.effective_sparsity, 6),
            "provenance": self.provenance,
        }

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        path = Path(path)
        if path.exists() and not overwrite:
            raise UserError(f"{path} exists; pass --overwrite to replace it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
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
                selection=SelectionConfig(**sel) if sel else None,
                nominal_sparsity=data.get("nominal_sparsity"),
                provenance=dict(data.get("provenance") or {}),
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
