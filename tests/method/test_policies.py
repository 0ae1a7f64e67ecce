"""Selection policies (method/policies.py): the registry, each policy's exactness, the oracle, the modifiers."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from cli_helpers import assert_user_error
from conftest import ids_for, tiny_model
from orthorank.errors import UserError
from orthorank.method import SelectionConfig, apply_orthorank
from orthorank.method.apply import selective
from orthorank.method.plan import Plan
from orthorank.method.policies import POLICIES, PolicyInputs, always_update
from orthorank.method.router import constant_router, random_router

ATOL = 1e-5




def test_registry_refuses_unknown_policies_with_the_list():
    with pytest.raises(UserError, match="unknown selection policy 'nope'; choose one of orthogonal, random"):
        SelectionConfig(policy="nope")
    with pytest.raises(UserError, match="keep_recent must be"):
        SelectionConfig(keep_recent=-1)
    with pytest.raises(UserError, match="no no-KV ablation"):
        SelectionConfig(policy="oracle", bypass_kv=False)
    assert "keep_recent" not in SelectionConfig().to_dict()  # plans and stored results from before stay valid
    assert SelectionConfig(keep_recent=4).to_dict()["keep_recent"] == 4


def test_policy_on_the_command_line_is_a_one_line_error(capsys, tiny_hf_folder):
    assert_user_error(capsys, "unknown selection policy 'nope'", "ppl", "--model", str(tiny_hf_folder), "--method",
                      "orthorank", "--layers", "1", "--policy", "nope")


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_at_ratio_one_equals_dense(family, policy):
    m = tiny_model(family)
    ids = ids_for()
    dense = m(ids).logits
    fitted = random_router([1, 2], m.config.hidden_size) if policy == "router" else None
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=1.0, policy=policy, keep_recent=2, fitted=fitted))
    out = m(ids).logits
    assert torch.allclose(out, dense, atol=ATOL), (policy, (out - dense).abs().max())


def test_norm_policy_updates_the_largest_states_first():
    src = torch.tensor([[[1.0, 0.0], [3.0, 0.0], [0.0, 0.5], [0.0, 2.0]]])
    keys = POLICIES["norm"].keys(PolicyInputs(src=src, hidden=src))
    assert torch.argsort(keys, dim=1).tolist() == [[1, 3, 0, 2]]


def test_oracle_equals_brute_force_on_a_two_layer_model():
    """Of every choice of K tokens (the sink aside), the oracle keeps the one with the largest total update, and
    its output is that choice's exact selective output (dense where kept, the input elsewhere)."""
    m = tiny_model(layers=2)
    ids = ids_for(batch=1, length=7, seed=2)
    apply_orthorank(m, [1], SelectionConfig(ratio=0.3, policy="oracle"))  # K = ceil(0.3 * 7) = 3
    wrapper = m.model.layers[1]
    seen = {}

    def hook(module, args, kwargs, output):
        seen["h"], seen["kwargs"], seen["out"] = args[0], kwargs, output

    wrapper.register_forward_hook(hook, with_kwargs=True)
    m(ids, use_cache=False)
    h = seen["h"]
    dense_out = selective(wrapper).inner(h, **seen["kwargs"])
    dense_out = dense_out[0] if isinstance(dense_out, tuple) else dense_out
    out = seen["out"][0] if isinstance(seen["out"], tuple) else seen["out"]
    update = (dense_out - h).norm(dim=-1)[0]
    best, best_total = None, -1.0
    for subset in itertools.combinations(range(1, 7), 3):
        total = float(update[list(subset)].sum())
        if total > best_total:
            best, best_total = subset, total
    keep = selective(wrapper).last_keep[0]
    assert sorted(torch.nonzero(keep).squeeze(1).tolist()) == list(best)
    reference = torch.where(keep.view(1, -1, 1), dense_out, h)
    assert torch.allclose(out, reference, atol=ATOL)


