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
from orthorank.harness.search.layer_search import StackRunner
from orthorank.errors import UserError
from orthorank.method import Plan, SelectionConfig, apply_orthorank, apply_plan, prune_layers, restore_dense
from orthorank.method.apply import selective
from orthorank.method.cost import Arch, removal_sparsity, selection_sparsity

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
    assert only_removal.compute_sparsity(arch, 64) == pytest.approx(removal_sparsity(arch, 64, 2))
    only_sel = hybrid({2: 0.33, 3: 0.33})
    assert only_sel.compute_sparsity(arch, 64) == pytest.approx(selection_sparsity(arch, 64, 2, 0.33))
    assert only_sel.nominal_sparsity == pytest.approx(2 / 6 * 0.67)
    mixed = hybrid({1: "remove", 2: 0.5})
    assert mixed.nominal_sparsity == pytest.approx((1 + 0.5) / 6)
    assert 0 < mixed.compute_sparsity(arch, 64) < removal_sparsity(arch, 64, 2)


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


# -- cost table -----------------------------------------------------------------------------------------------------

from orthorank.harness.search.hybrid import check_targets, hybrid_search, moves_from  # noqa: E402
from orthorank.harness.runtime.cost_table import CostTable, device_description  # noqa: E402
from orthorank.method.plan import REMOVE  # noqa: E402

SIG8 = dict(SIG, num_layers=8)
CPU = {"type": "cpu", "name": "test cpu", "threads": 1}


def table(fractions=None, dense=1.0, rest=0.5, sig=SIG8, device=CPU, model="tiny") -> CostTable:
    return CostTable(model, dict(sig), dict(device), "float32", 1, 32, dense, rest,
                     fractions or {"0.25": 0.4, "0.33": 0.5, "0.5": 0.7})


def test_cost_table_predictions():
    t = table()
    assert t.predicted_speedup({}) == 1.0
    assert t.predicted_speedup({1: REMOVE}) == pytest.approx(8.5 / 7.5)
    assert t.predicted_speedup({1: 0.33, 2: REMOVE}) == pytest.approx(8.5 / (6 + 0.5 + 0.5))
    assert t.max_speedup(list(range(1, 7))) == pytest.approx(8.5 / 2.5)
    plan = Plan("orthorank", [1, 2], "tiny", dict(SIG8), selection=SelectionConfig(ratio=0.33))
    assert t.plan_speedup(plan) == pytest.approx(8.5 / 7.5)
    assert t.plan_speedup(Plan("prune", [3], "tiny", dict(SIG8))) == pytest.approx(8.5 / 7.5)
    with pytest.raises(UserError, match="no selective-layer cost at ratio 0.4"):
        t.layer_cost(0.4)


def test_cost_table_cli_round_trip(tmp_path, capsys):
    from cli_helpers import run_cli

    out = tmp_path / "costs.json"
    code, text, err = run_cli(capsys, "bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--device", "cpu",
                              "--seq-len", "32", "--threads", "1", "--warmup", "1", "--repeats", "3",
                              "--ratios", "0.5,0.25", "--cost-layers", "1,2", "--cost-table", out)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["format"] == "orthorank-cost-table/1" and data["model"] == "smollm2-135m-shape"
    assert data["signature"]["num_layers"] == 4 and data["device"] == {**device_description("cpu"), "threads": 1}
    assert data["dtype"] == "float32" and data["batch"] == 1 and data["seq_len"] == 32
    assert set(data["costs"]["selective_fraction"]) == {"0.25", "0.5"}
    assert data["measurements"]["layers_measured"] == [1, 2] and "same shape" in data["measurements"]["note"]
    layer = data["measurements"]["per_layer"]["1"]
    assert len(layer["dense_layer"]["times_s"]) == 3 and layer["selective"]["0.5"]["fraction_per_round"]["min_s"] > 0
    assert data["measurements"]["dense_model"]["predicted_over_measured"] > 0
    assert {"torch", "transformers", "git_commit", "device_name"} <= set(data["environment"])
    t = CostTable.load(out)
    assert t.ratios == [0.25, 0.5] and t.dense_layer_s > 0 and t.rest_s > 0
    assert "selective layer at ratio 0.25" in text
    # refuses to overwrite, and bad ratios are one-line errors
    from cli_helpers import assert_user_error

    assert_user_error(capsys, "exists", "bench", "--model", "smollm2-135m-shape", "--num-layers", "2",
                      "--cost-table", out)
    assert_user_error(capsys, "(0, 1)", "bench", "--model", "smollm2-135m-shape", "--num-layers", "2",
                      "--ratios", "1.5", "--cost-table", tmp_path / "x.json")


