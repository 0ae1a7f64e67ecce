"""Long-prompt settings (issue 45): progressive pruning, depth schedules, the attention window, the tail modifier and
the retrieval frontier's arithmetic."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from cli_helpers import assert_user_error
from conftest import model_signature, prompt_ids, tiny_model
from orthorank.errors import UserError
from orthorank.harness.evaluation import frontier
from orthorank.method import SelectionConfig, apply_orthorank
from orthorank.method import attention
from orthorank.method.apply import apply_plan, restore_dense, selective
from orthorank.method.cost import Arch, removal_sparsity, head_flops, layer_flops, prefill_sparsity
from orthorank.method.plan import Plan
from orthorank.method.policies import parse_variant
from orthorank.method.schedules import PROGRESSIVE_SELECTION, schedule_plan

ATOL = 1e-5






def _hybrid(m, ratios: dict[int, float], selection: SelectionConfig) -> Plan:
    return Plan("hybrid", sorted(ratios), "tiny", model_signature(m), selection=selection, actions=dict(ratios),
                arch=dataclasses.asdict(Arch.from_config(m.config, m.config.num_hidden_layers)))


# -- progressive pruning (LazyLLM-style) ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_progressive_pruning_that_prunes_nothing_equals_dense(family):
    m = tiny_model(family)
    ids = prompt_ids()
    dense = m(ids).logits
    apply_orthorank(m, [1, 2, 3], dataclasses.replace(PROGRESSIVE_SELECTION, ratio=1.0))
    assert torch.allclose(m(ids).logits, dense, atol=ATOL)


def test_progressive_keep_sets_are_nested_and_the_last_token_always_kept():
    m = tiny_model("llama", layers=6)
    ids = prompt_ids(length=48)
    plan = _hybrid(m, {2: 0.8, 3: 0.6, 4: 0.4, 5: 0.3}, PROGRESSIVE_SELECTION)
    apply_plan(m, plan)
    m(ids, use_cache=False)
    keeps = [selective(m.model.layers[i]).last_keep[0] for i in (2, 3, 4, 5)]
    for a, b in zip(keeps, keeps[1:]):
        assert bool((b <= a).all()), "a token pruned in one layer came back in a later one"
    assert all(bool(k[-1]) for k in keeps)
    assert [int(k.sum()) for k in keeps] == [math.ceil(r * 48 - 1e-9) for r in (0.8, 0.6, 0.4, 0.3)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("sink_visible", [True, False])
def test_progressive_gathered_keys_equal_masking_the_pruned_keys(family, sink_visible, monkeypatch):
    """The gathered path (kept keys only: the saving) gives what masking the pruned keys gives (the reference), both
    through the causal kernel (the kept queries plus the visible sink laid out as a causal square) and through the
    general masked call."""
    m = tiny_model(family, layers=5)
    ids = prompt_ids(length=64)
    plan = _hybrid(m, {1: 0.7, 2: 0.5, 3: 0.5, 4: 0.3},
                   dataclasses.replace(PROGRESSIVE_SELECTION, sink_kv_visible=sink_visible))
    calls, causal = [], []
    from orthorank.method import attention_routing

    real, real_causal = attention_routing._pruned_attention, attention._contiguous_causal

    def counted(self, *a, **k):
        calls.append(self.layer_index)
        return real(self, *a, **k)

    def counted_causal(*a, **k):
        out = real_causal(*a, **k)
        causal.append(out is not None)
        return out

    monkeypatch.setattr(attention_routing, "_pruned_attention", counted)
    monkeypatch.setattr(attention, "_contiguous_causal", counted_causal)
    apply_plan(m, plan)
    gathered = m(ids, use_cache=False).logits
    assert calls == [1, 2, 3, 4] and causal == [True] * 4
    restore_dense(m)
    monkeypatch.setattr(attention, "_contiguous_causal", lambda *a: None)
    apply_plan(m, plan)
    general = m(ids, use_cache=False).logits
    restore_dense(m)
    monkeypatch.setattr(attention_routing, "_gathers_keys", lambda sel, call, mask, S: False)
    apply_plan(m, plan)
    masked = m(ids, use_cache=False).logits
    assert torch.allclose(gathered, masked, atol=ATOL), (gathered - masked).abs().max()
    assert torch.allclose(general, masked, atol=ATOL), (general - masked).abs().max()


def test_progressive_cached_generation_sees_every_token_and_equals_uncached_first_token():
    m = tiny_model("llama", layers=4)
    ids = prompt_ids(length=40)
    apply_plan(m, _hybrid(m, {1: 0.6, 2: 0.4, 3: 0.3}, PROGRESSIVE_SELECTION))
    out = m(ids, use_cache=True)
    cache = out.past_key_values
    assert cache.get_seq_length(3) == 40  # pruned tokens' K/V are in the cache: decoding can revive them
    assert torch.allclose(out.logits[:, -1], m(ids, use_cache=False).logits[:, -1], atol=ATOL)


def test_progressive_plans_refuse_rising_ratios_and_threshold_decode():
    m = tiny_model("llama", layers=5)
    with pytest.raises(UserError, match="rise with depth"):
        _hybrid(m, {1: 0.3, 2: 0.5}, PROGRESSIVE_SELECTION)
    with pytest.raises(UserError, match="no threshold decode"):
        SelectionConfig(progressive=True, decode="threshold")


def test_pruned_keys_cost_less_attention_and_the_attention_window_costs_its_queries():
    arch = Arch(num_layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)
    m = tiny_model("llama", layers=4)
    sel = dataclasses.replace(PROGRESSIVE_SELECTION, ratio=1.0)
    masked = Plan("orthorank", [1, 2], "tiny", model_signature(m), selection=dataclasses.replace(sel, ratio=0.5,
                  progressive=False), arch=dataclasses.asdict(arch))
    pruned = dataclasses.replace(masked, selection=dataclasses.replace(sel, ratio=0.5))
    for T in (512, 8192):
        assert pruned.compute_sparsity(seq_len=T) > masked.compute_sparsity(seq_len=T)
    wide = dataclasses.replace(masked, selection=dataclasses.replace(masked.selection, attention_window=256))
    assert wide.compute_sparsity(seq_len=4096) < masked.compute_sparsity(seq_len=4096)  # 256 queries vs 1


# -- schedules -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", [49152, 262144])
def test_prefill_share_prices_the_head_once_per_prompt(vocab):
    """Time to first token runs the LM head on the last position only: removing 6 of 30 equal layers skips
    6 / (30 + head / (n * layer)) of the prefill, more than the per-token share and at most 6 / 30."""
    arch = Arch(num_layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=vocab)
    n = 4096
    per_token = removal_sparsity(arch, n, 6)
    layer = layer_flops(arch, n).dense
    expected = 6 * layer / (30 * layer + head_flops(arch) / n)
    assert prefill_sparsity(arch, n, per_token) == pytest.approx(expected, rel=1e-9)
    assert per_token < prefill_sparsity(arch, n, per_token) < 0.2
    assert prefill_sparsity(arch, n, 0.0) == 0.0


@pytest.mark.parametrize("kind", ["depth", "progressive"])
@pytest.mark.parametrize("seq_len", [512, 8192])
def test_schedules_skip_the_target_compute_and_keep_early_layers_dense(kind, seq_len):
    arch = Arch(num_layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)
    target = removal_sparsity(arch, seq_len, 6)
    plan = schedule_plan(kind, "m", {"num_layers": 30}, arch, target, seq_len)
    assert abs(plan.compute_sparsity(arch, seq_len) - target) < 2e-3
    assert min(plan.layers) >= 7 and not plan.removed_layers
    ratios = [c.ratio for c in plan.selection_layers.values()]
    if kind == "progressive":
        assert ratios == sorted(ratios, reverse=True) and plan.selection.progressive
    else:
        assert len(set(ratios)) == 1 and max(plan.layers) == 28
    with pytest.raises(UserError, match="cannot skip"):
        schedule_plan(kind, "m", {"num_layers": 30}, arch, 0.95, seq_len)


# -- the tail modifier and the question-scored policy ---------------------------------------------------------------

def test_the_tail_modifier_never_changes_compute_or_the_number_updated():
    m = tiny_model("llama", layers=4)
    ids = prompt_ids(length=40)
    arch = dataclasses.asdict(Arch.from_config(m.config, 4))
    counts = {}
    for w in (0, 8, 40):
        plan = Plan("orthorank", [1, 2], "tiny", model_signature(m), selection=SelectionConfig(ratio=0.3, keep_recent=w),
                    arch=arch)
        counts[w] = plan.compute_sparsity(seq_len=40)
        apply_plan(m, plan)
        m(ids, use_cache=False)
        keep = selective(m.model.layers[1]).last_keep[0]
        assert int(keep.sum()) == 12
        if 0 < w <= 12:
            assert bool(keep[-w:].all())  # the tail first, within K
        restore_dense(m)
    assert counts[0] == counts[8] == counts[40]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_question_scored_selection_with_the_tail_equal_to_the_prompt_equals_dense(family):
    """The observation window and the always-updated tail both the whole prompt, with K covering it: dense."""
    m = tiny_model(family)
    ids = prompt_ids(length=32)
    dense = m(ids).logits
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=1.0, policy="attention", attention_window=32, keep_recent=32))
    assert torch.allclose(m(ids).logits, dense, atol=ATOL)


def test_attention_window_modifier_parses_and_belongs_to_attention_policies():
    assert parse_variant("attention+window=64") == {"policy": "attention", "attention_window": 64}
    with pytest.raises(UserError, match="attention window belongs"):
        SelectionConfig(policy="orthogonal", attention_window=8)
    assert "attention_window" not in SelectionConfig().to_dict()  # stored results before it keep their keys
    assert "progressive" not in SelectionConfig().to_dict()


def test_attention_window_one_ranks_by_the_last_token_alone():
    """Reference: the dense model's own attention of the last query (eager), the sink last."""
    m = tiny_model("llama", attn="eager")
    ids = prompt_ids(length=40, seed=9)
    probs = m(ids, output_attentions=True).attentions[2][0, :, -1, :].sum(0)  # [T]
    probs[0] = -1.0
    expected = sorted(torch.argsort(probs, descending=True)[:10].tolist())
    apply_orthorank(m, [2], SelectionConfig(ratio=0.25, policy="attention", attention_window=1))
    m(ids, use_cache=False)
    keep = selective(m.model.layers[2]).last_keep[0]
    assert sorted(torch.nonzero(keep).squeeze(1).tolist()) == expected