def test_oracle_plans_skip_no_compute():
    sig = {"model_type": "llama", "num_layers": 30, "hidden_size": 576, "vocab_size": 49152}
    arch = {"num_layers": 30, "hidden": 576, "heads": 9, "kv_heads": 3, "head_dim": 64, "ffn": 1536, "vocab": 49152}
    oracle = Plan("orthorank", [3, 4, 5], "m", sig, selection=SelectionConfig(policy="oracle"), arch=arch)
    rule = Plan("orthorank", [3, 4, 5], "m", sig, selection=SelectionConfig(), arch=arch)
    assert oracle.compute_sparsity() == 0.0 and rule.compute_sparsity() > 0.05


def test_keep_recent_and_first_mark_exactly_the_last_and_first_real_tokens_under_left_padding():
    valid = torch.tensor([[False, False, True, True, True, True, True],
                          [True, True, True, True, True, True, True]])
    recent = always_update(valid, 2, 7, 2, 0, 0, valid.device)
    assert recent.tolist() == [[False] * 5 + [True] * 2, [False] * 5 + [True] * 2]
    first = always_update(valid, 2, 7, 0, 2, 0, valid.device)  # after the sink (the first real token)
    assert first.tolist() == [[False, False, False, True, True, False, False],
                              [False, True, True, False, False, False, False]]
    assert always_update(valid, 2, 7, 0, 2, 5, valid.device) is None  # later chunks: the first tokens are past


@pytest.mark.parametrize("policy", ["orthogonal", "norm", "inverse"])
def test_keep_recent_is_always_updated_in_a_left_padded_batch(policy):
    m = tiny_model()
    rows = [ids_for(1, 20, seed=3)[0].tolist(), ids_for(1, 9, seed=4)[0].tolist()]
    width = 20
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    apply_orthorank(m, [1], SelectionConfig(ratio=0.33, policy=policy, keep_recent=3))
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    batched = m(ids, attention_mask=mask, position_ids=pos).logits
    keep = selective(m.model.layers[1]).last_keep
    assert keep[:, -3:].all()
    assert keep.sum(1).tolist() == [7, 3]  # K = ceil(0.33 n): the recent tokens count within it
    for i, r in enumerate(rows):  # and the batch still equals each row alone
        single = m(torch.tensor([r])).logits[0]
        assert torch.allclose(batched[i, -len(r):], single, atol=ATOL)


def test_prev_update_ranks_by_the_previous_layers_update():
    """Reference: the previous layer's input and output captured by hooks; the kept tokens are the K largest
    ||h_l - h_(l-1)|| (the sink aside), also when the previous layer is itself selective (updates in place)."""
    for previous_selective in (False, True):
        m = tiny_model()
        ids = ids_for(batch=1, length=12, seed=6)
        layers = [1, 2] if previous_selective else [2]
        configs = {1: SelectionConfig(ratio=0.5), 2: SelectionConfig(ratio=0.25, policy="prev-update")}
        from orthorank.method.apply import apply_hybrid

        apply_hybrid(m, [], {i: configs[i] for i in layers})
        seen = {}
        m.model.layers[1].register_forward_pre_hook(
            lambda mod, args, kwargs: seen.__setitem__("h1", (args[0] if args else kwargs["hidden_states"]).clone()),
            with_kwargs=True)
        m.model.layers[2].register_forward_pre_hook(
            lambda mod, args, kwargs: seen.__setitem__("h2", (args[0] if args else kwargs["hidden_states"]).clone()),
            with_kwargs=True)
        m(ids, use_cache=False)
        update = (seen["h2"] - seen["h1"]).norm(dim=-1)[0]
        update[0] = -1.0  # the sink ranks last
        expected = sorted(torch.argsort(update, descending=True)[:3].tolist())  # K = ceil(0.25 * 12) = 3
        keep = selective(m.model.layers[2]).last_keep[0]
        assert sorted(torch.nonzero(keep).squeeze(1).tolist()) == expected