@pytest.mark.parametrize("body, fragment", [
    (None, "does not exist"),
    ("{not json", "not valid JSON"),
    (json.dumps({"format": "something else"}), "not an orthorank cost table"),
    (json.dumps({"format": "orthorank-cost-table/1", "model": "tiny"}), "malformed"),
    ("neg", "malformed"),
])
def test_cost_table_file_errors(tmp_path, body, fragment):
    path = tmp_path / "t.json"
    if body == "neg":
        d = table().to_dict()
        d["costs"]["dense_layer_s"] = -1.0
        body = json.dumps(d)
    if body is not None:
        path.write_text(body)
    with pytest.raises(UserError) as exc:
        CostTable.load(path)
    assert fragment in str(exc.value)


def test_cost_table_model_and_device_checks():
    t = table()
    t.check_model("tiny", dict(SIG8))
    t.check_device(dict(CPU))
    with pytest.raises(UserError, match="measured for model 'tiny'"):
        t.check_model("other", dict(SIG8))
    with pytest.raises(UserError, match="measured for model"):
        t.check_model("tiny", dict(SIG8, num_layers=6))
    with pytest.raises(UserError, match="measured on cpu 'test cpu', 1 thread"):
        t.check_device(dict(CPU, threads=2))
    with pytest.raises(UserError, match="this run is on cuda 'NVIDIA H200'"):
        t.check_device({"type": "cuda", "name": "NVIDIA H200"})


# -- search ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def calib():
    m = tiny_model(layers=8, seed=3)
    windows = torch.randint(3, 128, (8, 32), generator=torch.Generator().manual_seed(3))
    return m, windows


def full_model_loss(m, plan, windows):
    apply_plan(m, plan)
    try:
        out = logits(m, windows)[:, :-1]
        return float(F.cross_entropy(out.reshape(-1, out.shape[-1]), windows[:, 1:].reshape(-1)))
    finally:
        restore_dense(m)


def test_moves_respect_the_cost_table():
    t = table({"0.25": 0.4, "0.33": 0.5, "0.5": 1.2})  # ratio 0.5 measured slower than dense: never a move
    moves = moves_from({1: 0.33, 2: REMOVE}, [1, 2, 3], [0.25, 0.33, 0.5], t)
    assert moves == [(1, REMOVE), (1, 0.25), (3, REMOVE), (3, 0.25), (3, 0.33)]
    t2 = table({"0.25": 0.6, "0.33": 0.5})  # 0.25 no cheaper than 0.33 here: 0.33 -> 0.25 is no move
    assert (1, 0.25) not in moves_from({1: 0.33}, [1], [0.25, 0.33], t2)