# -- the frontier's arithmetic -------------------------------------------------------------------------------------

def _point(name, method, speed, mean, diff_low, diff_high, low=None, high=None):
    return frontier.Point(name, method, 0.1, {"value": speed, "low": speed - 0.05, "high": speed + 0.05, "n": 5},
                          {"mean": mean, "low": mean - 10 if low is None else low,
                           "high": mean + 10 if high is None else high, "n": 20,
                           "diff": {"value": (diff_low + diff_high) / 2, "low": diff_low, "high": diff_high}})


def _paired_point(name, method, speed, both, only_dense, only_setting, neither):
    from orthorank.harness.evaluation.noninferiority import decide

    setting = [1] * both + [0] * only_dense + [1] * only_setting + [0] * neither
    dense = [1] * both + [1] * only_dense + [0] * only_setting + [0] * neither
    n = len(dense)
    return frontier.Point(name, method, 0.1, {"value": speed, "low": speed - 0.05, "high": speed + 0.05, "n": 5},
                          {"mean": 100 * sum(setting) / n, "low": 0.0, "high": 100.0, "n": n,
                           "diff": {"value": 0.0, "low": -1.0, "high": 1.0},
                           "verdict": decide(setting, dense).to_dict()})


def test_best_speedups_come_from_the_non_inferiority_rule():
    dense = frontier.Point("dense", "dense", 0.0, {"value": 1.0, "low": 1.0, "high": 1.0, "n": 5},
                           {"mean": 67.3, "low": 62.0, "high": 72.0, "n": 300})
    points = [dense,
              _paired_point("a 0.1", "a", 1.10, 200, 2, 1, 97),  # passes
              _paired_point("a 0.2", "a", 1.30, 200, 3, 0, 97),  # passes: 3 losses in 300 exclude a 5-point loss
              _paired_point("a 0.3", "a", 1.50, 200, 20, 0, 80),  # a loss beyond the margin is not excluded
              _point("b 0.1", "b", 1.20, 50.0, -2.0, 2.0),  # an older file's point: means only, never passes
              ]
    best = frontier.free_speedups(points)
    assert best["a"]["point"] == "a 0.2" and best["a"]["speedup"]["value"] == 1.30
    assert best["b"] is None
    text = frontier.table(points, 4096, "caption")
    assert "| a | 1.300 [1.250, 1.350]x | a 0.2 |" in text and "| b | none |" in text
    assert "| 20 / 0 | no: a loss beyond 5 points" in text  # discordant pairs in every row