def test_prev_update_needs_a_layer_before():
    with pytest.raises(UserError, match="needs a layer before selection layer 0"):
        apply_orthorank(tiny_model(), [0], SelectionConfig(policy="prev-update"))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_attention_policy_keeps_the_tokens_the_last_queries_attend_to_most(family):
    """Reference: the dense model's own attention probabilities of that layer (eager, output_attentions), summed
    over heads and the last 32 queries."""
    m = tiny_model(family, attn="eager")
    ids = ids_for(batch=1, length=40, seed=8)
    probs = m(ids, output_attentions=True).attentions[2]  # [1, H, T, T]
    received = probs[:, :, -32:, :].sum(dim=(1, 2))[0]
    received[0] = -1.0  # the sink ranks last
    expected = sorted(torch.argsort(received, descending=True)[:10].tolist())  # K = ceil(0.25 * 40)
    apply_orthorank(m, [2], SelectionConfig(ratio=0.25, policy="attention"))
    m(ids, use_cache=False)
    keep = selective(m.model.layers[2]).last_keep[0]
    assert sorted(torch.nonzero(keep).squeeze(1).tolist()) == expected


# -- policy variants, headroom, selection maps ---------------------------------------------------------------------

def test_policy_variants_parse_and_refuse():
    from orthorank.method.policies import parse_variant, parse_variants

    assert parse_variant("orthogonal+recent=64") == {"policy": "orthogonal", "keep_recent": 64}
    assert parse_variant("+first=3") == {"keep_first": 3}
    assert parse_variant("+decode=threshold") == {"decode": "threshold"}
    assert parse_variant("norm+recent=8+decode=dense") == {"policy": "norm", "keep_recent": 8, "decode": "dense"}
    assert parse_variants(" norm, oracle ,norm") == ["norm", "oracle"]
    for bad in ("nope", "norm+recent", "norm+recent=x", "norm+last=3", "", "+", "+decode=3", "+recent=threshold"):
        with pytest.raises(UserError):
            parse_variants(bad)


def test_headroom_share_is_one_for_the_oracle_zero_for_random_and_has_an_interval():
    import numpy as np

    from orthorank.harness.evaluation.stats import headroom_share

    rng = np.random.default_rng(0)
    rand = 100 + rng.normal(0, 5, 20)
    oracle = rand - 10 + rng.normal(0, 1, 20)
    half = (rand + oracle) / 2
    assert headroom_share(oracle, rand, oracle, 50).value == pytest.approx(1.0)
    assert headroom_share(rand, rand, oracle, 50).value == pytest.approx(0.0)
    h = headroom_share(half, rand, oracle, 50)
    assert 0.4 < h.value < 0.6 and h.low < h.value < h.high and h.n == 20
    assert not headroom_share(rand, rand, rand, 50).known  # no headroom to share