def test_search_reaches_targets_and_follows_its_rule(calib):
    m, windows = calib
    t = table()
    targets = [1.15, 1.4]
    result = hybrid_search(StackRunner(m, windows, 2), t, targets, [0.25, 0.33, 0.5], list(range(1, 7)),
                           progress=False)
    assert set(result.plans) == set(targets)
    for target in targets:
        actions = result.plans[target]
        n = result.reached[target]
        assert t.predicted_speedup(actions) >= target
        assert result.steps[n - 1].speedup == pytest.approx(t.predicted_speedup(actions))
        if n > 1:  # it stopped at the first step that reached the target
            assert result.steps[n - 2].speedup < target
        assert all(1 <= i <= 6 for i in actions)  # first and last layer untouched
    # plans are nested: the second target continues from the first
    small, big = result.plans[1.15], result.plans[1.4]
    assert all(i in big for i in small)
    # each step's loss is the loss of the full model with the plan applied (search = what is applied)
    for n in (result.reached[1.15], result.reached[1.4]):
        actions = {}
        for s in result.steps[:n]:
            actions[s.layer] = s.after
        plan = Plan("hybrid", [], "tiny", dict(SIG8), actions=actions)
        assert math.isclose(full_model_loss(m, plan, windows), result.steps[n - 1].loss, rel_tol=1e-5)
    # step 1 by brute force: the lowest loss increase per share of time saved (or, where moves reach the target,
    # the lowest-loss move among those, if it costs no more than the best-rate move)
    dense = full_model_loss(m, Plan("dense", [], "tiny", dict(SIG8)), windows)
    rates, losses = {}, {}
    for move in moves_from({}, list(range(1, 7)), [0.25, 0.33, 0.5], t):
        plan = Plan("hybrid", [], "tiny", dict(SIG8), actions={move[0]: move[1]})
        losses[move] = full_model_loss(m, plan, windows)
        saved = (t.layer_cost(None) - t.layer_cost(move[1])) / t.model_cost({})
        rates[move] = (losses[move] - dense) / saved
    first = (result.steps[0].layer, result.steps[0].after)
    if not result.steps[0].finishing:
        assert rates[first] == pytest.approx(min(rates.values()), abs=1e-6)
    else:
        reach = [mv for mv in losses if t.predicted_speedup({mv[0]: mv[1]}) >= 1.15]
        assert losses[first] == pytest.approx(min(losses[mv] for mv in reach), abs=1e-6)


def test_search_savings_come_from_the_cost_table(calib):
    """Every step's saving is the table's cost of the layer before minus after, over the dense model's cost; a
    ratio the search is not given never appears."""
    m, windows = calib
    t = table({"0.25": 0.3, "0.5": 0.9})
    res = hybrid_search(StackRunner(m, windows, 4), t, [1.3], [0.5], list(range(1, 7)), progress=False)
    assert set(res.plans[1.3].values()) <= {REMOVE, 0.5}
    for s in res.steps:
        assert s.saved == pytest.approx((t.layer_cost(s.before) - t.layer_cost(s.after)) / t.model_cost({}))


@pytest.mark.parametrize("seed", [0, 1])
def test_screened_search_equals_exhaustive_on_tiny_models(seed):
    m = tiny_model(layers=8, seed=seed)
    windows = torch.randint(3, 128, (8, 32), generator=torch.Generator().manual_seed(seed))
    t = table()
    full = hybrid_search(StackRunner(m, windows, 1), t, [1.3], [0.25, 0.5], list(range(1, 7)), progress=False)
    fast = hybrid_search(StackRunner(m, windows, 1), t, [1.3], [0.25, 0.5], list(range(1, 7)), progress=False,
                         screen_batches=2, recheck=3)
    assert [(s.layer, s.after) for s in fast.steps] == [(s.layer, s.after) for s in full.steps]
    assert fast.plans == full.plans


def test_search_target_errors():
    t = table()
    inner = list(range(1, 7))
    with pytest.raises(UserError, match="above 1"):
        check_targets([1.0], t, inner)
    with pytest.raises(UserError, match="out of reach"):
        check_targets([3.5], t, inner)  # removing all 6 inner layers gives 8.5 / 2.5 = 3.4
    assert check_targets([3.4, 1.2, 1.2], t, inner) == [1.2, 3.4]


# -- the CLI end to end -------------------------------------------------------------------------------------------