def test_frontier_command_refuses_bad_input_before_loading(capsys, tiny_hf_folder, tmp_path):
    assert_user_error(capsys, "--levels must be", "frontier", "--model", str(tiny_hf_folder), "--levels", "0.3,x",
                      "--out", str(tmp_path / "f"))
    assert_user_error(capsys, "unknown method 'nope'", "frontier", "--model", str(tiny_hf_folder), "--methods",
                      "dense,nope", "--out", str(tmp_path / "f"))
    assert_user_error(capsys, "from its search order", "frontier", "--model", str(tiny_hf_folder), "--methods",
                      "dense,hybrid", "--out", str(tmp_path / "f"))
    assert_user_error(capsys, "--repeats must be at least 2", "frontier", "--model", str(tiny_hf_folder),
                      "--methods", "dense,depth", "--repeats", "1", "--out", str(tmp_path / "f"))
    assert_user_error(capsys, "leave it out with --score-on calibration", "frontier", "--model", str(tiny_hf_folder),
                      "--methods", "dense,depth", "--score-on", "calibration", "--longbench", "2",
                      "--out", str(tmp_path / "f"))


# -- calibration prompts for the tail: never the evaluation text ---------------------------------------------------

@pytest.mark.data
@pytest.mark.parametrize("length", [1024, 8192])  # at 8k, WikiText-2's calibration part once reached 34%
def test_no_calibration_prompt_shares_text_with_an_evaluation_sample(length):
    from types import SimpleNamespace

    from orthorank.harness.api.frontier import _items, calibration_items, largest_shared
    from orthorank.harness.evaluation.longctx_suite import SuiteBuilder, load_pools
    from orthorank.harness.evaluation.overlap import MAX_SHARED
    from orthorank.models.loading import embedded_gguf_path
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tasks = ["niah_single", "niah_multikey"]
    ev = _items(SuiteBuilder(tok, load_pools(), seed=0), tok, tasks, length, 4)
    cal = calibration_items(SimpleNamespace(tokenizer=tok), tasks, length, 4, None)
    assert {it.key for it in cal}.isdisjoint(it.key for it in ev)
    shared = largest_shared(ev, cal)
    assert shared < 0.05 < MAX_SHARED, shared  # the tasks' templates only
    assert largest_shared(ev, ev) == 1.0  # the check sees copied text


