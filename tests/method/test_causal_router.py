"""Causal decoding with the router (issue 58): a token is updated by a selection layer when its router score reaches
the layer's fitted threshold, in prefill and decoding alike. Teacher-forced decisions equal decode-time decisions,
a threshold of minus infinity is the dense model, skipped layers read none of their skipped weights at batch 1,
compacted batches equal single rows, thresholds fit deterministically, and plans without thresholds load unchanged."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import ids_for, left_pad, tiny_model
from orthorank.errors import UserError
from orthorank.harness.search.thresholds import causal_plan, fit_thresholds, held_out_shares
from orthorank.method import SelectionConfig
from orthorank.method.apply import apply_plan, restore_dense, selective
from orthorank.method.plan import Plan
from orthorank.method.router import random_router
from orthorank.models.static_decode import cache_kwarg

SIG = {"model_type": "llama", "num_layers": 4, "hidden_size": 64, "vocab_size": 128}
LAYERS = [1, 2]


def _router_plan(ratio: float = 0.5, seed: int = 4) -> Plan:
    return Plan("orthorank", LAYERS, "tiny", SIG,
                selection=SelectionConfig(ratio=ratio, policy="router", fitted=random_router(LAYERS, 64, seed=seed)))


def _median_thresholds(m, plan: Plan, ids: torch.Tensor) -> Plan:
    """Thresholds at about half the tokens of `ids` (a fit on the test's own text)."""
    out, _ = fit_thresholds(m, plan, ids, batch_size=2)
    return out


def _decisions(m, layers) -> dict[int, list[bool]]:
    return {i: selective(m.model.layers[i]).last_keep for i in layers}


def test_a_threshold_of_minus_infinity_is_the_dense_model():
    m = tiny_model()
    ids = ids_for(2, 20, seed=3)
    dense = m(ids).logits
    apply_plan(m, causal_plan(_router_plan(), {i: -math.inf for i in LAYERS}))
    out = m(ids).logits
    restore_dense(m)
    assert torch.allclose(out, dense, atol=1e-5)


def test_teacher_forced_decisions_equal_decode_time_decisions_token_by_token():
    m = tiny_model()
    plan = _median_thresholds(m, _router_plan(), ids_for(8, 24, seed=9))
    prompt = ids_for(1, 10, seed=5)
    apply_plan(m, plan)
    out = m.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, min_new_tokens=12)
    steps = {i: [] for i in LAYERS}

    # decode again step by step through the cache, recording each new token's decision per layer
    from transformers import DynamicCache

    cache = DynamicCache()
    kw = cache_kwarg(m)
    logits = m(prompt, **{kw: cache}, use_cache=True).logits
    prefill = _decisions(m, LAYERS)
    for t in range(prompt.shape[1], out.shape[1]):
        logits = m(out[:, t:t + 1], **{kw: cache}, use_cache=True).logits
        for i in LAYERS:
            keep = selective(m.model.layers[i]).last_keep
            steps[i].append(bool(keep[0, 0]) if keep is not None else True)
    teacher = m(out, use_cache=False).logits
    forced = _decisions(m, LAYERS)
    restore_dense(m)
    for i in LAYERS:
        assert forced[i][0, :prompt.shape[1]].tolist() == prefill[i][0].tolist()
        assert forced[i][0, prompt.shape[1]:].tolist() == steps[i]
    assert 0 < sum(sum(s) for s in steps.values()) < 2 * len(steps[1])  # some tokens skipped, some updated
    assert torch.allclose(teacher[:, -1], logits[:, -1], atol=1e-4)  # and the last step's logits agree


def test_a_skipped_layer_reads_none_of_its_skipped_weights_at_batch_one():
    m = tiny_model()
    thresholds = {1: math.inf, 2: -math.inf}  # layer 1 skips every token, layer 2 updates every token
    apply_plan(m, causal_plan(_router_plan(), thresholds))
    calls = {name: 0 for name in ("q", "k", "v", "o", "mlp")}
    hooks = []
    for name, mod in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
        hooks.append(getattr(m.model.layers[1].self_attn, mod).register_forward_hook(
            lambda *a, name=name: calls.__setitem__(name, calls[name] + 1)))
    hooks.append(m.model.layers[1].mlp.register_forward_hook(lambda *a: calls.__setitem__("mlp", calls["mlp"] + 1)))
    m.generate(ids_for(1, 8, seed=2), max_new_tokens=5, do_sample=False, pad_token_id=0, min_new_tokens=5)
    for h in hooks:
        h.remove()
    restore_dense(m)
    assert calls["k"] == calls["v"] == 5  # the prefill and every decode step write the cache
    assert calls["q"] == calls["o"] == calls["mlp"] == 0