def _calibrate(tiny_hf_folder, text, *extra):
    return ["calibrate", "--model", tiny_hf_folder, "--method", "hybrid", "--calib-data", text,
            "--calib-samples", "4", "--seq-len", "32", "--threads", "1", *extra]


def test_calibrate_hybrid_cli(tiny_hf_folder, tmp_path, capsys):
    from cli_helpers import assert_user_error, run_cli

    text = tmp_path / "calib.txt"
    text.write_text("Some calibration text about many different things. " * 200)
    costs = tmp_path / "costs.json"
    code, _, err = run_cli(capsys, "bench", "--model", tiny_hf_folder, "--device", "cpu", "--seq-len", "32",
                           "--threads", "1", "--repeats", "2", "--cost-table", costs)
    assert code == 0, err
    # a table whose selection is cheaper than dense at every ratio, so every kind of move is open
    data = json.loads(costs.read_text())
    data["costs"]["selective_fraction"] = {"0.25": 0.4, "0.33": 0.5, "0.5": 0.7}
    # and fixed layer / rest times: measured ones on a busy machine can put 1.3x out of reach of a 4-layer model
    data["costs"]["dense_layer_s"], data["costs"]["rest_s"] = 0.01, 0.002
    costs.write_text(json.dumps(data))
    t = CostTable.load(costs)
    code, out, err = run_cli(capsys, *_calibrate(tiny_hf_folder, text, "--cost-table", costs, "--target-speedup",
                                                 "1.1,1.3", "--out", tmp_path / "plans"))
    assert code == 0, err
    for target in (1.1, 1.3):
        plan = Plan.load(tmp_path / "plans" / f"hybrid-x{target:g}.json")
        assert plan.method == "hybrid" and plan.provenance["target_speedup"] == target
        assert t.plan_speedup(plan) >= target and plan.provenance["predicted_speedup"] >= target
        assert plan.provenance["cost_table"]["device"] == t.device and len(plan.provenance["steps"]) >= 1
        assert plan.label() == f"hybrid@{target:g}x"
    # --sparsity S targets the speed-up of removing ceil(S L) layers, named like other saved plans
    code, out, err = run_cli(capsys, *_calibrate(tiny_hf_folder, text, "--cost-table", costs, "--sparsity", "0.25",
                                                 "--ratios", "0.33", "--out", tmp_path / "plans"))
    assert code == 0, err
    plan = Plan.load(tmp_path / "plans" / "hybrid-0.25.json")
    assert plan.target_sparsity == 0.25 and t.plan_speedup(plan) >= t.predicted_speedup({1: REMOVE}) - 1e-9
    assert all(a in (REMOVE, 0.33) for a in plan.actions.values())
    # the plan runs through the other commands
    code, out, err = run_cli(capsys, "ppl", "--model", tiny_hf_folder, "--plan", tmp_path / "plans" / "hybrid-0.25.json",
                             "--dataset", text, "--seq-len", "32", "--max-windows", "2", "--threads", "1")
    assert code == 0, err
    # errors, each one line and exit status 2
    cal = lambda *a: _calibrate(tiny_hf_folder, text, *a)  # noqa: E731
    o = ["--json", tmp_path / "x.json"]
    assert_user_error(capsys, "needs --cost-table", *cal("--target-speedup", "1.2", *o))
    assert_user_error(capsys, "above 1", *cal("--cost-table", costs, "--target-speedup", "1.0", *o))
    assert_user_error(capsys, "above 1", *cal("--cost-table", costs, "--target-speedup", "0.8", *o))
    assert_user_error(capsys, "out of reach", *cal("--cost-table", costs, "--target-speedup", "9", *o))
    assert_user_error(capsys, "either --target-speedup", *cal("--cost-table", costs, *o))
    assert_user_error(capsys, "no selective-layer cost at ratio 0.4",
                      *cal("--cost-table", costs, "--target-speedup", "1.2", "--ratios", "0.4", *o))
    assert_user_error(capsys, "does not exist", *cal("--cost-table", tmp_path / "none.json", "--target-speedup", "1.2", *o))
    (tmp_path / "garbled.json").write_text("{\"format\": \"orthorank-cost-table/1\", \"costs\": 3}")
    assert_user_error(capsys, "malformed", *cal("--cost-table", tmp_path / "garbled.json", "--target-speedup", "1.2", *o))
    other = dict(data, model="another-model")
    (tmp_path / "other-model.json").write_text(json.dumps(other))
    assert_user_error(capsys, "measured for model 'another-model'",
                      *cal("--cost-table", tmp_path / "other-model.json", "--target-speedup", "1.2", *o))
    other = dict(data, device={"type": "cuda", "name": "NVIDIA H200"})
    (tmp_path / "other-device.json").write_text(json.dumps(other))
    assert_user_error(capsys, "measured on cuda 'NVIDIA H200'",
                      *cal("--cost-table", tmp_path / "other-device.json", "--target-speedup", "1.2", *o))
    assert_user_error(capsys, "1 thread(s), but this run is on cpu",  # --threads 2 after cal's --threads 1
                      *cal("--cost-table", costs, "--target-speedup", "1.2", "--threads", "2", *o))
    assert_user_error(capsys, "belong to --method hybrid",
                      "calibrate", "--model", tiny_hf_folder, "--method", "sleb", "--sparsity", "0.2",
                      "--cost-table", costs, *o)
    assert_user_error(capsys, "lists no hybrid method", "bench", "--model", tiny_hf_folder, "--methods", "dense,sleb",
                      "--plan", tmp_path / "plans" / "hybrid-0.25.json")