# -- the preset: chosen from frontier files, built for the prompt ---------------------------------------------------

def _free(level, speed):
    return {"point": f"x {level}", "level": level, "speedup": {"value": speed, "low": speed - 0.1, "high": speed + 0.1},
            "compute": 0.1, "score": {"mean": 50.0}}


def test_the_preset_is_the_best_free_speedup_across_models_and_lengths():
    from orthorank.harness.study.presets import choose, parse_family

    a = {"model": "a", "scored_on": "calibration", "lengths": {"4096": {"free_speedups": {"sleb": _free(0.05, 1.10), "depth[+recent=64]":
                                                               _free(0.1, 1.30), "progressive": None}},
                                   "8192": {"free_speedups": {"sleb": _free(0.1, 1.20), "depth[+recent=64]":
                                                               _free(0.15, 1.25), "progressive": _free(0.2, 1.6)}}}}
    b = {"model": "b", "scored_on": "calibration", "lengths": {"8192": {"free_speedups": {"sleb": None, "depth[+recent=64]": _free(0.05, 1.12),
                                                               "progressive": _free(0.1, 1.4)}}}}
    preset = choose({"a": a, "b": b}, "long-prompt")
    # progressive is faster where free but has no free point at 4k on model a; depth with its tail is free everywhere
    assert (preset.method, preset.tail, preset.policy, preset.level) == ("depth", 64, None, 0.05)
    assert preset.min_length == 4096  # the shortest length it was measured at
    assert preset.evidence["free_everywhere"]["depth[+recent=64]"] == {
        "geometric_mean": round((1.30 * 1.25 * 1.12) ** (1 / 3), 4), "smallest": 1.12}
    assert preset.evidence["not_free_somewhere"] == ["progressive", "sleb"]
    # free everywhere, one model at 1.0 give or take timing noise: the geometric mean decides, not the noise
    c = {"model": "c", "scored_on": "calibration", "lengths": {"4096": {"free_speedups": {
        "local": _free(0.05, 0.98), "sleb": _free(0.05, 1.05)}}, "8192": {"free_speedups": {
        "local": _free(0.3, 1.8), "sleb": None}}}}
    assert choose({"c": c}, "p").method == "local"
    slow = {"model": "c", "scored_on": "calibration", "lengths": {"4096": {"free_speedups": {
        "local": _free(0.05, 0.98)}}}}
    assert choose({"c": slow}, "p").method == "dense"  # free everywhere, faster nowhere on balance
    assert parse_family("orthorank[attention+window=64]") == ("orthorank", "attention+window=64", 0)
    none = choose({"b": {"model": "b", "scored_on": "calibration", "lengths": {"8192": {"free_speedups": {"sleb": None}}}}},
                  "long-prompt")
    assert none.method == "dense" and "no setting" in none.evidence["reason"]


