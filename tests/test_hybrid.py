"""Hybrid plans: per-layer removal and token selection at per-layer ratios, the measured cost table, the greedy
search under a speed-up target, and their errors."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from conftest import tiny_model
from orthorank.baselines.search import StackRunner
from orthorank.errors import UserError
from orthorank.method import Plan, SelectionConfig, apply_orthorank, apply_plan, prune_layers, restore_dense
from orthorank.method.apply import selective
from orthorank.method.cost import Arch, compute_sparsity

SIG = {"model_type": "llama", "num_layers": 6, "hidden_size": 64, "vocab_size": 128}


def hybrid(actions, **kw) -> Plan:
    return Plan("hybrid", [], "tiny", dict(SIG), actions=actions, **kw)


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def smaller_model(model, kept: list[int]):
    """The naive reference: a genuinely smaller model holding only the kept layers' weights, renumbered."""
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = len(kept)
    if isinstance(getattr(cfg, "layer_types", None), list):  # sliding / full attention per layer (Gemma 2)
        cfg.layer_types = [cfg.layer_types[i] for i in kept]
    small = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    state = {}
    for k, v in model.state_dict().items():
        parts = k.split(".")
        if k.startswith("model.layers."):
            i = int(parts[2])
            if i not in kept:
                continue
            parts[2] = str(kept.index(i))
        state[".".join(parts)] = v
    small.load_state_dict(state)
    return small


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 20), generator=torch.Generator().manual_seed(1))


# -- plans ---------------------------------------------------------------------------------------------------------


def test_hybrid_plan_round_trip_and_hash(tmp_path):
    plan = hybrid({4: "remove", 1: 0.5, 2: 0.25}, selection=SelectionConfig(criterion="cos"),
                  provenance={"search": "hybrid", "target_speedup": 1.2})
    assert plan.layers == [1, 2, 4] and plan.removed_layers == [4]
    assert {i: c.ratio for i, c in plan.selection_layers.items()} == {1: 0.5, 2: 0.25}
    assert all(c.criterion == "cos" for c in plan.selection_layers.values())
    assert plan.label() == "hybrid@1.2x"
    back = Plan.load(plan.save(tmp_path / "h.json"))
    assert back.actions == plan.actions and back.content_hash() == plan.content_hash()
    assert back.selection == plan.selection and back.method == "hybrid"
    assert json.loads((tmp_path / "h.json").read_text())["actions"] == {"1": 0.5, "2": 0.25, "4": "remove"}
    # the hash covers the actions, not just the changed layers
    assert hybrid({4: "remove", 1: 0.5, 2: 0.33}).content_hash() != hybrid({4: "remove", 1: 0.5, 2: 0.25}).content_hash()
    assert hybrid({4: 0.5, 1: 0.5, 2: 0.25}).content_hash() != hybrid({4: "remove", 1: 0.5, 2: 0.25}).content_hash()
    # other plans keep the hash they had before hybrid plans existed (the result store's keys)
    old = Plan("prune", [2, 3], "tiny", dict(SIG))
    assert "actions" not in old.to_dict() and old.content_hash() == "b03ef019e893d407"
    assert Plan("orthorank", [2, 3], "tiny", dict(SIG)).content_hash() == "0dcb4ae994e1d832"


def test_hybrid_plan_sparsity_measures():
    arch = Arch(num_layers=6, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=128)
    only_removal = hybrid({2: "remove", 3: "remove"})
    assert only_removal.nominal_sparsity == pytest.approx(2 / 6)
    assert only_removal.compute_sparsity(arch, 64) == pytest.approx(compute_sparsity(arch, 64, "prune", 2))
    only_sel = hybrid({2: 0.33, 3: 0.33})
    assert only_sel.compute_sparsity(arch, 64) == pytest.approx(compute_sparsity(arch, 64, "orthorank", 2, 0.33))
    assert only_sel.nominal_sparsity == pytest.approx(2 / 6 * 0.67)
    mixed = hybrid({1: "remove", 2: 0.5})
    assert mixed.nominal_sparsity == pytest.approx((1 + 0.5) / 6)
    assert 0 < mixed.compute_sparsity(arch, 64) < compute_sparsity(arch, 64, "prune", 2)


@pytest.mark.parametrize("actions, fragment", [
    ({}, "needs per-layer actions"),
    (None, "needs per-layer actions"),
    ({1: 1.0}, "ratio in (0, 1)"),
    ({1: 0.0}, "ratio in (0, 1)"),
    ({1: "drop"}, "ratio in (0, 1)"),
    ({1: True}, "ratio in (0, 1)"),
    ({"x": 0.5}, "integers"),
    ({9: 0.5}, "out of range"),
    ({i: "remove" for i in range(6)}, "every layer"),
])
def test_hybrid_plan_errors(actions, fragment):
    with pytest.raises(UserError, match=None) as exc:
        hybrid(actions)
    assert fragment in str(exc.value)


