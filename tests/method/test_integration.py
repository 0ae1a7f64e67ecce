"""A few checks on the real embedded model (SmolLM2-135M-Instruct) on small slices of WikiText-2."""

from __future__ import annotations

import math

import pytest
import torch

from orthorank.harness.evaluation.data import load_eval_text
from orthorank.harness.evaluation.perplexity import make_windows, perplexity, tokenize_text
from orthorank.method import SelectionConfig, apply_orthorank, restore_dense

pytestmark = [pytest.mark.integration, pytest.mark.data]


@pytest.fixture(scope="module")
def embedded():
    from orthorank.models import load_model

    lm = load_model("smollm2-135m", device="cpu")
    windows = make_windows(tokenize_text(lm.tokenizer, load_eval_text("wikitext2")), 256, 2)
    return lm, windows


def test_embedded_model_shape(embedded):
    lm, _ = embedded
    assert lm.num_layers == 30 and lm.config.hidden_size == 576 and lm.config.num_key_value_heads == 3


def test_dense_perplexity_finite_and_stable(embedded):
    lm, windows = embedded
    restore_dense(lm.model)
    a = perplexity(lm.model, windows).perplexity
    b = perplexity(lm.model, windows).perplexity
    assert math.isfinite(a) and 5 < a < 200
    assert a == b


def test_ratio_one_equals_dense_on_real_model(embedded):
    lm, windows = embedded
    restore_dense(lm.model)
    dense = lm.model(windows[:1]).logits
    apply_orthorank(lm.model, list(range(1, 29)), SelectionConfig(ratio=1.0))
    out = lm.model(windows[:1]).logits
    restore_dense(lm.model)
    assert torch.allclose(out, dense, atol=1e-3, rtol=1e-4), (out - dense).abs().max()


def test_orthorank_costs_some_perplexity(embedded):
    lm, windows = embedded
    restore_dense(lm.model)
    dense = perplexity(lm.model, windows).perplexity
    apply_orthorank(lm.model, [8, 12, 16], SelectionConfig())
    sel = perplexity(lm.model, windows).perplexity
    restore_dense(lm.model)
    assert math.isfinite(sel) and sel > dense


def test_committed_plan_keeps_the_models_own_behaviour(embedded):
    """The embedded model under its committed 20% plan: all 30 + 1 hidden states, unchanged state_dict keys,
    states before the first selection layer equal to the dense model's, and forward hooks firing."""
    from pathlib import Path

    from orthorank.method import Plan, apply_plan

    lm, _ = embedded
    model, tok = lm.model, lm.tokenizer
    ids = tok("The first token is an attention sink; the others drift towards it as depth grows.",
              return_tensors="pt").input_ids
    keys = list(model.state_dict())
    dense = model(ids, output_hidden_states=True).hidden_states
    plan = Plan.load(Path(__file__).resolve().parents[2] / "plans/smollm2-135m/orthorank-0.2.json")
    fired = []
    handle = model.model.layers[plan.layers[0]].register_forward_hook(lambda *a: fired.append(1))
    try:
        apply_plan(model, plan)
        out = model(ids, output_hidden_states=True).hidden_states
        assert len(out) == 31 and list(model.state_dict()) == keys and fired == [1]
        first = min(plan.layers)
        for i in range(first + 1):
            torch.testing.assert_close(out[i], dense[i])
        assert not torch.allclose(out[-1], dense[-1])
    finally:
        handle.remove()
        restore_dense(model)
