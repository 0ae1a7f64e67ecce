"""The router policy (method/router.py), its fit (harness/search/router_fit.py) and the loss-oracle (method/recording.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import pytest
import torch

from cli_helpers import assert_user_error
from conftest import ids_for, left_pad, tiny_model
from orthorank.errors import UserError
from orthorank.method import SelectionConfig, apply_orthorank
from orthorank.method.apply import restore_dense, selective
from orthorank.method.cost import Arch, model_flops
from orthorank.method.plan import Plan
from orthorank.method.policies import POLICIES
from orthorank.method.router import RouterState, constant_router, flops_per_token, random_router
from orthorank.method.selection import keep_count
from orthorank.harness.search.router_fit import FitSettings, fit_router

SIG = {"model_type": "llama", "num_layers": 4, "hidden_size": 64, "vocab_size": 128}




def _bits(values) -> list[int]:
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


def _layer_io(m, i, ids):
    seen = {}

    def hook(module, args, kwargs):
        seen["h"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
    handle = m.model.layers[i].register_forward_pre_hook(hook, with_kwargs=True)
    m(ids, use_cache=False)
    handle.remove()
    return seen["h"]


def test_a_fitted_router_round_trips_through_a_plan_file_bit_for_bit(tmp_path):
    state = random_router([1, 2], 64, seed=3)
    plan = Plan("orthorank", [1, 2], "tiny", SIG, selection=SelectionConfig(policy="router", fitted=state))
    path = plan.save(tmp_path / "router.json")
    back = Plan.load(path)
    got = back.selection.fitted
    assert got == state and got.digest() == state.digest() and back.content_hash() == plan.content_hash()
    for a, b in zip(state.layers, got.layers):
        for field in ("weight", "mean", "scale"):
            assert _bits(getattr(a, field)) == _bits(getattr(b, field))
        assert _bits([a.bias]) == _bits([b.bias])
    assert json.loads(path.read_text())["selection"]["fitted"]["format"] == "orthorank-router/1"
    # and it runs the same: saved and loaded routers select the same tokens
    m = tiny_model()
    ids = ids_for()
    apply_orthorank(m, [1, 2], plan.selection)
    a = m(ids).logits
    apply_orthorank(m, [1, 2], back.selection)
    assert torch.equal(a, m(ids).logits)


def test_a_router_with_zero_weights_and_a_bias_is_a_constant_policy():
    """Every token scores the bias: ties go to the earliest position, so the first K tokens after the sink."""
    m = tiny_model()
    ids = ids_for(batch=2, length=20)
    apply_orthorank(m, [2], SelectionConfig(ratio=0.3, policy="router", fitted=constant_router([2], 64, bias=1.5)))
    m(ids, use_cache=False)
    keep = selective(m.model.layers[2]).last_keep
    k = keep_count(20, 0.3)
    expected = torch.zeros(2, 20, dtype=torch.bool)
    expected[:, 1:k + 1] = True
    assert torch.equal(keep, expected)


def test_router_selection_equals_a_brute_force_top_k_of_its_scores():
    m = tiny_model()
    ids = ids_for(batch=2, length=21, seed=4)
    state = random_router([1], 64, seed=9)
    apply_orthorank(m, [1], SelectionConfig(ratio=0.4, policy="router", fitted=state))
    h = _layer_io(m, 1, ids)
    keep = selective(m.model.layers[1]).last_keep
    x = m.model.layers[1].input_layernorm(h)
    scores = state.layer(1).score(x, h, x[:, 0])
    k = keep_count(21, 0.4)
    for b in range(2):
        order = sorted(range(1, 21), key=lambda t: (-float(scores[b, t]), t))  # the sink ranks last
        assert sorted(torch.nonzero(keep[b]).squeeze(1).tolist()) == sorted(order[:k])


def test_the_router_flops_enter_compute_sparsity():
    arch = {"num_layers": 30, "hidden": 576, "heads": 9, "kv_heads": 3, "head_dim": 64, "ffn": 1536, "vocab": 49152}
    sig = {"model_type": "llama", "num_layers": 30, "hidden_size": 576, "vocab_size": 49152}
    layers = [4, 5, 12, 13]
    rule = Plan("orthorank", layers, "m", sig, selection=SelectionConfig(ratio=0.33), arch=arch)
    routed = Plan("orthorank", layers, "m", sig,
                  selection=SelectionConfig(ratio=0.33, policy="router", fitted=random_router(layers, 576)), arch=arch)
    extra = len(layers) * (flops_per_token(576) - 2 * 576) / model_flops(Arch(**arch), 512)
    assert routed.compute_sparsity(seq_len=512) == pytest.approx(rule.compute_sparsity(seq_len=512) - extra, abs=1e-12)
    assert POLICIES["router"].scoring_flops(576) == flops_per_token(576) > POLICIES["orthogonal"].scoring_flops(576)


def test_fitting_twice_with_one_seed_gives_identical_weights():
    m = tiny_model(layers=4)
    windows = ids_for(batch=8, length=16, seed=7)
    plan = Plan("orthorank", [1, 2], "tiny", SIG, selection=SelectionConfig(ratio=0.4))
    settings = FitSettings(alphas=(1.0, 100.0), iterations=2, batch_size=4, seed=5)
    a = fit_router(m, plan, windows, settings, {"data": "test"})
    b = fit_router(m, plan, windows, settings, {"data": "test"})
    assert a.state == b.state and a.state.digest() == b.state.digest()
    assert a.state.layer_indices == [1, 2] and a.state.target in settings.targets
    assert a.report["chosen"]["target"] == a.state.target
    assert getattr(m.model, "_orthorank_state", None) is None or m._orthorank_state is None  # restored dense


def test_a_plan_written_before_the_router_loads_and_runs_unchanged(tmp_path):
    """Plans of the first field name (`order`) load, keep their content hash (the result store's key) and select
    exactly as the same plan written today."""
    m = tiny_model()
    ids = ids_for()
    new = Plan("orthorank", [1, 2], "tiny", SIG, selection=SelectionConfig(ratio=0.33, policy="inverse"))
    old = new.to_dict()
    old["selection"] = {("order" if k == "policy" else k): v for k, v in old["selection"].items()}
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = Plan.load(tmp_path / "old.json")
    assert loaded.selection.policy == "inverse" and loaded.content_hash() == new.content_hash()
    apply_orthorank(m, [1, 2], new.selection)
    a = m(ids).logits
    apply_orthorank(m, [1, 2], loaded.selection)
    assert torch.equal(a, m(ids).logits)
    # the committed plans keep the hashes their stored results were filed under
    assert Plan.load("plans/smollm2-135m/orthorank-0.2.json").content_hash() == "90aea49177ea0094"


def test_a_router_plan_without_fitted_state_or_for_other_layers_is_refused():
    with pytest.raises(UserError, match="needs fitted parameters"):
        SelectionConfig(policy="router")
    with pytest.raises(UserError, match="no fitted score for layer 3"):
        apply_orthorank(tiny_model(), [3], SelectionConfig(policy="router", fitted=random_router([1], 64)))
    data = random_router([1], 64).to_dict()
    data["layers"]["1"]["weight"] = data["layers"]["1"]["weight"][:-1]
    with pytest.raises(UserError, match="must be a list of 70 numbers"):
        RouterState.from_dict(data)


def test_the_loss_oracle_ranks_by_the_first_order_loss_effect():
    """Its keys are <dL/dh_i, f(x)_i - x_i> of the dense model (L the window's summed next-token NLL), computed here
    by hand with autograd; it keeps the K most negative, and leaves the model dense afterwards."""
    m = tiny_model(layers=3)
    with torch.no_grad():  # trained-looking norms: a head that normed twice would give other logits
        for norm in [m.model.norm] + [l.input_layernorm for l in m.model.layers]:
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=torch.Generator().manual_seed(1)) * 2 + 0.2)
    ids = ids_for(batch=1, length=12, seed=3)
    h = _layer_io(m, 1, ids).requires_grad_(True)
    kwargs = {}

    def grab(module, args, kw):
        kwargs.update({k: v for k, v in kw.items() if k != "hidden_states"})
    handle = m.model.layers[1].register_forward_pre_hook(grab, with_kwargs=True)
    m(ids, use_cache=False)
    handle.remove()
    out = m.model.layers[1](h, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    rest = out
    for layer in m.model.layers[2:]:
        r = layer(rest, **kwargs)
        rest = r[0] if isinstance(r, tuple) else r
    logits = m.lm_head(m.model.norm(rest))
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum")
    g = torch.autograd.grad(loss, out)[0]
    effect = (g * (out - h)).sum(-1)[0].detach()
    apply_orthorank(m, [1], SelectionConfig(ratio=0.25, policy="loss-oracle"))
    m(ids, use_cache=False)
    keep = selective(m.model.layers[1]).last_keep[0]
    k = keep_count(12, 0.25)
    expected = sorted(sorted(range(1, 12), key=lambda t: float(effect[t]))[:k])
    assert sorted(torch.nonzero(keep).squeeze(1).tolist()) == expected
    restore_dense(m)


def test_fit_router_refuses_bad_input_before_loading(capsys, tmp_path):
    prune = Plan("prune", [1], "tiny", SIG)
    prune.save(tmp_path / "prune.json")
    assert_user_error(capsys, "selects tokens in no layer", "fit-router", "--plan", str(tmp_path / "prune.json"),
                      "--json", str(tmp_path / "r.json"))
    orth = Plan("orthorank", [1], "tiny", SIG, selection=SelectionConfig())
    orth.save(tmp_path / "o.json")
    assert_user_error(capsys, "unknown router target(s) nope", "fit-router", "--plan", str(tmp_path / "o.json"),
                      "--json", str(tmp_path / "r.json"), "--targets", "update,nope")
    (tmp_path / "r.json").write_text("mine")
    assert_user_error(capsys, "exists; pass --overwrite", "fit-router", "--plan", str(tmp_path / "o.json"),
                      "--json", str(tmp_path / "r.json"))
    assert (tmp_path / "r.json").read_text() == "mine"


def _sleb_and_orthorank_plans(capsys, folder):
    """SLEB and OrthoRank plans at 25% for the tiny model, in plans/<name>/ of the current folder."""
    from cli_helpers import run_cli

    name = folder.name
    common = ["--model", folder, "--threads", "1"]
    calib = ["--calib-data", "mix:c4+code", "--calib-tokens", "1K", "--seq-len", "64", "--measure-speed", "0"]
    for method in ("sleb", "orthorank"):
        code, out, err = run_cli(capsys, "calibrate", *common, "--method", method, "--sparsity", "0.25", *calib,
                                 "--out", f"plans/{name}")
        assert code == 0, err
    return name, common, calib


@pytest.mark.data
@pytest.mark.heavy
def test_fit_router_and_a_search_under_the_router_end_to_end(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    """fit-router on a searched plan (compute re-matched to SLEB's, router FLOPs counted), a router bank for every
    inner layer, the greedy layer search under it, and compare with the router row against SLEB."""
    from cli_helpers import run_cli

    monkeypatch.chdir(tmp_path)
    name, common, calib = _sleb_and_orthorank_plans(capsys, tiny_hf_folder)
    fit = ["--calib-data", "mix:c4+code", "--calib-samples", "8", "--seq-len", "32", "--batch-size", "4"]
    code, out, err = run_cli(capsys, "fit-router", *common, "--plan", f"plans/{name}/orthorank-0.25.json",
                             "--json", f"plans/{name}/router-0.25.json", *fit, "--targets", "update,fisher",
                             "--match-compute-of", f"plans/{name}/sleb-0.25.json", "--cost-seq-len", "64",
                             "--always-route")
    assert code == 0, err
    router = Plan.load(f"plans/{name}/router-0.25.json")
    sleb = Plan.load(f"plans/{name}/sleb-0.25.json")
    assert router.selection.policy == "router" and router.selection.fitted.target in ("update", "fisher")
    assert abs(router.compute_sparsity(seq_len=64) - sleb.compute_sparsity(seq_len=64)) < 0.01
    assert router.provenance["router_fit"]["chosen"]["target"] == router.selection.fitted.target
    assert router.selection.fitted.calibration["mix"] == ["c4", "code"]
    # without --always-route the plan keeps the router only where it beat the paper's rule on held-out windows
    code, out, err = run_cli(capsys, "fit-router", *common, "--plan", f"plans/{name}/orthorank-0.25.json",
                             "--json", "default.json", *fit, "--targets", "update,fisher",
                             "--match-compute-of", f"plans/{name}/sleb-0.25.json", "--cost-seq-len", "64")
    assert code == 0, err
    result, default = json.loads(out.strip().splitlines()[-1]), Plan.load("default.json")
    nll = result["held_out_nll"]
    assert nll == router.provenance["router_fit"]["held_out_nll"]  # the same fit
    wins = nll["router"] < nll["orthogonal"]
    assert default.selection.policy == result["kept"] == ("router" if wins else "orthogonal")
    assert (default.selection.fitted is None) != wins and ("no router beat" in err) != wins
    assert abs(default.compute_sparsity(seq_len=64) - sleb.compute_sparsity(seq_len=64)) < 0.01
    # a bank for every inner layer, then the search under it
    code, out, err = run_cli(capsys, "fit-router", *common, "--plan", f"plans/{name}/orthorank-0.25.json",
                             "--json", "bank.json", *fit, "--targets", "update", "--layers", "inner")
    assert code == 0, err
    assert Plan.load("bank.json").selection.fitted.layer_indices == [1, 2]
    code, out, err = run_cli(capsys, "calibrate", *common, "--method", "orthorank", "--sparsity", "0.25", *calib,
                             "--policy", "router", "--router", "bank.json", "--out", "searched")
    assert code == 0, err
    searched = Plan.load("searched/orthorank-0.25.json")
    assert searched.selection.policy == "router" and set(searched.layers) <= {1, 2}
    code, out, err = run_cli(capsys, "compare", *common, "--methods", "sleb,orthorank,router", "--sparsity", "0.25",
                             "--datasets", "wikitext2,c4", "--seq-len", "64", "--max-windows", "2",
                             "--policies", "random,oracle", "--no-store", "--out", "cmp")
    assert code == 0, err
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    pairs = {(c["a"], c["b"]) for c in data["comparisons"]}
    assert ("router", "sleb") in pairs and ("router", "orthorank") in pairs
    assert any(h["method"] == "router" for h in data["headroom"])


def test_calibrate_refuses_the_router_policy_without_a_bank(capsys, tiny_hf_folder):
    assert_user_error(capsys, "give --router BANK", "calibrate", "--model", str(tiny_hf_folder), "--method",
                      "orthorank", "--sparsity", "0.25", "--policy", "router", "--out", "x")
    assert_user_error(capsys, "add --policy router", "calibrate", "--model", str(tiny_hf_folder), "--method",
                      "orthorank", "--sparsity", "0.25", "--router", "bank.json", "--out", "x")


@pytest.mark.data  # ppl reads its evaluation text first
def test_a_broken_plan_file_is_reported_before_the_model_loads(capsys, tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    assert_user_error(capsys, "is not valid JSON", "ppl", "--model", str(tmp_path / "no-such-model"),
                      "--plan", str(tmp_path / "broken.json"), "--dataset", "wikitext2")


def test_rematch_sets_keep_ratios_to_another_plans_compute_within_one_token():
    """fit-router's compute match: an OrthoRank plan's one ratio, a hybrid plan's selection layers shifted by the
    same kept-token count, each landing within one kept token per layer of the target, router FLOPs counted."""
    from orthorank.harness.api.fit_router import rematch
    from orthorank.method.cost import Arch, hybrid_compute_sparsity, selection_layer_flops

    arch = {"num_layers": 18, "hidden": 640, "heads": 4, "kv_heads": 1, "head_dim": 256, "ffn": 2048,
            "vocab": 262144}
    sig = {"model_type": "gemma3_text", "num_layers": 18, "hidden_size": 640, "vocab_size": 262144}
    prov = {"cost_seq_len": 512}
    sleb = Plan("prune", [6, 8, 9, 16], "g", sig, arch=arch, provenance=prov)
    target = sleb.compute_sparsity(seq_len=512)
    scoring = POLICIES["router"].scoring_flops(640)
    one_token = selection_layer_flops(Arch(**arch), 512, 101 / 512, scoring) - selection_layer_flops(
        Arch(**arch), 512, 100 / 512, scoring)
    per_token_share = one_token / model_flops(Arch(**arch), 512)
    hybrid = Plan("hybrid", [], "g", sig, selection=SelectionConfig(), arch=arch, provenance=prov,
                  actions={6: "remove", 7: 0.25, 8: "remove", 9: "remove", 16: 0.5})
    got = rematch(hybrid, scoring, target, 512)
    ratios = [a for a in got.actions.values() if a != "remove"]
    shift = {round(got.actions[i] * 512) - round(hybrid.actions[i] * 512) for i in (7, 16)}
    assert len(shift) == 1 and got.removed_layers == [6, 8, 9]
    assert abs(hybrid_compute_sparsity(Arch(**arch), 512, 3, ratios, scoring=scoring) - target) <= per_token_share
    orth = Plan("orthorank", [4, 6, 7, 8, 9, 14, 16], "g", sig, selection=SelectionConfig(ratio=0.33), arch=arch,
                provenance=prov)
    got = rematch(orth, scoring, target, 512)
    routed = dataclasses.replace(got, selection=dataclasses.replace(got.selection, policy="router",
                                                                    fitted=random_router(got.layers, 640)))
    assert abs(routed.compute_sparsity(seq_len=512) - target) <= 7 * per_token_share


def test_a_killed_fit_resumes_after_its_last_finished_pass(tmp_path):
    """Each finished recording pass is kept in the store: a two-pass fit after a one-pass fit of the same key
    resumes the first pass and ends where a fresh two-pass fit ends."""
    from orthorank.harness.search.router_fit import fit_key
    from orthorank.harness.store import ResultStore

    m = tiny_model(layers=4)
    windows = ids_for(batch=8, length=16, seed=7)
    plan = Plan("orthorank", [1, 2], "tiny", SIG, selection=SelectionConfig(ratio=0.4))
    one = FitSettings(alphas=(1.0, 100.0), iterations=1, batch_size=4, seed=5)
    two = dataclasses.replace(one, iterations=2)
    store = ResultStore(tmp_path / "store")
    ns = lambda s: store.namespace("router-fit", fit_key("tiny", plan, windows, s))  # noqa: E731
    fit_router(m, plan, windows, one, {}, checkpoint=ns(one))
    resumed = fit_router(m, plan, windows, two, {}, checkpoint=ns(two))
    fresh = fit_router(m, plan, windows, two, {})
    assert resumed.report["resumed_passes"] == 1 and fresh.report["resumed_passes"] == 0
    assert resumed.state == fresh.state


def test_router_left_padded_batches_and_cached_generation_equal_single_rows():
    """The router's position feature counts from each row's sink, so padding and batch-mates change nothing; and
    cached generation under the threshold decode policy runs with it."""

    m = tiny_model()
    state = random_router([1, 2], 64, seed=4)
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33, policy="router", fitted=state))
    rows = [ids_for(1, 20, seed=3)[0].tolist(), ids_for(1, 13, seed=4)[0].tolist(), ids_for(1, 7, seed=5)[0].tolist()]
    ids, mask = left_pad(rows)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    batched = m(ids, attention_mask=mask, position_ids=pos).logits
    for i, r in enumerate(rows):
        single = m(torch.tensor([r])).logits[0]
        assert torch.allclose(batched[i, -len(r):], single, atol=1e-5), (i, (batched[i, -len(r):] - single).abs().max())
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33, policy="router", fitted=state, decode="threshold"))
    prompt = ids_for(1, 12, seed=6)
    cached = m.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    uncached = m.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, use_cache=False)
    assert cached.shape == uncached.shape
    restore_dense(m)


@pytest.mark.data  # fits on calibration text from ../shared/data
@pytest.mark.heavy
def test_fit_router_keeps_the_paper_rule_when_no_router_beats_it(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    """A fit whose best router loses to the paper's rule on the held-out calibration windows writes the paper's rule,
    re-matched with its own scoring cost to the same compute, and says so; --always-route writes the router."""
    from cli_helpers import run_cli

    import orthorank.harness.search.router_fit as router_fit
    from orthorank.method.router import constant_router

    monkeypatch.chdir(tmp_path)
    name, common, calib = _sleb_and_orthorank_plans(capsys, tiny_hf_folder)

    def losing_fit(model, plan, windows, settings, calibration, log=None, checkpoint=None):
        state = constant_router(plan.layers, int(model.config.hidden_size))
        return router_fit.FitResult(state, {"held_out_nll": {"orthogonal": 3.0, "router": 3.5}, "passes": [],
                                            "chosen": {"pass": 1, "target": "update"}})

    monkeypatch.setattr(router_fit, "fit_router", losing_fit)
    fit = ["--calib-data", "mix:c4+code", "--calib-samples", "8", "--seq-len", "32", "--no-store",
           "--match-compute-of", f"plans/{name}/sleb-0.25.json", "--cost-seq-len", "64"]
    sleb = Plan.load(f"plans/{name}/sleb-0.25.json")
    code, out, err = run_cli(capsys, "fit-router", *common, "--plan", f"plans/{name}/orthorank-0.25.json",
                             "--json", "kept.json", *fit)
    assert code == 0, err
    kept = Plan.load("kept.json")
    assert kept.selection.policy == "orthogonal" and kept.selection.fitted is None
    assert kept.provenance["router_fit"]["kept"] == "orthogonal" and "no router beat the paper's rule" in err
    assert json.loads(out.strip().splitlines()[-1])["kept"] == "orthogonal"
    assert abs(kept.compute_sparsity(seq_len=64) - sleb.compute_sparsity(seq_len=64)) < 0.01
    code, out, err = run_cli(capsys, "fit-router", *common, "--plan", f"plans/{name}/orthorank-0.25.json",
                             "--json", "routed.json", *fit, "--always-route")
    assert code == 0, err
    routed = Plan.load("routed.json")
    assert routed.selection.policy == "router" and routed.provenance["router_fit"]["kept"] == "router"
    # the router pays more to score, so it keeps fewer tokens for the same compute
    assert routed.selection.ratio <= kept.selection.ratio


def test_a_router_score_in_cache_sized_blocks_equals_one_pass_over_the_input_bit_for_bit():
    """score() converts a bfloat16 score input to float32 SCORE_ROWS tokens at a time on CPU; one conversion of the
    whole input, each term converting on its own, gives the same bits (the router's stored results and plans keep
    their numbers), with positions, two rows, below the blocks' length and at one that is not a multiple of a block."""
    from orthorank.method.orthogonality import SCORE_BLOCKS_FROM, sink_scores
    from orthorank.method.router import extra_features, random_router

    torch.manual_seed(0)
    layer = random_router([3], 64, seed=1).layer(3)
    for T in (50, SCORE_BLOCKS_FROM + 37):
        positions = torch.arange(T).expand(2, T) - torch.tensor([[0], [3]])
        for dtype in (torch.bfloat16, torch.float32):
            src, hidden = torch.randn(2, T, 64).to(dtype), (5 * torch.randn(2, T, 64)).to(dtype)
            w_x, w_e, b = layer.folded(src.device)
            for pos in (None, positions):
                each = (torch.mv(src.reshape(-1, 64).float(), w_x).view(2, T)
                        + extra_features(src, hidden, src[:, 0], pos) @ w_e + b)
                assert torch.equal(layer.score(src, hidden, src[:, 0], pos), each)
            rule = torch.stack([torch.mv(src[i].float(), src[i, 0].float()) for i in range(2)]).abs()
            assert torch.equal(sink_scores(src, src[:, 0]), rule)


def test_the_front_door_fits_a_router_and_returns_the_plan_to_apply(tmp_path):
    """`orthorank.fit_router` is the harness's fit behind the library's front door: the router plan where the router
    beats the paper's rule on the held-out windows, the plan unchanged where it does not."""
    import orthorank

    m = tiny_model(layers=4)
    windows = ids_for(batch=8, length=16, seed=7)
    plan = Plan("orthorank", [1, 2], "tiny", SIG, selection=SelectionConfig(ratio=0.4))
    plan.save(tmp_path / "p.json")
    loaded = orthorank.load_plan(tmp_path / "p.json")
    settings = dict(alphas=(1.0, 100.0), iterations=1, batch_size=4, seed=5)
    routed = orthorank.fit_router(m, loaded, windows, **settings)
    nll = fit_router(m, plan, windows, FitSettings(**settings), {}).report["held_out_nll"]
    if nll["router"] < nll["orthogonal"]:
        assert routed.selection.policy == "router" and routed.selection.fitted.layer_indices == [1, 2]
    else:
        assert routed is loaded
    orthorank.apply_plan(m, routed)
    assert torch.isfinite(m(windows[:1]).logits).all()
    orthorank.restore_dense(m)


def test_the_one_token_step_score_equals_the_general_score_to_rounding():
    """A batch-1 decoding step scores its token with StepScorer (a few operator calls and host arithmetic); every
    token of a sequence scored that way equals LayerRouter.score to float32 rounding, in bfloat16 and float32, and a
    non-finite input gives a non-finite score for the layer to refuse."""
    from orthorank.method.router import random_router

    torch.manual_seed(1)
    layer = random_router([2], 64, seed=3).layer(2)
    T = 40
    for dtype in (torch.bfloat16, torch.float32):
        src, hidden = torch.randn(1, T, 64).to(dtype), (5 * torch.randn(1, T, 64)).to(dtype)
        general = layer.score(src, hidden, src[:, 0])[0]
        step = layer.step_scorer(src[:, 0])
        ones = torch.tensor([step(src[:, t:t + 1], hidden[:, t:t + 1], t) for t in range(T)])
        assert torch.allclose(ones, general, rtol=1e-5, atol=1e-5 * float(general.abs().max()))
    bad = src[:, 1:2].clone()
    bad[0, 0, 0] = float("nan")
    assert not math.isfinite(step(bad, hidden[:, 1:2], 1))