def test_actions_only_in_hybrid_plans(tmp_path):
    with pytest.raises(UserError, match="hybrid"):
        Plan("orthorank", [1], "tiny", dict(SIG), actions={1: 0.5})
    bad = hybrid({1: 0.5}).to_dict()
    bad["actions"] = {"1": "sideways"}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(UserError, match="ratio in"):
        Plan.load(tmp_path / "bad.json")


# -- applying a hybrid plan equals the naive composition ------------------------------------------------------------


def test_hybrid_only_removal_equals_prune_layers(ids):
    m = tiny_model(layers=6)
    prune_layers(m, [2, 4])
    ref = logits(m, ids)
    restore_dense(m)
    apply_plan(m, hybrid({2: "remove", 4: "remove"}))
    assert torch.equal(logits(m, ids), ref)
    assert len(m.model.layers) == 4 and m.config.num_hidden_layers == 4


def test_hybrid_only_selection_equals_apply_orthorank(ids):
    m = tiny_model(layers=6)
    sel = SelectionConfig(ratio=0.33)
    apply_orthorank(m, [1, 3, 4], sel)
    ref = logits(m, ids)
    restore_dense(m)
    apply_plan(m, hybrid({1: 0.33, 3: 0.33, 4: 0.33}))
    assert torch.equal(logits(m, ids), ref)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
def test_mixed_hybrid_equals_removal_then_selection(ids, family):
    """Remove layers 1 and 3, select in original layers 2 and 4 (new positions 1 and 2 of the smaller model)."""
    attn = "eager" if family == "gemma2" else "sdpa"  # Gemma 2 refuses SDPA itself
    m = tiny_model(family, layers=6, attn=attn)
    dense = logits(m, ids)
    sel = SelectionConfig(ratio=0.4)
    plan = Plan("hybrid", [], "tiny", dict(SIG, model_type=m.config.model_type), actions={
        1: "remove", 3: "remove", 2: 0.4, 4: 0.4})
    apply_plan(m, plan)
    out = logits(m, ids)
    kept = [0, 2, 4, 5]
    small = smaller_model(tiny_model(family, layers=6, attn=attn), kept)
    apply_orthorank(small, [kept.index(2), kept.index(4)], sel)
    assert torch.allclose(out, logits(small, ids), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, dense, atol=1e-3)
    # the selection layers are the right instances, with their original indices
    assert [selective(layer) is not None for layer in m.model.layers] == [False, True, True, False]
    assert [selective(layer).layer_index for layer in m.model.layers if selective(layer)] == [2, 4]
    assert [layer.self_attn.layer_idx for layer in m.model.layers] == [0, 1, 2, 3]
    restore_dense(m)
    assert torch.equal(logits(m, ids), dense)
    assert [layer.self_attn.layer_idx for layer in m.model.layers] == list(range(6))


def test_hybrid_per_layer_ratios_equal_the_search_runner(ids):
    """Per-layer ratios: the full model with the plan applied gives the calibration loss the search's StackRunner
    computes for the same configuration (so a searched plan is the plan that was scored)."""
    m = tiny_model(layers=6)
    base = SelectionConfig()
    actions = {1: 0.5, 2: "remove", 3: 0.25, 4: 0.75}
    runner = StackRunner(m, ids, batch_size=2)
    config = {i: None if a == "remove" else runner.wrap(i, SelectionConfig(ratio=a)) for i, a in actions.items()}
    runner.cache({})
    search_loss = runner.loss_with(config, 0)
    apply_plan(m, hybrid(actions, selection=base))
    assert {selective(layer).layer_index: selective(layer).config.ratio
            for layer in m.model.layers if selective(layer)} == {1: 0.5, 3: 0.25, 4: 0.75}
    out = logits(m, ids)[:, :-1]
    loss = float(F.cross_entropy(out.reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1)))
    assert math.isclose(search_loss, loss, rel_tol=1e-5)


def test_hybrid_generation_with_cache_equals_smaller_model(ids):
    """The KV cache is indexed by the renumbered layers: cached greedy decoding under a hybrid plan equals the
    smaller model's with selection at the new positions."""
    m = tiny_model(layers=6)
    apply_plan(m, hybrid({0: 0.5, 2: "remove", 3: 0.5}))
    prompt = ids[:1, :12]
    out = m.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    kept = [0, 1, 3, 4, 5]
    small = smaller_model(tiny_model(layers=6), kept)
    apply_orthorank(small, [0, kept.index(3)], SelectionConfig(ratio=0.5))
    ref = small.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(out, ref)


def test_apply_hybrid_errors():
    from orthorank.method.apply import apply_hybrid

    m = tiny_model(layers=4)
    with pytest.raises(UserError, match="both removed and selective"):
        apply_hybrid(m, [1], {1: SelectionConfig()})
    with pytest.raises(UserError, match="out of range"):
        apply_hybrid(m, [7], {})
    with pytest.raises(UserError, match="every layer"):
        apply_hybrid(m, [0, 1, 2, 3], {})
    assert len(m.model.layers) == 4