# -- measuring plans, the frontier plot, compare's references -------------------------------------------------------


def test_frontier_points_and_plot(tmp_path):
    """Rows timed in this run become frontier points (dense at 1x); rows without a measurement are left out."""
    import numpy as np

    from orthorank.harness.reports.frontier import plot_frontier
    from orthorank.harness.evaluation.compare import Row
    from orthorank.harness.reports.compare_tables import frontier_points

    rows = [Row("dense", 0.0, Plan("dense", [], "tiny", dict(SIG))), Row("sleb", 0.2, Plan("prune", [2], "tiny", dict(SIG))),
            Row("hybrid", 0.2, hybrid({1: "remove", 2: 0.25})), Row("orthorank", 0.2, Plan("orthorank", [2], "tiny", dict(SIG)))]
    for r, nll in zip(rows, (3.0, 4.0, 3.8, 3.9)):
        r.nll["wikitext2"], r.tokens["wikitext2"] = np.array([nll * 63, (nll + 0.1) * 63, (nll - 0.1) * 63]), 63
    rows[1].measured_speedup, rows[1].measured_range = 1.2, (1.1, 1.3)
    rows[2].measured_speedup, rows[2].measured_range = 1.24, (1.2, 1.3)
    pts = frontier_points(rows, ["wikitext2"])
    assert [(p.method, p.label, p.measured) for p in pts] == [("dense", "dense", 1.0), ("sleb", "0.2", 1.2),
                                                              ("hybrid", "0.2", 1.24)]
    assert pts[2].measured_range == (1.2, 1.3) and pts[0].ppl["wikitext2"][0] == pytest.approx(np.exp(3.0))
    assert plot_frontier(pts, ["wikitext2"], tmp_path / "f.png").stat().st_size > 1000