@pytest.mark.data
def test_compare_policies_rows_pair_with_the_paper_and_sleb_and_give_a_headroom_table(tiny_hf_folder, tmp_path,
                                                                                     monkeypatch, capsys):
    import json

    from orthorank.harness.cli.main import main

    monkeypatch.chdir(tmp_path)
    name = tiny_hf_folder.name
    folder = tmp_path / "plans" / name
    folder.mkdir(parents=True)
    Plan("prune", [2], name, {"num_layers": 4}).save(folder / "sleb-0.2.json")
    Plan("orthorank", [1, 2], name, {"num_layers": 4}, selection=SelectionConfig(ratio=0.4)).save(
        folder / "orthorank-0.2.json")
    code = main(["compare", "--model", str(tiny_hf_folder), "--methods", "sleb,orthorank", "--sparsity", "0.2",
                 "--datasets", "wikitext2", "--seq-len", "48", "--max-windows", "3", "--no-store", "--out", "out",
                 "--policies", "random,oracle,norm,orthogonal+recent=8"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert [r["method"] for r in result["rows"]] == ["sleb", "orthorank", "orthorank (policy random)",
                                                     "orthorank (policy oracle)", "orthorank (policy norm)",
                                                     "orthorank (policy orthogonal+recent=8)"]
    refs = {c["b"] for c in result["comparisons"] if c["a"] == "orthorank (policy norm)"}
    assert refs == {"orthorank", "sleb"}
    rules = {h["method"]: h for h in result["headroom"]}
    assert set(rules) == {"orthorank", "orthorank (policy norm)", "orthorank (policy orthogonal+recent=8)"}
    assert "Headroom captured" in out
    oracle = next(r for r in result["rows"] if r["method"] == "orthorank (policy oracle)")
    assert oracle["sparsity"]["compute"] == 0  # never a speed-up
    assert main(["compare", "--model", str(tiny_hf_folder), "--methods", "sleb", "--sparsity", "0.2",
                 "--datasets", "wikitext2", "--out", "o2", "--policies", "norm"]) == 2


@pytest.mark.data
def test_selection_map_marks_spans_and_matches_last_keep(tiny_hf_folder, tmp_path, capsys):
    import json

    from orthorank.harness.analysis.selection_map import SelectionMap, needle_spans, take_map, tokenize_with_spans
    from orthorank.harness.cli.main import main
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_hf_folder)
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_folder).eval()
    prompt = ("Some special magic numbers are hidden within the following text.\nThe sky was grey over the sea. "
              "One of the special magic numbers for apple is: 1234567. The boats came in late.\nWhat is the "
              "special magic number for apple? The special magic number for apple is")
    ids, spans = tokenize_with_spans(tok, prompt, needle_spans(prompt))
    assert set(spans) == {"instruction", "needle", "question"}
    (a, b), = spans["needle"]
    assert "1234567" in tok.decode(ids[a:b]) and "boats" not in tok.decode(ids[a:b])
    plan = Plan("orthorank", [1, 2], tiny_hf_folder.name, {"num_layers": 4},
                selection=SelectionConfig(ratio=0.3, keep_recent=5))
    m = take_map(model, plan, ids, spans, "tiny needle")
    assert m.states == ["dense", "select", "select", "dense"]
    k = math.ceil(0.3 * len(ids))
    for layer in (1, 2):
        assert len(m.kept[layer]) == k and set(range(len(ids) - 5, len(ids))) <= set(m.kept[layer])
        assert 0 not in m.kept[layer]  # the sink is never updated
    assert m.last_token_layers() == (2, 2) and m.summary()["span_share_updated"]["question"]["mean"] > 0
    assert SelectionMap.from_dict(json.loads(json.dumps(m.to_dict()))).kept == m.kept
    # the same through the command: a plan file, a needle prompt built by the suite, a figure
    plan.save(tmp_path / "p.json")
    code = main(["selection-map", "--model", str(tiny_hf_folder), "--plan", str(tmp_path / "p.json"),
                 "--prompts", "needle:512", "--policies", "orthogonal,orthogonal+recent=64", "--out",
                 str(tmp_path / "map")])
    out, err = capsys.readouterr()
    assert code == 0 and "last token updated in 2 of 2" in out, err
    data = json.loads((tmp_path / "map" / "selection-map.json").read_text())
    assert len(data["maps"]) == 2 and (tmp_path / "map" / data["figures"][1]).stat().st_size > 5000
    assert data["maps"][1]["summary"]["span_share_updated"]["question"]["mean"] == 1.0
    assert main(["selection-map", "--model", str(tiny_hf_folder), "--plan", str(tmp_path / "p.json"),
                 "--prompts", "needle:512", "--out", str(tmp_path / "map")]) == 2  # would overwrite
    assert main(["selection-map", "--model", str(tiny_hf_folder), "--plan", str(tmp_path / "p.json"),
                 "--prompts", "haystack:3", "--out", str(tmp_path / "map2")]) == 2
    # the analysis report shows the maps and their span shares
    assert main(["analyze", "--model", str(tiny_hf_folder), "--text", "a b c d e f g h " * 20, "--seq-len", "32",
                 "--samples", "1", "--selection-map", str(tmp_path / "map" / "selection-map.json"),
                 "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "report.html").read_text()
    assert 'id="selection-maps"' in page and page.count('data-figure="selection-map-') == 2
    assert "selection_maps" in json.loads((tmp_path / "report" / "analysis.json").read_text())
    (tmp_path / "bad.json").write_text("{}")
    assert main(["analyze", "--model", str(tiny_hf_folder), "--text", "a b c", "--selection-map",
                 str(tmp_path / "bad.json"), "--out", str(tmp_path / "r2")]) == 2


def test_policy_choice_is_computed_from_the_intervals(tmp_path):
    import json

    from orthorank.harness.study.long_inputs import decide, main, markdown

    def ratio(a, b, d, v, lo, hi):
        return {"a": a, "a_level": 0.2, "b": b, "b_level": 0.2, "dataset": d, "ratio": v, "ci95": [lo, hi]}

    compare = {"command": "compare", "comparisons": [
        ratio("orthorank (policy norm)", "orthorank", "wikitext2", 0.95, 0.93, 0.97),
        ratio("orthorank (policy norm)", "orthorank", "c4", 0.96, 0.94, 0.99),
        ratio("orthorank (policy orthogonal+recent=64)", "orthorank", "wikitext2", 1.01, 0.99, 1.03),
        ratio("orthorank (policy orthogonal+recent=64)", "orthorank", "c4", 1.05, 1.02, 1.08),  # worse on c4
        ratio("orthorank", "sleb", "wikitext2", 0.9, 0.85, 0.95)]}

    def diff(v, lo, hi):
        return {"mean": {"value": v, "low": lo, "high": hi}}

    longctx = {"command": "longctx", "summary": {"1024": {"paired": {
        "orthorank 0.2 (dense decode) vs sleb 0.2": diff(-10, -20, -2),  # the paper's rule: worse than SLEB
        "orthorank 0.2 [norm] (dense decode) vs sleb 0.2": diff(0, -8, 8),
        "orthorank 0.2 [norm] (dense decode) vs orthorank 0.2 (dense decode)": diff(10, 2, 18),
        "orthorank 0.2 [orthogonal+recent=64] (dense decode) vs sleb 0.2": diff(5, -3, 12)}}}}
    result = decide(compare, longctx, None, 0.2)
    by = {r["policy"]: r for r in result["rows"]}
    assert not by["orthogonal"]["fix"] and "worse than SLEB on suite 1024" in by["orthogonal"]["why_not"]
    compare["comparisons"] += [ratio("orthorank (policy oracle)", "orthorank", d, 0.8, 0.7, 0.9) for d in ("wikitext2", "c4")]
    longctx["summary"]["1024"]["paired"]["orthorank 0.2 [oracle] (dense decode) vs sleb 0.2"] = diff(20, 10, 30)
    oracle = {r["policy"]: r for r in decide(compare, longctx, None, 0.2)["rows"]}["oracle"]
    assert not oracle["fix"] and not oracle["default_candidate"]  # an upper bound, never a speed-up
    assert by["norm"]["fix"] and by["norm"]["default_candidate"] and result["default"] == "norm"
    assert not by["orthogonal+recent=64"]["fix"]
    assert by["orthogonal+recent=64"]["why_not"] == ["worse than the paper's rule on c4"]
    assert result["fixes"] == ["norm"]
    assert result["paper_worse_than_sleb_on"] == ["suite 1024"]
    # where the paper's rule is not worse than SLEB on any long row, the page says there is nothing to fix
    level = json.loads(json.dumps(longctx))
    level["summary"]["1024"]["paired"]["orthorank 0.2 (dense decode) vs sleb 0.2"] = diff(2, 0, 7)
    calm = decide(compare, level, None, 0.2)
    assert calm["paper_worse_than_sleb_on"] == [] and "no long-input loss to fix" in markdown(calm, "c")
    (tmp_path / "c.json").write_text(json.dumps(compare))
    (tmp_path / "l.json").write_text(json.dumps(longctx))
    assert main(["--compare", str(tmp_path / "c.json"), "--longctx", str(tmp_path / "l.json"), "--out",
                 str(tmp_path / "o")]) == 0
    assert "Default: norm" in (tmp_path / "o" / "policy-choice.md").read_text()
    assert main(["--compare", str(tmp_path / "l.json"), "--out", str(tmp_path / "o2")]) == 2  # not a compare result


# -- decode policies: continuation scoring and the threshold policy's measured saving -------------------------------


def test_continuation_scoring_equals_the_whole_window_for_dense_and_counts_threshold_updates():
    """Dense: the second half decoded token by token through the cache scores what one forward over the window
    scores. OrthoRank with dense decoding updates every decoded token; with threshold decoding fewer, and its NLL
    differs from dense decoding's."""
    import dataclasses

    import torch.nn.functional as F

    from orthorank.harness.evaluation.continuation import continuation_nll, scored_tokens
    from orthorank.method.apply import apply_plan, restore_dense

    m = tiny_model(layers=4)
    torch.manual_seed(0)
    windows = torch.randint(0, m.config.vocab_size, (3, 20))
    nll, share = continuation_nll(m, windows)
    logits = m(windows).logits[:, 9:-1].float()
    whole = F.cross_entropy(logits.transpose(1, 2), windows[:, 10:], reduction="none").sum(1).double()
    assert share is None and scored_tokens(20) == 10
    torch.testing.assert_close(nll, whole, rtol=1e-4, atol=1e-4)
    plan = Plan("orthorank", [1, 2], "tiny", {}, SelectionConfig(ratio=0.3))
    out = {}
    for decode in ("dense", "threshold"):
        apply_plan(m, dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, decode=decode)))
        try:
            out[decode] = continuation_nll(m, windows)
        finally:
            restore_dense(m)
    assert out["dense"][1] == 1.0 and 0.0 <= out["threshold"][1] < 1.0
    assert not torch.equal(out["dense"][0], out["threshold"][0])


