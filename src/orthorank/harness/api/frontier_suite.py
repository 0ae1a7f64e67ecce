"""What the frontier scores and which span variants it adds: the offline RULER-grade suite's items (every task, in
each layout, with and without the chat template) labelled for the non-inferiority rule's groups, and the local
attention rows with other global spans (head H, tail W: method/local_attention.py).

    items = suite_items(builder, tokenizer, tasks, 4096, samples=2, layouts=["last", "first", "long"], chats=[False])
    rows += span_rows(rows, parse_spans("0:64,192:64"))
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from orthorank.errors import UserError, comma_items
from orthorank.harness.evaluation.longctx import Item, Row
from orthorank.harness.evaluation.longctx_suite import SuiteBuilder, score_sample
from orthorank.harness.evaluation.overlap import NGRAM, ngram_hashes

CHAT_MODES = {"off": [False], "on": [True], "both": [False, True]}
# Haystacks drawn from a text pool; the others (RULER's noise sentences, distractor needles, random words) are
# templates that every prompt of a task shares by design, so the overlap check leaves them out.
TEXT_HAYSTACKS = ("text", "passages")


def chat_modes(text: str) -> list[bool]:
    if text not in CHAT_MODES:
        raise UserError(f"--chat must be one of {', '.join(CHAT_MODES)}, got {text!r}")
    return CHAT_MODES[text]


def item_key(length: int, task: str, index: int, layout: str, chat: bool) -> str:
    """The store key of one item: the layout and the template only where they differ from the suite's first form,
    so items scored before layouts existed keep their keys."""
    form = "" if (layout == "last" and not chat) else f"{layout}{'+chat' if chat else ''}/"
    return f"{length:06d}/{task}/{form}{index:04d}"


def suite_items(builder: SuiteBuilder, tasks: list[str], length: int, samples: int, layouts: list[str],
                chats: list[bool]) -> list[Item]:
    """Every (task, layout, template, index) item, in a stable order, labelled with its task, layout and template."""
    items = []
    for task in tasks:
        for layout in layouts:
            for chat in chats:
                for i in range(samples):
                    s = builder.sample(task, length, i, layout=layout, chat=chat)
                    items.append(Item(item_key(length, task, i, layout, chat), list(s.ids), s.max_new_tokens,
                                      lambda text, s=s: score_sample(s, text),
                                      labels={"task": task, "layout": layout, "chat": "on" if chat else "off"},
                                      haystack=s.meta.get("haystack", "text")))
    return items


def largest_shared(evaluation: list[Item], calibration: list[Item]) -> float:
    """The largest share of an evaluation prompt's 16-token runs found in any calibration prompt (harness/evaluation/
    overlap.py), over prompts whose haystack is drawn from a text pool; the tasks' shared instruction and answer
    templates alone are a few percent."""
    cal = [it for it in calibration if it.haystack in TEXT_HAYSTACKS]
    ev = [it for it in evaluation if it.haystack in TEXT_HAYSTACKS and len(it.ids) >= NGRAM]
    if not cal or not ev:
        return 0.0
    pool = np.unique(np.concatenate([ngram_hashes(torch.tensor(it.ids)).ravel() for it in cal]))
    return max(float(np.isin(ngram_hashes(torch.tensor(it.ids)), pool).mean()) for it in ev)


def parse_spans(text: str | None) -> list[tuple[int, int]]:
    """"0:64,192:64" -> [(0, 64), (192, 64)]: (head H, tail W) pairs for local attention rows."""
    if not text:
        return []
    out = []
    for part in comma_items(text):
        head, sep, tail = part.partition(":")
        if not sep or not head.strip().isdecimal() or not tail.strip().isdecimal():
            raise UserError(f"--spans takes H:W pairs of whole numbers of tokens (head:tail), e.g. 0:64,192:64; "
                            f"got {part!r}")
        out.append((int(head), int(tail)))
    if len(set(out)) != len(out):
        raise UserError(f"--spans names a pair twice: {text!r}")
    return out


def span_label(head: int, tail: int) -> str:
    return f"[head={head}+tail={tail}]"


def span_rows(rows: list[Row], spans: list[tuple[int, int]]) -> list[Row]:
    """For every local attention row (its own spans), one row per (H, W) pair with those global spans instead; a pair
    equal to the row's own spans is the row itself and is not repeated."""
    out = []
    for r in rows:
        if r.plan.attention is None or r.variant is not None or r.method.startswith("preset:"):
            continue
        for head, tail in spans:
            cfg = dataclasses.replace(r.plan.attention, head=head, tail=tail)
            if cfg == r.plan.attention:
                continue
            label = span_label(head, tail)
            out.append(Row(f"{r.name} {label}", f"{r.method}{label}", r.level,
                           dataclasses.replace(r.plan, attention=cfg), variant=label))
    return out