def test_compare_references_of_hybrid_rows():
    from orthorank.harness.evaluation.compare import Row, reference_rows

    rows = [Row("dense", 0.0, Plan("dense", [], "tiny", dict(SIG))),
            Row("sleb", 0.2, Plan("prune", [2], "tiny", dict(SIG))),
            Row("orthorank", 0.2, Plan("orthorank", [2], "tiny", dict(SIG))),
            Row("orthorank (random)", 0.2, Plan("orthorank", [2], "tiny", dict(SIG))),
            Row("sleb", 0.1, Plan("prune", [3], "tiny", dict(SIG))),
            Row("hybrid", 0.2, hybrid({2: "remove", 3: 0.33}))]
    assert [r.method for r in reference_rows(rows[-1], rows)] == ["sleb", "orthorank"]
    assert all(r.level == 0.2 for r in reference_rows(rows[-1], rows))


def test_registry_knows_hybrid():
    from orthorank.method.registry import METHODS, searched

    assert METHODS["hybrid"].plan_kind == "hybrid" and "hybrid" in searched()
    with pytest.raises(UserError, match="cost table"):
        METHODS["hybrid"].layer_count(0.2, 30, 0.33)


@pytest.mark.data
def test_compare_runs_saved_hybrid_plans(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    """`calibrate --method hybrid --sparsity S` saves plans/<model>/hybrid-<S>.json, which compare evaluates beside
    the pruning plan of the same level and compares with it on the same windows."""
    from cli_helpers import run_cli

    monkeypatch.chdir(tmp_path)
    text = tmp_path / "calib.txt"
    text.write_text("Some calibration text about many different things. " * 200)
    name = tiny_hf_folder.name
    costs = tmp_path / "costs.json"
    assert run_cli(capsys, "bench", "--model", tiny_hf_folder, "--device", "cpu", "--seq-len", "32", "--threads", "1",
                   "--repeats", "2", "--cost-table", costs)[0] == 0
    data = json.loads(costs.read_text())
    data["costs"]["selective_fraction"] = {"0.25": 0.4, "0.33": 0.5, "0.5": 0.7}
    # and fixed layer / rest times: measured ones on a busy machine can put 1.3x out of reach of a 4-layer model
    data["costs"]["dense_layer_s"], data["costs"]["rest_s"] = 0.01, 0.002
    costs.write_text(json.dumps(data))
    common = ["--model", tiny_hf_folder, "--calib-data", text, "--calib-samples", "4", "--seq-len", "32",
              "--threads", "1", "--sparsity", "0.25", "--out", f"plans/{name}"]
    assert run_cli(capsys, "calibrate", "--method", "sleb", *common)[0] == 0
    code, out, err = run_cli(capsys, "calibrate", "--method", "hybrid", "--cost-table", costs, *common)
    assert code == 0, err
    code, out, err = run_cli(capsys, "compare", "--model", tiny_hf_folder, "--methods", "dense,sleb,hybrid",
                             "--sparsity", "0.25", "--datasets", "wikitext2", "--seq-len", "64", "--max-windows", "3",
                             "--out", "out", "--store", "store", "--threads", "1", "--measure-speed", "2")
    assert code == 0, err
    assert "| hybrid | 0.25 |" in out
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert {(c["a"], c["b"]) for c in result["comparisons"]} >= {("hybrid", "sleb"), ("sleb", "dense")}
    # --measure-speed: every plan timed in this run, with the range of its per-repeat ratios, and the frontier
    timed = [r for r in result["rows"] if r["method"] != "dense"]
    assert all(r["sparsity"]["measured_at"] == "this run" and r["measured_range"][0] <= r["sparsity"]["measured_speedup"]
               <= r["measured_range"][1] for r in timed)
    assert (tmp_path / "out" / "frontier.png").stat().st_size > 1000


def test_plan_options_on_hybrid_plans(tiny_hf_folder, tmp_path, capsys):
    """--order and the other selection options apply to a hybrid plan's selection layers; --ratio does not."""
    from cli_helpers import assert_user_error, run_cli
    from orthorank.models.loading import load_model

    lm = load_model(str(tiny_hf_folder), device="cpu")
    path = Plan("hybrid", [], lm.name, lm.signature(), actions={1: 0.5, 2: "remove"}).save(tmp_path / "h.json")
    text = tmp_path / "t.txt"
    text.write_text("Some evaluation text about many different things. " * 100)
    base = ["ppl", "--model", tiny_hf_folder, "--plan", path, "--dataset", text, "--seq-len", "32",
            "--max-windows", "2", "--threads", "1"]
    code, out, err = run_cli(capsys, *base, "--json", tmp_path / "r.json")
    assert code == 0, err
    code, _, err = run_cli(capsys, *base, "--order", "random", "--json", tmp_path / "random.json")
    assert code == 0, err
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("r.json", "random.json"))
    assert a["result"]["perplexity"] != b["result"]["perplexity"]
    assert b["plan"]["selection"]["policy"] == "random" and b["plan"]["actions"] == {"1": 0.5, "2": "remove"}
    assert_user_error(capsys, "--ratio does not apply", *base, "--ratio", "0.5")