@pytest.mark.data
def test_compare_continuation_rows_per_decode_policy(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    """compare --continuation --policies +decode=threshold: a row per decode policy on the plan's layers, paired
    against the plan's own (dense decoding), each with the share of decoded tokens updated; stored and resumed."""
    from cli_helpers import run_cli

    monkeypatch.chdir(tmp_path)
    text = tmp_path / "calib.txt"
    text.write_text("Some calibration text about many different things. " * 200)
    name = tiny_hf_folder.name
    assert run_cli(capsys, "calibrate", "--model", tiny_hf_folder, "--method", "orthorank", "--calib-data", text,
                   "--calib-samples", "4", "--seq-len", "32", "--threads", "1", "--sparsity", "0.25",
                   "--out", f"plans/{name}", "--no-store")[0] == 0
    argv = ["compare", "--model", tiny_hf_folder, "--methods", "dense,orthorank", "--sparsity", "0.25",
            "--datasets", "wikitext2", "--seq-len", "32", "--max-windows", "3", "--store", "store", "--threads", "1",
            "--continuation", "--policies", "+decode=threshold", "--out", "out", "--overwrite"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "Continuation perplexity" in out and "decoded tokens updated" in out
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert result["scoring"] == "continuation"
    rows = {r["method"]: r for r in result["rows"]}
    own, threshold = rows["orthorank"], rows["orthorank (policy +decode=threshold)"]
    assert own["wikitext2"]["decoded_tokens_updated"] == 1.0
    assert 0.0 <= threshold["wikitext2"]["decoded_tokens_updated"] <= 1.0
    assert own["wikitext2"]["tokens_per_window"] == 16
    assert ("orthorank (policy +decode=threshold)", "orthorank") in {(c["a"], c["b"]) for c in result["comparisons"]}
    assert run_cli(capsys, *argv)[0] == 0  # from the store: the same numbers
    again = {r["method"]: r for r in json.loads((tmp_path / "out" / "compare.json").read_text())["rows"]}
    assert again["orthorank (policy +decode=threshold)"]["wikitext2"] == threshold["wikitext2"]
    assert_user_error(capsys, "drop --no-ppl", *argv[:-3], "--no-ppl", "--zeroshot", "--out", "o2")
