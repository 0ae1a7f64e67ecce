"""Which tokens of one long prompt a plan updates, layer by layer: the data behind the `selection-map` figure.

A map is taken from the real prefill of the prompt under the plan (the model's own forward with the plan applied),
reading each selection layer's `last_keep`; removed layers and dense layers are recorded as such. Named spans of
the prompt (the instruction, the needle(s), the question) are located in the prompt's text and mapped to token
positions through the tokenizer's offsets, so the figure can mark them and the summary can say what share of each
span every selection layer updated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.method.apply import apply_plan, restore_dense, selective
from orthorank.method.plan import Plan
from orthorank.models.adapters import get_adapter

# What a layer did to the prompt: every token updated, some updated, or none (the layer is removed).
DENSE, SELECT, REMOVED = "dense", "select", "removed"


@dataclass
class SelectionMap:
    name: str  # e.g. "niah_single 2048 #0"
    tokens: int  # prompt length (the sink is position 0)
    states: list[str]  # per decoder layer: DENSE, SELECT or REMOVED
    kept: dict[int, list[int]]  # selection layer -> positions it updated (ascending)
    spans: dict[str, list[tuple[int, int]]]  # span name -> token ranges [start, end)
    plan: dict[str, Any] = field(default_factory=dict)  # method, layers, policy, ratio(s)

    def share_updated(self) -> dict[str, dict[int, float]]:
        """Per span: per selection layer, the share of the span's tokens the layer updated."""
        out: dict[str, dict[int, float]] = {}
        for span, ranges in self.spans.items():
            positions = {p for a, b in ranges for p in range(a, b)}
            if not positions:
                continue
            out[span] = {l: len(positions.intersection(kept)) / len(positions) for l, kept in self.kept.items()}
        return out

    def last_token_layers(self) -> tuple[int, int]:
        """(selection layers that updated the prompt's last token, selection layers): the last token's state is
        what predicts the first generated token."""
        last = self.tokens - 1
        return sum(last in kept for kept in self.kept.values()), len(self.kept)

    def summary(self) -> dict[str, Any]:
        shares = self.share_updated()
        updated, of = self.last_token_layers()
        return {
            "span_share_updated": {span: {"mean": sum(v.values()) / len(v) if v else None,
                                          "per_layer": {str(l): round(x, 4) for l, x in v.items()}}
                                   for span, v in shares.items()},
            "last_token_updated_in": updated, "selection_layers": of,
            "overall_share_updated": (sum(len(k) for k in self.kept.values()) / (len(self.kept) * self.tokens)
                                      if self.kept else None),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tokens": self.tokens, "states": self.states,
                "kept_bits": {str(l): _to_bits(v, self.tokens) for l, v in self.kept.items()},
                "spans": {k: [list(r) for r in v] for k, v in self.spans.items()},
                "plan": self.plan, "summary": self.summary()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SelectionMap":
        try:
            kept = ({int(l): _from_bits(v) for l, v in d["kept_bits"].items()} if "kept_bits" in d else
                    {int(l): [int(p) for p in v] for l, v in d["kept"].items()})
            return cls(d["name"], int(d["tokens"]), list(d["states"]), kept,
                       {k: [(int(a), int(b)) for a, b in v] for k, v in d["spans"].items()}, dict(d.get("plan", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"not a selection map ({exc.__class__.__name__}: {exc})") from None


def _to_bits(positions: list[int], tokens: int) -> str:
    """Positions as a hex bit string (bit p of the number = position p updated): compact in JSON."""
    n = 0
    for p in positions:
        n |= 1 << p
    return format(n, "x")


def _from_bits(text: str) -> list[int]:
    n = int(text, 16)
    return [p for p in range(n.bit_length()) if n >> p & 1]


def char_spans_to_tokens(offsets: list[tuple[int, int]], char_spans: dict[str, list[tuple[int, int]]]
                         ) -> dict[str, list[tuple[int, int]]]:
    """Token ranges [start, end) covering each character range: a token belongs to a span when its characters
    overlap it. `offsets` is the tokenizer's (start, end) per token ((0, 0) for added special tokens)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for name, ranges in char_spans.items():
        for a, b in ranges:
            hit = [i for i, (s, e) in enumerate(offsets) if e > s and s < b and e > a]
            if hit:
                out.setdefault(name, []).append((hit[0], hit[-1] + 1))
    return out


def tokenize_with_spans(tokenizer, text: str, char_spans: dict[str, list[tuple[int, int]]],
                        add_special_tokens: bool = True) -> tuple[list[int], dict[str, list[tuple[int, int]]]]:
    """Token ids of `text` (as the evaluation tokenizes it) and the spans in tokens."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("the selection map needs a fast tokenizer (character offsets)")
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return list(enc.input_ids), char_spans_to_tokens([tuple(o) for o in enc.offset_mapping], char_spans)


# -- prompts with named spans ---------------------------------------------------------------------------------------

_NEEDLE = re.compile(r"One of the special magic numbers for \w+ is: \d+\.")


def needle_spans(prompt: str) -> dict[str, list[tuple[int, int]]]:
    """Instruction (the first line), needle sentence(s) and question (the last line) of a long-context suite
    needle prompt, in characters."""
    first = prompt.index("\n") if "\n" in prompt else 0
    last = prompt.rindex("\n") if "\n" in prompt else len(prompt)
    return {"instruction": [(0, first)], "needle": [m.span() for m in _NEEDLE.finditer(prompt)],
            "question": [(last + 1, len(prompt))]}


def template_spans(text: str, template_text: str, context: str) -> dict[str, list[tuple[int, int]]]:
    """For a prompt built as template.format(context=..., ...) and possibly wrapped (chat template): the text
    before the context is the instruction, after it the question (both within the template's own text)."""
    start = text.find(template_text)
    if start < 0:
        raise UserError("the prompt text is not inside the model input (truncated?)")
    c = template_text.find(context)
    if c < 0:
        raise UserError("the context is not inside the prompt (truncated?)")
    return {"instruction": [(start, start + c)],
            "question": [(start + c + len(context), start + len(template_text))]}


# -- taking the map -------------------------------------------------------------------------------------------------

@torch.no_grad()
def take_map(model: nn.Module, plan: Plan, input_ids: list[int], spans: dict[str, list[tuple[int, int]]],
             name: str) -> SelectionMap:
    """Prefill `input_ids` (one row) under `plan` and read which positions each selection layer updated."""
    adapter = get_adapter(model)
    L = len(adapter.layers(model))
    removed = set(plan.removed_layers)
    device = next(model.parameters()).device
    apply_plan(model, plan)
    try:
        model(input_ids=torch.tensor([input_ids], device=device), use_cache=False)
        kept: dict[int, list[int]] = {}
        # the decoder's layers now (removed ones are out of the list; selective ones keep their original index)
        installed = [s for s in map(selective, adapter.layers(model)) if s is not None]
        for sel in sorted(installed, key=lambda s: s.layer_index):
            index = sel.layer_index
            keep = sel.last_keep  # None: the layer ran densely (e.g. ratio 1)
            kept[index] = list(range(len(input_ids))) if keep is None else torch.nonzero(keep[0]).flatten().tolist()
    finally:
        restore_dense(model)
    states = [REMOVED if i in removed else SELECT if i in kept else DENSE for i in range(L)]
    selection = plan.selection.to_dict() if plan.selection is not None else None
    info = {"method": plan.method, "layers": plan.layers, "removed": sorted(removed),
            "selection": selection, "actions": {str(k): v for k, v in (plan.actions or {}).items()} or None,
            "source": plan.provenance.get("file")}
    return SelectionMap(name, len(input_ids), states, kept, spans, {k: v for k, v in info.items() if v is not None})