def test_interrupted_hybrid_search_resumes_to_the_same_plans(calib, tmp_path):
    """Every step is checkpointed; a search stopped after 3 steps and run again replays them and ends with the
    plans, steps and losses of an uninterrupted search, reporting the targets it had reached again."""
    from orthorank.harness.search.checkpoint import Checkpoint
    from orthorank.harness.store import ResultStore

    m, windows = calib
    t, targets, ratios = table(), [1.15, 1.4], [0.25, 0.33, 0.5]
    full = hybrid_search(StackRunner(m, windows, 2), t, targets, ratios, list(range(1, 7)), progress=False)
    store = ResultStore(tmp_path / "store")

    class Stop(Exception):
        pass

    def open_checkpoint(runner):
        return Checkpoint.open(store, runner, "hybrid", {"targets": targets, "ratios": ratios}, code="hybrid-search")

    runner = StackRunner(m, windows, 2)
    ck = open_checkpoint(runner)
    put = ck.put

    def put_then_stop(index, value):
        put(index, value)
        if index >= 3:
            raise Stop
    ck.put = put_then_stop
    with pytest.raises(Stop):
        hybrid_search(runner, t, targets, ratios, list(range(1, 7)), progress=False, checkpoint=ck)
    runner = StackRunner(m, windows, 2)
    ck = open_checkpoint(runner)
    seen = []
    again = hybrid_search(runner, t, targets, ratios, list(range(1, 7)), progress=False, checkpoint=ck,
                          on_reached=lambda target, result: seen.append(target))
    assert ck.resumed == 3 and seen == targets
    assert again.plans == full.plans and again.reached == full.reached
    assert [s.to_dict() for s in again.steps] == [s.to_dict() for s in full.steps]


# -- per-layer keep ratios at exactly pruning's compute (calibrate --method orthorank-ratios) ---------------------

def test_match_exactly_lands_within_one_token_of_the_target():
    from orthorank.harness.runtime.cost_table import FlopCostTable
    from orthorank.harness.search.hybrid import match_exactly

    arch = Arch(num_layers=6, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256)
    table = FlopCostTable.build(arch, 512, [0.25, 0.5], "m", {"num_layers": 6})
    target = table.predicted_speedup({1: REMOVE})
    over = {1: 0.25, 2: 0.25}  # overshoots the target
    assert table.predicted_speedup(over) > target
    exact = match_exactly(over, 2, target, table)
    assert exact[1] == 0.25 and 0.25 < exact[2] <= 1.0 and exact[2] * 512 == int(exact[2] * 512)
    assert abs(table.compute_sparsity(exact) - (1 - 1 / target)) < 0.005 * (1 - 1 / target)
    assert table.fraction(0.25) == pytest.approx(table.selective["0.25"])