def test_a_preset_is_never_chosen_on_evaluation_samples(tmp_path, capsys):
    import json

    from orthorank.harness.study.presets import choose, main

    entry = {"8192": {"free_speedups": {"local": _free(0.1, 1.5)}}}
    for scored_on in ({}, {"scored_on": "evaluation"}):
        with pytest.raises(UserError, match="chosen on calibration prompts only"):
            choose({"m": {"model": "m", **scored_on, "lengths": entry}}, "p")
    (tmp_path / "f.json").write_text(json.dumps({"model": "m", "lengths": entry}))
    assert main([str(tmp_path / "f.json"), "--out", str(tmp_path / "p.json")]) == 2
    assert "calibration prompts only" in capsys.readouterr().err and not (tmp_path / "p.json").exists()


def _json_point(method, level, free, at_reach=False):
    return {"name": f"{method} {level}", "method": method, "level": level, "free": free,
            "extra": {"plan": {"provenance": {"at_most_reach": True} if at_reach else {}}}}


def test_the_preset_level_is_the_highest_free_measured_and_a_schedule_at_its_reach_does_not_lower_it():
    from orthorank.harness.study.presets import choose, free_through

    # a: local free at every level measured, the last with every layer it may use; b: free through 0.1, lost at
    # 0.2; c: free at every level measured (to 0.2), short of its reach
    a = {"points": [_json_point("local", 0.05, True), _json_point("local", 0.1, True, at_reach=True)],
         "free_speedups": {"local": _free(0.1, 1.5)}}
    b = {"points": [_json_point("local", 0.05, True), _json_point("local", 0.1, True),
                    _json_point("local", 0.2, False)],
         "free_speedups": {"local": _free(0.05, 1.06)}}
    c = {"points": [_json_point("local", s, True) for s in (0.1, 0.2)], "free_speedups": {"local": _free(0.2, 1.3)}}
    assert free_through(a, "local") is None and free_through(b, "local") == 0.1 and free_through(c, "local") == 0.2

    def files(*entries):
        return {f"m{i}": {"model": f"m{i}", "scored_on": "calibration", "lengths": {"8192": e}}
                for i, e in enumerate(entries)}

    assert (choose(files(a, b), "p").method, choose(files(a, b), "p").level) == ("local", 0.1)
    assert choose(files(a, c), "p").level == 0.2
    assert choose(files(a), "p").level == 0.1  # bounded nowhere: its highest free level


def test_the_frontier_summary_judges_the_bar_from_the_interval(tmp_path):
    import json

    from orthorank.harness.study.frontier_summary import bar_verdict, main

    assert bar_verdict({"value": 1.4, "low": 1.3, "high": 1.5}, 1.25) == "above"
    assert bar_verdict({"value": 1.3, "low": 1.1, "high": 1.5}, 1.25) == "not decided"
    assert bar_verdict({"value": 1.1, "low": 1.0, "high": 1.2}, 1.25) == "below"

    def point(name, method, level, free, speed, diff):
        return {"name": name, "method": method, "level": level, "free": free, "layers": 3, "compute": 0.2,
                "ideal_speedup": 1.25, "speedup": {"value": speed, "low": speed - 0.05, "high": speed + 0.05},
                "score": {"n": 20, "mean": 60.0 + diff, "low": 40.0, "high": 80.0,
                          "diff": {"value": diff, "low": diff - 10, "high": min(0.0, diff + 10)}}}

    pts = [point("dense", "dense", None, True, 1.0, 0.0), point("sleb 0.1", "sleb", 0.1, False, 1.1, -30.0),
           point("local 0.1", "local", 0.1, True, 1.2, 0.0), point("local 0.2", "local", 0.2, True, 1.4, 0.0)]
    entry = {"points": pts, "free_speedups": {"sleb": None, "local": {"point": "local 0.2", "level": 0.2,
                                                                        "speedup": pts[3]["speedup"]}}}
    f = tmp_path / "frontier.json"
    f.write_text(json.dumps({"model": "m", "repeats": 5, "complete": True, "lengths": {"8192": entry}}))
    out = tmp_path / "summary.md"
    assert main([str(f), "--out", str(out)]) == 0
    text = out.read_text()
    assert f"| m | 8192 | {tmp_path.name} | 20 (12) | local | 1.400 [1.350, 1.450]x | local 0.2 | - | above |" in text
    head = tmp_path / "headline.md"
    assert main([str(f), "--headline", str(head), "--preset", "", "--headline-runs", "/suite/"]) == 2  # none match
    assert main([str(f), "--headline", str(head), "--preset", "", "--headline-runs", tmp_path.name]) == 0
    assert "| 20 (12) | local |" in head.read_text()
    assert "| sleb | none | - | - | - | - | sleb 0.1: -30.0 [-40.0, -20.0] |" in text
    f.write_text(json.dumps({"model": "m", "complete": False, "lengths": {}}))
    assert main([str(f)]) == 2
    from orthorank.harness.study.frontier_summary import run_label
    assert run_label("studies/long-prompt/preset-check/m/4096/frontier.json", {"model": "m"}) == "preset-check 4096"
    assert run_label("studies/long-prompt/m/8k/frontier.json", {"model": "m"}) == "8k"


