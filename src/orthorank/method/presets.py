"""Presets: a setting chosen by the evidence, which a user picks by name (`generate --preset long-prompt`).

A preset names a method (a schedule of method/schedules.py or a method with saved plans), a level s (the compute of
removing ceil(s L) layers, at the prompt's own length) and a tail W (the prompt's last W tokens always updated). It
is never typed by hand: `python -m orthorank.harness.study.presets` chooses it from committed frontier files scored on
calibration prompts (`frontier --score-on calibration`; the method and level with the best free speed-up across every
model and length measured) and writes
src/orthorank/presets/<name>.json with the numbers it rests on. Where no setting is free anywhere, the preset is
dense, and says why.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.method.cost import Arch, removal_sparsity
from orthorank.method.plan import Plan
from orthorank.method.policies import parse_variant
from orthorank.method.registry import get_method, is_reference
from orthorank.method.schedules import schedule_plan

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"
PRESET_FORMAT = "orthorank-preset/1"


@dataclass(frozen=True)
class Preset:
    name: str
    method: str  # "dense", a schedule (method/schedules.py) or a method with saved plans whose search order gives its levels
    level: float | None = None
    tail: int = 0  # always-updated last tokens of the prompt (within K)
    policy: str | None = None  # a policy variant on its selection layers (method/policies.parse_variant)
    min_length: int = 0  # the shortest prompt length it was measured at: shorter prompts run dense (unmeasured)
    global_head: int = 0  # local attention: the prompt's first tokens, read by every query (its instruction)
    global_tail: int | None = None  # local attention: the prompt's last tokens, reading every key (None: the plan's)
    models: list[str] | None = None  # the models it was chosen on; others run dense (None: presets before this field)
    max_length: int = 0  # the longest prompt length it was chosen at; longer prompts run dense (0: no bound)
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": PRESET_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> "Preset":
        if not isinstance(data, dict) or data.get("format") != PRESET_FORMAT:
            raise UserError(f"{source} is not an orthorank preset")
        data = {k: v for k, v in data.items() if k != "format"}
        try:
            preset = cls(**data)
        except TypeError as exc:
            raise UserError(f"{source} is malformed: {exc}") from None
        whole = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
        bad = [k for k, ok in (("min_length", whole(preset.min_length)), ("max_length", whole(preset.max_length)),
                               ("global_head", whole(preset.global_head)),
                               ("global_tail", preset.global_tail is None or whole(preset.global_tail)),
                               ("models", preset.models is None or (isinstance(preset.models, list) and all(
                                   isinstance(m, str) for m in preset.models)))) if not ok]
        if bad:
            raise UserError(f"{source} is malformed: {bad[0]} must be "
                            + ("a list of model names" if bad[0] == "models" else "a whole number >= 0"))
        return preset


def available() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_preset(name: str) -> Preset:
    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(available()) or '(none yet)'}")
    return Preset.from_dict(json.loads(path.read_text()), f"preset file {path}")


def preset_plan(preset: Preset, model: str, signature: dict[str, Any], arch: Arch, prompt_len: int,
                saved: Plan | None = None, layer_types: list[str] | None = None) -> Plan:
    """The preset's plan for a model at a prompt length. `saved`: the method's saved plan (its search order), for
    methods that are not schedules."""
    if is_reference(preset.method):
        return Plan("dense", [], model, signature)
    if prompt_len < preset.min_length:  # no evidence there: local attention, for one, is slower than dense at 1k
        return Plan("dense", [], model, signature,
                    provenance={"preset": preset.name, "why": f"prompts under {preset.min_length} tokens run dense: "
                                                              "the preset was measured from that length on"})
    if preset.models is not None and model not in preset.models:
        return Plan("dense", [], model, signature,
                    provenance={"preset": preset.name, "why": f"{model} runs dense: the preset was chosen on "
                                                              f"{', '.join(preset.models)} only"})
    if preset.max_length and prompt_len > 1.25 * preset.max_length:
        return Plan("dense", [], model, signature,
                    provenance={"preset": preset.name, "why": f"prompts over {preset.max_length} tokens (+25%) run "
                                                              "dense: the preset was not measured there"})
    L = arch.num_layers
    removed = min(L - 1, math.ceil(preset.level * L - 1e-9))
    target = removal_sparsity(arch, prompt_len, removed)
    if get_method(preset.method).layers == "schedule":
        plan = schedule_plan(preset.method, model, signature, arch, target, prompt_len, layer_types=layer_types,
                             at_most_reach=True)
        if plan.attention is not None and plan.compute_sparsity(arch, prompt_len) <= 0.0:
            return Plan("dense", [], model, signature, provenance={"preset": preset.name,
                                                                   "why": "the prompt fits local attention's window"})
    else:
        if saved is None or not saved.provenance.get("order"):
            raise UserError(f"the {preset.name} preset needs the saved {preset.method} plan of this model")
        plan = saved.kind.level_prefix(saved, arch, prompt_len, removed, target)[0]
    if plan.attention is not None:
        plan = with_spans(plan, preset.global_head, preset.global_tail)
    if plan.selection is not None:
        change = parse_variant(preset.policy) if preset.policy else {}
        if preset.tail:
            change["keep_recent"] = preset.tail
        plan = dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, **change))
    return dataclasses.replace(plan, provenance={**plan.provenance, "preset": preset.name})


def with_spans(plan: Plan, head: int | None = None, tail: int | None = None) -> Plan:
    """A local attention plan with other global spans (method/local_attention.py); None keeps the plan's own."""
    if not plan.kind.global_spans:
        raise UserError(f"global spans (head, tail) belong to local attention plans, not to a {plan.method} plan")
    change = {k: int(v) for k, v in (("head", head), ("tail", tail)) if v is not None}
    return dataclasses.replace(plan, attention=dataclasses.replace(plan.attention, **change)) if change else plan
