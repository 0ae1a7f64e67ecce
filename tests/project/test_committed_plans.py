"""The committed plans load and give the perplexities they gave when this file's record was written, so a refactor
that moves code keeps every committed result's numbers (issue 56). One fixed text, float32, every plan under
plans/<model>/ and studies/long-prompt/plans/<model>/ on both shipped models.

A change that is meant to change numbers rewrites the record, and says so in its commit:
    ORTHORANK_WRITE_PLAN_RECORD=1 .venv/bin/python -m pytest tests/project/test_committed_plans.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).with_name("committed_plans_ppl.json")
MODELS = ("smollm2-135m", "gemma3-270m")
TEXT = ("The first token of a sequence is an attention sink: its normalized hidden state barely changes across "
        "layers, and the other tokens drift towards it as depth grows. A selection layer updates only the tokens "
        "most orthogonal to the sink and lets the others pass unchanged, while their keys and values still reach "
        "every selected query. Layer pruning removes whole layers instead. Which one costs less perplexity at the "
        "same compute depends on the model and on the text it reads, so the comparison has to be measured on "
        "windows that no search or fit has seen, with paired intervals, before anyone calls it a win. ") * 3
SEQ_LEN = 256


def _plans(model: str) -> list[Path]:
    return sorted((ROOT / "plans" / model).glob("*.json")) + \
        sorted((ROOT / "studies" / "long-prompt" / "plans" / model).glob("*.json"))


def _perplexities(model: str) -> dict[str, float]:
    import torch

    from orthorank.harness.evaluation.perplexity import perplexity
    from orthorank.method import Plan, apply_plan, restore_dense
    from orthorank.models import load_model

    torch.manual_seed(0)
    lm = load_model(model, device="cpu", dtype="float32")
    ids = lm.tokenizer(TEXT, return_tensors="pt").input_ids[:, :SEQ_LEN]
    assert ids.shape[1] == SEQ_LEN
    out = {"dense": perplexity(lm.model, ids).perplexity}
    for path in _plans(model):
        apply_plan(lm.model, Plan.load(path))
        try:
            out[str(path.relative_to(ROOT))] = perplexity(lm.model, ids).perplexity
        finally:
            restore_dense(lm.model)
    return out


@pytest.mark.parametrize("model", MODELS)
def test_the_committed_plans_give_their_recorded_perplexities(model):
    got = _perplexities(model)
    if os.environ.get("ORTHORANK_WRITE_PLAN_RECORD"):
        record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
        record[model] = got
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    want = json.loads(RECORD.read_text())[model]
    assert sorted(got) == sorted(want), "the committed plans changed: rewrite the record (see the docstring)"
    off = {k: (got[k], want[k]) for k in want if abs(got[k] - want[k]) > 1e-5 * abs(want[k])}
    assert not off, f"perplexities moved: {off}"