def test_a_preset_builds_its_plan_for_the_prompt_length_with_its_tail(tmp_path, monkeypatch, capsys, tiny_hf_folder):
    import json

    from cli_helpers import run_cli
    from orthorank.method import presets
    from orthorank.method.presets import Preset, preset_plan

    arch = Arch(num_layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)
    preset = Preset("long-prompt", "depth", 0.1, 16)
    plan = preset_plan(preset, "m", {"num_layers": 30}, arch, 4096)
    assert plan.selection.keep_recent == 16 and plan.provenance["preset"] == "long-prompt"
    assert abs(plan.compute_sparsity(arch, 4096) - removal_sparsity(arch, 4096, 3)) < 2e-3
    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path)
    (tmp_path / "long-prompt.json").write_text(json.dumps(Preset("long-prompt", "progressive", 0.2).to_dict()))
    code, out, err = run_cli(capsys, "generate", "--model", str(tiny_hf_folder), "--preset", "long-prompt",
                             "--prompt", "The quick brown fox jumps over the lazy dog " * 4, "--max-new-tokens", "3")
    assert code == 0, err
    assert "preset long-prompt: progressive at 0.2" in err
    assert_user_error(capsys, "unknown preset 'nope'; choose one of long-prompt", "generate", "--model",
                      str(tiny_hf_folder), "--preset", "nope", "--prompt", "hi")


@pytest.mark.data
def test_frontier_end_to_end_on_a_tiny_model_with_longbench_on_the_free_points(capsys, tiny_hf_folder, tmp_path):
    import json

    from cli_helpers import run_cli
    from orthorank.harness.evaluation.frontier import Point, is_free

    args = ["frontier", "--model", str(tiny_hf_folder), "--methods", "dense,depth,progressive", "--levels", "0.2",
            "--lengths", "256", "--tasks", "niah_single", "--samples", "2", "--repeats", "2", "--threads", "1",
            "--longbench", "1", "--longbench-new-tokens", "4", "--store", str(tmp_path / "store"),
            "--tails", "0,8", "--calib-samples", "1", "--out", str(tmp_path / "f")]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    data = json.loads((tmp_path / "f" / "frontier.json").read_text())
    entry = data["lengths"]["256"]
    dense = entry["points"][0]
    assert dense["method"] == "dense" and data["complete"]
    assert "largest_shared_with_evaluation" in entry["tails"]  # the calibration prompts were built and checked
    for method in {p["method"] for p in entry["points"]} & {"depth"}:
        assert entry["tails"][method]["tail"] in (0, 8)
    for p in entry["points"]:
        point = Point(p["name"], p["method"], p["compute"], p["speedup"], p["score"], level=p["level"])
        assert p["free"] == is_free(point, Point("dense", "dense", 0.0, dense["speedup"], dense["score"]))
        assert p["ideal_speedup"] == pytest.approx(1 / (1 - p["compute"]), rel=1e-3)
        assert len(p["extra"]["times_s"]) == 2
    assert "dense" in entry["longbench"]["rows"] and entry["longbench"]["new_tokens"] == 4
    saved = sorted(p.name for p in (tmp_path / "f" / "plans").iterdir())
    assert saved == ["256-depth-0.2.json", "256-progressive-0.2.json"] or "256-progressive-0.2.json" in saved
    assert "LongBench multi_news on the free points" in (tmp_path / "f" / "frontier.md").read_text()
    stored = sorted((tmp_path / "store").rglob("e-*.json"))
    code, out, err = run_cli(capsys, *args, "--overwrite")  # every generation comes back from the store
    assert code == 0 and sorted((tmp_path / "store").rglob("e-*.json")) == stored