def test_calibrate_orthorank_ratios_cli(tiny_hf_folder, tmp_path, capsys):
    from cli_helpers import assert_user_error, run_cli

    text = tmp_path / "calib.txt"
    text.write_text("Some calibration text about many different things. " * 200)
    args = ["calibrate", "--model", tiny_hf_folder, "--method", "orthorank-ratios", "--calib-data", text,
            "--calib-samples", "4", "--seq-len", "32", "--threads", "1", "--cost-seq-len", "512"]
    code, out, err = run_cli(capsys, *args, "--sparsity", "0.2,0.25", "--ratios", "0.25,0.5",
                             "--policy", "norm", "--out", tmp_path / "plans")
    assert code == 0, err
    arch = None
    for s in (0.2, 0.25):
        plan = Plan.load(tmp_path / "plans" / f"orthorank-ratios-{s:g}.json")
        arch = Arch(**plan.arch)
        target = removal_sparsity(arch, 512, math.ceil(s * 4 - 1e-9))
        got = plan.sparsity(arch, 512)["compute"]
        assert plan.method == "hybrid" and not plan.removed_layers and plan.selection.policy == "norm"
        assert abs(got - target) <= 0.005 * target, (got, target)  # within 0.5% of pruning's compute
        assert plan.provenance["compute_sparsity"] == pytest.approx(got, abs=1e-6)
        assert set(plan.actions) <= {1, 2} and all(0.25 <= float(r) <= 1.0 for r in plan.actions.values())
    # the plan runs through the other commands
    code, out, err = run_cli(capsys, "ppl", "--model", tiny_hf_folder, "--plan",
                             tmp_path / "plans" / "orthorank-ratios-0.2.json", "--dataset", text, "--seq-len", "32",
                             "--max-windows", "2", "--threads", "1")
    assert code == 0, err
    o = ["--json", tmp_path / "x.json"]
    assert_user_error(capsys, "not --cost-table", *args, "--sparsity", "0.2", "--cost-table", text, *o)
    assert_user_error(capsys, "needs --sparsity", *args, *o)
    assert_user_error(capsys, "out of reach", *args, "--sparsity", "0.75", "--ratios", "0.5", *o)


def test_bench_times_a_hybrid_plan_with_per_layer_ratios(tiny_hf_folder, tmp_path):
    """bench times a saved hybrid plan as it runs (its removals, each selection layer at its own keep ratio: the
    model under the bench's spec gives the plan's own output) and counts its compute from the per-layer ratios."""
    from orthorank.harness.speed.specs import method_specs
    from orthorank.method.cost import hybrid_compute_sparsity
    from orthorank.models.loading import load_model

    lm = load_model(str(tiny_hf_folder), device="cpu")
    plan = Plan("hybrid", [], lm.name, lm.signature(), actions={1: 0.5, 2: "remove", 3: 0.25})
    path = plan.save(tmp_path / "h.json")
    spec = method_specs(["hybrid"], lm.num_layers, 0.2, SelectionConfig(), [(str(path), plan)])[0]
    assert spec.removed == [2] and spec.layers == [1, 3] and spec.ratios() == [0.5, 0.25]
    ids = torch.randint(0, lm.config.vocab_size, (1, 24))
    with torch.no_grad():
        apply_plan(lm.model, plan)
        want = lm.model(ids).logits
        restore_dense(lm.model)
        spec.apply(lm.model)
        got = lm.model(ids).logits
        restore_dense(lm.model)
    assert torch.equal(want, got)
    from orthorank.harness.cli.main import main

    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(tiny_hf_folder), "--methods", "dense,hybrid", "--plan", str(path),
                 "--seq-len", "24", "--warmup", "0", "--repeats", "2", "--threads", "1", "--json", str(out)]) == 0
    row = next(r for r in json.loads(out.read_text())["runs"][0]["methods"] if r["method"] == "hybrid")
    arch = Arch.from_config(lm.config, lm.num_layers)
    assert row["removed_layers"] == [2] and row["layers"] == [1, 3]
    assert row["sparsity"]["compute"] == round(hybrid_compute_sparsity(arch, 24, 1, [0.5, 0.25]), 6)