def test_compacted_batches_and_left_padding_equal_single_rows():
    m = tiny_model()
    plan = _median_thresholds(m, _router_plan(), ids_for(8, 24, seed=9))
    apply_plan(m, plan)
    rows = [ids_for(1, 14, seed=3)[0].tolist(), ids_for(1, 9, seed=4)[0].tolist(), ids_for(1, 6, seed=6)[0].tolist()]
    ids, mask = left_pad(rows)
    batched = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                         min_new_tokens=6)
    for b, r in enumerate(rows):
        single = m.generate(torch.tensor([r]), max_new_tokens=6, do_sample=False, pad_token_id=0, min_new_tokens=6)
        assert batched[b, -6:].tolist() == single[0, -6:].tolist(), b
    restore_dense(m)


def test_fitting_thresholds_twice_gives_identical_plans_and_the_shares_asked_for():
    m = tiny_model()
    windows = ids_for(8, 32, seed=11)
    a, report = fit_thresholds(m, _router_plan(0.4), windows, batch_size=2)
    b, _ = fit_thresholds(m, _router_plan(0.4), windows, batch_size=2)
    assert a.content_hash() == b.content_hash() and a.selection.fitted.causal
    assert a.selection.decode == "causal"
    # on the windows it was fitted on, each layer updates its keep ratio of the tokens (to one token)
    shares = held_out_shares(m, a, windows[:6], batch_size=2)
    for i in LAYERS:
        assert abs(shares[i] - 0.4) <= 1 / (6 * 32) + 1e-9, (i, shares[i])
    assert set(report["held_out_shares"]) == {"1", "2"}


def test_plans_without_thresholds_load_unchanged_and_causal_decoding_needs_them(tmp_path):
    plan = _router_plan()
    path = plan.save(tmp_path / "router.json")
    back = Plan.load(path)
    assert back.content_hash() == plan.content_hash() and "threshold" not in path.read_text()
    with pytest.raises(UserError, match="threshold"):
        dataclasses.replace(plan.selection, decode="causal")
    with pytest.raises(UserError, match="router policy"):
        SelectionConfig(decode="causal")
    causal = causal_plan(plan, {1: 0.5, 2: -0.25})
    again = Plan.load(causal.save(tmp_path / "causal.json"))
    assert again.selection.fitted.layer(1).threshold == 0.5 and again.content_hash() == causal.content_hash()


def test_own_decode_puts_each_plan_under_the_policy_it_was_saved_with_and_refuses_before_loading(tmp_path):
    """longctx/longbench --decode-modes own: a top-K router plan decodes densely, a causal one causally, in one
    run; asking for causal decoding of a plan without thresholds fails before the model loads."""
    from orthorank.harness.api.longctx import _check_saved_plans, plan_decodes
    from orthorank.harness.api.options import LongctxOptions

    top_k = _router_plan()
    causal = causal_plan(_router_plan(), {i: 0.0 for i in LAYERS})
    assert plan_decodes(top_k, ["own"]) == ["dense"]
    assert plan_decodes(causal, ["dense", "own"]) == ["dense", "causal"]
    assert plan_decodes(causal, ["causal", "own"]) == ["causal"]
    top_k.save(tmp_path / "router-0.2.json")
    causal.save(tmp_path / "router-causal-0.2.json")
    opts = LongctxOptions(model="smollm2-135m", methods="dense,router,router-causal", plans_dir=str(tmp_path),
                          decode_modes="own", out=str(tmp_path / "out"))
    _check_saved_plans(opts)  # nothing loads a model here
    with pytest.raises(UserError, match="causal decoding needs a threshold"):
        _check_saved_plans(dataclasses.replace(opts, decode_modes="causal"))
    with pytest.raises(UserError, match="unknown decode policy 'mine'; choose from dense, threshold, causal, own"):
        _check_saved_plans(dataclasses.replace(opts, decode_modes="mine"))


def test_compiled_static_cache_decoding_of_a_causal_plan_equals_eager_generation():
    """The batch-1 decision is host arithmetic (numpy), kept out of torch.compile's graph: the compiled step runs
    and generates what transformers' eager generate does."""
    from orthorank.models.static_decode import StaticDecoder, compile_available

    m = tiny_model()
    apply_plan(m, _median_thresholds(m, _router_plan(), ids_for(8, 24, seed=9)))
    prompt = ids_for(1, 10, seed=5)
    eager = m.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, min_new_tokens=12)[:, 10:]
    assert torch.equal(StaticDecoder(m, 1, 64, "static").greedy(prompt, 12), eager)
    if compile_available(prompt.device) is not None:
        pytest.skip("torch.compile cannot run here")
    torch._dynamo.reset()
    assert torch.equal(StaticDecoder(m, 1, 64, "compile").greedy(prompt, 12), eager)