@pytest.mark.data
def test_a_frontier_scored_on_calibration_prompts_chooses_a_preset(capsys, tiny_hf_folder, tmp_path):
    import json

    from cli_helpers import run_cli
    from orthorank.harness.study.presets import main as choose_preset

    code, out, err = run_cli(capsys, "frontier", "--model", str(tiny_hf_folder), "--methods", "dense,progressive",
                             "--levels", "0.2", "--lengths", "256", "--tasks", "niah_single", "--samples", "2",
                             "--repeats", "2", "--threads", "1", "--score-on", "calibration",
                             "--store", str(tmp_path / "store"), "--out", str(tmp_path / "f"))
    assert code == 0, err
    data = json.loads((tmp_path / "f" / "frontier.json").read_text())
    assert data["scored_on"] == "calibration"
    from orthorank.harness.evaluation.overlap import MAX_SHARED
    assert data["lengths"]["256"]["largest_shared_with_evaluation"] < MAX_SHARED  # checked: templates only
    assert "calibration prompts: the tasks built from" in (tmp_path / "f" / "frontier.md").read_text()
    assert choose_preset([str(tmp_path / "f" / "frontier.json"), "--out", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["name"] == "long-prompt"


@pytest.mark.data
def test_the_frontier_checks_a_preset_with_its_own_row(capsys, tiny_hf_folder, tmp_path, monkeypatch):
    import json

    from cli_helpers import run_cli
    from orthorank.method import presets
    from orthorank.method.presets import Preset

    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path / "presets")
    (tmp_path / "presets").mkdir()
    assert_user_error(capsys, "unknown preset 'long-prompt'", "frontier", "--model", str(tiny_hf_folder),
                      "--methods", "dense", "--preset", "long-prompt", "--out", str(tmp_path / "f"))
    (tmp_path / "presets" / "long-prompt.json").write_text(
        json.dumps(Preset("long-prompt", "progressive", 0.2, 8).to_dict()))
    args = ["frontier", "--model", str(tiny_hf_folder), "--methods", "dense", "--preset", "long-prompt",
            "--lengths", "256", "--tasks", "niah_single", "--samples", "1", "--repeats", "2", "--threads", "1",
            "--store", str(tmp_path / "store"), "--out", str(tmp_path / "f")]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    points = json.loads((tmp_path / "f" / "frontier.json").read_text())["lengths"]["256"]["points"]
    assert [p["name"] for p in points] == ["dense", "preset long-prompt"]
    plan = points[1]["extra"]["plan"]
    assert plan["provenance"]["preset"] == "long-prompt" and plan["selection"]["keep_recent"] == 8
    (tmp_path / "presets" / "long-prompt.json").write_text(json.dumps(Preset("long-prompt", "dense").to_dict()))
    code, out, err = run_cli(capsys, *args, "--overwrite")
    assert code == 0 and "preset is dense here" in out
    points = json.loads((tmp_path / "f" / "frontier.json").read_text())["lengths"]["256"]["points"]
    assert [p["name"] for p in points] == ["dense"]


def test_stop_after_loss_leaves_out_the_levels_above_a_loss(monkeypatch):
    from orthorank.harness.api import frontier as api_frontier
    from orthorank.harness.api.options import FrontierOptions
    from orthorank.harness.evaluation.longctx import Row

    m = tiny_model("llama")
    dense = Plan("dense", [], "tiny", model_signature(m))
    rows = [Row("dense", "dense", None, dense)] + [Row(f"{meth} {s:g}", meth, s, dense)
                                                   for meth in ("sleb", "local") for s in (0.05, 0.1, 0.2)]
    right = [1.0] * 10 + [0.0] * 10
    got = {"dense": right, "sleb 0.05": [0.0] * 20, "local 0.05": right, "local 0.1": right,
           "local 0.2": [1.0] * 5 + [0.0] * 15}
    calls = []

    def fake_scores(opts, lm, rs, items, settings):
        calls.extend(r.name for r in rs)
        return {r.name: {f"k{i:02d}": {"score": v} for i, v in enumerate(got[r.name])} for r in rs}

    monkeypatch.setattr(api_frontier, "_scores", fake_scores)
    opts = FrontierOptions(model="x", out="o", stop_after_loss=True)
    scores, left_out = api_frontier._scores_until_loss(opts, None, rows, [], {})
    assert left_out == {"sleb 0.1": "sleb 0.05", "sleb 0.2": "sleb 0.05"}
    assert "sleb 0.1" not in calls and set(scores) == {"dense", "sleb 0.05", "local 0.05", "local 0.1", "local 0.2"}
    assert api_frontier.lost(scores["sleb 0.05"], scores["dense"])
    assert not api_frontier.lost(scores["local 0.1"], scores["dense"])
    opts = FrontierOptions(model="x", out="o")
    calls.clear()
    got.update({"sleb 0.1": [0.0] * 20, "sleb 0.2": [0.0] * 20})
    assert set(api_frontier._scores_until_loss(opts, None, rows, [], {})[0]) == {r.name for r in rows}


@pytest.fixture(scope="module")
def tiny_long_folder(tmp_path_factory, tiny_hf_folder):
    """The tiny Llama of tiny_hf_folder with a 1,024-token context, so the suite's tasks fit."""
    from conftest import tiny_model
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_hf_folder))
    folder = tmp_path_factory.mktemp("tiny-long")
    tiny_model(layers=4, vocab_size=len(tok), pad_token_id=tok.eos_token_id,
               max_position_embeddings=1024).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.data
def test_frontier_on_the_suite_with_layouts_chat_and_spans_stores_verdicts(capsys, tiny_long_folder, tmp_path):
    """Every task in every layout, with and without the chat template, local attention with other global spans: each
    row's verdict comes from its paired items, with the task and layout groups, and the table gives the discordant
    pairs."""
    import json

    from cli_helpers import run_cli

    args = ["frontier", "--model", str(tiny_long_folder), "--methods", "dense,local", "--levels", "0.2",
            "--lengths", "640", "--tasks", "niah_single_noise,niah_multiquery", "--layouts", "last,first", "--chat", "both",
            "--spans", "48:32", "--samples", "1", "--repeats", "2", "--threads", "1",
            "--store", str(tmp_path / "store"), "--out", str(tmp_path / "f")]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    data = json.loads((tmp_path / "f" / "frontier.json").read_text())
    entry = data["lengths"]["640"]
    names = [p["name"] for p in entry["points"]]
    assert names[0] == "dense" and any("[head=48+tail=32]" in n for n in names)
    for p in entry["points"][1:]:
        v = p["score"]["verdict"]
        assert v["n"] == 8 and not v["passes"] and "too few items" in v["reason"]  # 8 items decide nothing
        assert {"task=niah_multiquery", "layout=first", "chat=on"} <= set(v["groups"])
    span = next(p for p in entry["points"] if "[head=48+tail=32]" in p["name"])
    assert span["extra"]["plan"]["attention"]["head"] == 48 and span["extra"]["plan"]["attention"]["tail"] == 32
    md = (tmp_path / "f" / "frontier.md").read_text()
    assert "only dense / only it" in md and "| task=niah_multiquery | 4 |" in md  # the per-group table
    assert data["layouts"] == ["last", "first"] and data["chat"] == "both"


def test_a_preset_records_where_it_was_chosen_and_runs_dense_elsewhere(tmp_path):
    import json

    from orthorank.method.presets import Preset, preset_plan
    from orthorank.method.cost import Arch

    m = tiny_model("llama", layers=6)
    arch = Arch.from_config(m.config, 6)
    preset = Preset("long-prompt", "local", 0.4, min_length=512, global_head=32, global_tail=16,
                    models=["tiny"], max_length=1024)
    plan = preset_plan(preset, "tiny", model_signature(m), arch, 1024)
    assert plan.method == "local" and plan.attention.head == 32 and plan.attention.tail == 16
    assert preset_plan(preset, "other", model_signature(m), arch, 1024).method == "dense"  # not chosen on it
    assert preset_plan(preset, "tiny", model_signature(m), arch, 4096).method == "dense"  # not measured there
    for bad in ({"models": "tiny"}, {"max_length": "8k"}, {"global_head": -1}):
        data = {**Preset("p", "local", 0.4).to_dict(), **bad}
        with pytest.raises(UserError, match="malformed"):
            Preset.from_dict(json.loads(json.dumps(data)), "preset file p.json")
