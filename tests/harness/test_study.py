"""`orthorank study`: verdicts follow the intervals, the whole study runs end to end on a tiny model and resumes,
its report renders, and a summary joins two studies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orthorank.method.plan import Plan

from cli_helpers import assert_user_error, run_cli
from orthorank.harness.evaluation.claims import (
    CONTRADICTED, INCONCLUSIVE, NO_DIFFERENCE, SUPPORTED, perplexity_claims, speed_claims, verdict,
)


def test_verdicts_come_from_the_interval():
    assert verdict(0.90, 0.98, "lower", 1.0) == SUPPORTED
    assert verdict(1.01, 1.10, "lower", 1.0) == CONTRADICTED
    assert verdict(0.95, 1.05, "lower", 1.0) == NO_DIFFERENCE
    assert verdict(0.5, 2.0, "higher", 0.0) == SUPPORTED
    assert verdict(-2.0, -0.5, "higher", 0.0) == CONTRADICTED
    assert verdict(-2.0, 0.5, "higher", 0.0) == NO_DIFFERENCE
    assert verdict(0.95, 1.04, "equivalent", 1.0) == SUPPORTED  # inside +-10%
    assert verdict(0.70, 0.85, "equivalent", 1.0) == CONTRADICTED  # wholly outside
    assert verdict(0.85, 1.00, "equivalent", 1.0) == INCONCLUSIVE  # across an edge
    assert verdict(float("nan"), 1.0, "lower", 1.0) == INCONCLUSIVE


def test_constructed_comparisons_give_each_verdict(tmp_path):
    data = {"windows": {"wikitext2": 8, "code": 8, "c4": 8}, "seq_len": 256, "comparisons": [
        {"a": "orthorank", "a_level": 0.2, "b": "sleb", "b_level": 0.2, "dataset": "wikitext2", "ratio": 0.9,
         "ci95": [0.85, 0.95]},
        {"a": "orthorank", "a_level": 0.2, "b": "sleb", "b_level": 0.2, "dataset": "code", "ratio": 1.1,
         "ci95": [1.05, 1.15]},
        {"a": "orthorank", "a_level": 0.2, "b": "sleb", "b_level": 0.2, "dataset": "c4", "ratio": 1.0,
         "ci95": [0.97, 1.03]},
        # ablated / method above 1: the method (orthogonal) is better than random
        {"a": "orthorank (random)", "a_level": 0.2, "b": "orthorank", "b_level": 0.2, "dataset": "c4",
         "ratio": 1.25, "ci95": [1.2, 1.3]},
        {"a": "sleb", "a_level": 0.2, "b": "dense", "b_level": 0.0, "dataset": "c4", "ratio": 2.0, "ci95": [1.9, 2.1]},
    ]}
    claims = {(c.group, c.setting): c for c in perplexity_claims(data, (0.2,))}
    assert claims[("perplexity", "0.2 on wikitext2")].verdict == SUPPORTED
    assert claims[("perplexity", "0.2 on code")].verdict == CONTRADICTED
    assert claims[("perplexity", "0.2 on c4")].verdict == NO_DIFFERENCE
    random = claims[("ablation", "0.2 on c4")]
    assert random.verdict == SUPPORTED and random.value == pytest.approx(0.8) and random.high < 1
    assert len(claims) == 4  # pruning against dense is not a claim of the paper
    # the same, as the Markdown a page quotes: every domain, and each claim at its least favourable one
    from orthorank.harness.evaluation.claims import main as claims_main

    src = tmp_path / "compare.json"
    src.write_text(json.dumps({**data, "model": "m", "datasets": ["wikitext2", "code", "c4"], "skip_windows": 8}))
    assert claims_main([str(src), "--levels", "0.2", "--out", str(tmp_path / "claims")]) == 0
    headline = (tmp_path / "claims" / "claims-headline.md").read_text()
    assert "windows 9-16" in headline and "0.2 on code" in headline and "contradicted" in headline
    assert "0.2 on wikitext2" not in headline  # the least favourable domain only
    assert (tmp_path / "claims" / "claims.md").read_text().count("| perplexity |") == 3


def test_speed_claim_pairs_repeats():
    def run(times_o, times_s):
        return {"runs": [{"mode": "prefill", "batch": 1, "seq_len": 512, "methods": [
            {"method": "sleb", "timing": {"times_s": times_s}}, {"method": "orthorank", "timing": {"times_s": times_o}}]}]}

    same = speed_claims(run([1.0, 1.01, 0.99, 1.0, 1.02, 1.0], [1.0, 1.0, 1.0, 1.01, 1.0, 1.0]), 0.2)[0]
    assert same.verdict == SUPPORTED
    slow = speed_claims(run([2.0, 2.1, 1.9, 2.0, 2.05, 2.0], [1.0, 1.0, 1.0, 1.01, 1.0, 1.0]), 0.2)[0]
    assert slow.verdict == CONTRADICTED and slow.value < 0.6


@pytest.fixture(scope="module")
def tiny_long_folder(tmp_path_factory):
    """A tiny random Llama with the embedded tokenizer and a 1K context (the long-input stage needs 512 tokens)."""
    from conftest import tiny_model
    from transformers import AutoTokenizer

    from orthorank.models.gguf import converted_folder
    from orthorank.models.loading import embedded_gguf_path

    tok = AutoTokenizer.from_pretrained(str(converted_folder(embedded_gguf_path())))
    folder = tmp_path_factory.mktemp("tiny-study")
    tiny_model(layers=4, vocab_size=len(tok), pad_token_id=tok.eos_token_id,
               max_position_embeddings=1024).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.data
def test_study_end_to_end_resumes_and_summarizes(capsys, tiny_long_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # plans/<model>/ is kept under the current folder
    out = tmp_path / "study"
    code, stdout, err = run_cli(capsys, "study", "--model", tiny_long_folder, "--budget", "test", "--out", out,
                                "--threads", "1")
    assert code == 0, err
    study = json.loads((out / "study.json").read_text())
    assert study["finished"] == ["sink", "plans", "perplexity", "zeroshot", "longctx", "speed", "decode", "router",
                                 "decode-router"]
    assert study["skipped"] == ["hybrid", "transfer", "policies", "long-prompt"]  # not in the test budget; run
    # only when named
    groups = {c["group"] for c in study["claims"]}
    assert groups == {"perplexity", "ablation", "zero-shot", "long inputs", "speed", "router"}
    router = Plan.load(tmp_path / "plans" / tiny_long_folder.name / "router-0.2.json")
    # the fit keeps its router only where it beat the paper's rule on held-out calibration windows
    kept = router.provenance["router_fit"]["kept"]
    nll = router.provenance["router_fit"]["held_out_nll"]
    assert kept == ("router" if nll["router"] < nll["orthogonal"] else "orthogonal") == router.selection.policy
    assert kept == "orthogonal" or router.selection.fitted.layer_indices == router.layers
    assert {c["claim"] for c in study["claims"] if c["group"] == "router"} == {
        "the router's perplexity is below sleb's",
        "the router's perplexity is below the paper's rule's (same layers, same compute)"}
    for c in study["claims"]:  # every verdict is the interval's
        assert c["low"] <= c["value"] <= c["high"] or c["group"] == "speed"
        assert c["verdict"] == verdict(c["low"], c["high"], c["better"], c["null"])
    assert (tmp_path / "plans" / tiny_long_folder.name / "orthorank-0.2.json").is_file()
    page = (out / "report.html").read_text()
    assert "Claims of the paper, tested" in page and "<script" not in page and "http" not in page.split("<body>")[1]
    assert "budget test" in page and "Decode policies: continuation perplexity" in page
    decode = json.loads((out / "decode" / "compare.json").read_text())
    assert decode["scoring"] == "continuation" and "orthorank (policy +decode=threshold)" in {
        r["method"] for r in decode["rows"]}
    # each result file names the command that made it; the study's own file names the study
    assert decode["environment"]["command_line"].startswith("orthorank compare --model ")
    assert study["environment"]["command_line"].startswith("orthorank study --model ")
    speed = json.loads((out / "speed" / "bench-0.2.json").read_text())
    decoded = {m["method"]: m for r in speed["runs"] if r["mode"] == "decode" for m in r["methods"]}
    assert decoded["orthorank [+decode=threshold]"]["ideal_speedup"] is not None
    # the decode-router stage: a causal plan (a router forced on the layers where the fit declined it), its
    # comparison and batch-1 decode timing, and the answer by the rule of harness/reports/decode_router.py
    causal = Plan.load(tmp_path / "plans" / tiny_long_folder.name / "router-causal-0.2.json")
    assert causal.selection.policy == "router" and causal.selection.decode == "causal"
    forced = tmp_path / "plans" / tiny_long_folder.name / "router-forced-0.2.json"
    assert forced.is_file() == (kept == "orthogonal")
    answer = json.loads((out / "decode-router" / "decode-router.json").read_text())["levels"]
    assert [a["level"] for a in answer] == ["0.2"] and answer[0]["answer"] in ("yes", "no", "not decided")
    assert answer[0]["decode"][0]["batch"] == 1 and "vs_sleb" in answer[0]["decode"][0]
    # two timed runs, the second a replicate, as the rule's "in every run" needs
    assert [d.get("replicate") for d in answer[0]["decode"]] == [False, True]
    assert (out / "decode-router" / "replicate" / "bench-decode-0.2-b1-n4.json").is_file()
    assert "The causal router (beyond the paper)" in page and "Better than SLEB at SLEB" in page

    code, stdout, err = run_cli(capsys, "study", "--model", tiny_long_folder, "--budget", "test", "--out", out,
                                "--threads", "1")
    assert code == 0 and err.count("done before") == 9, err  # resumed: nothing ran again

    # the policies stage (issue 24 for any model), named: per level, compare with the rules and zero-shot, the
    # long-context suite and LongBench with the same rules, the decision from their intervals, a report section
    code, stdout, err = run_cli(capsys, "study", "--model", tiny_long_folder, "--budget", "test", "--out", out,
                                "--stages", "policies", "--threads", "1")
    assert code == 0, err
    level = out / "policies" / "0.2"
    compare = json.loads((level / "compare" / "compare.json").read_text())
    methods = {r["method"] for r in compare["rows"]}
    assert {"orthorank (policy random)", "orthorank (policy oracle)",
            "orthorank (policy orthogonal+recent=8)"} <= methods
    assert compare["headroom"] and compare["zeroshot"]  # the oracle's headroom and zero-shot per rule
    longctx = json.loads((level / "longctx" / "longctx.json").read_text())
    assert any("[oracle]" in r["name"] for r in longctx["rows"]) and all(r["decode"] in (None, "dense")
                                                                          for r in longctx["rows"])
    assert (level / "longbench" / "longbench.json").is_file()
    choice = json.loads((level / "policy-choice.json").read_text())
    policies = {r["policy"] for r in choice["rows"]}
    assert {"orthogonal", "random", "orthogonal+recent=8"} <= policies
    oracle = next(r for r in choice["rows"] if r["policy"] == "oracle")
    assert not oracle["fix"] and "runs the layers densely: no speed-up" in oracle["why_not"]  # never a fix
    assert choice["default"] in policies
    assert list(json.loads((out / "policies" / "policies.json").read_text())["levels"]) == ["0.2"]
    headroom = (out / "policies" / "headroom.md").read_text()  # the levels side by side: bounds, then shares
    assert "| orthorank (policy oracle) | 0.2 |" in headroom and "| orthorank (the paper's rule) | 0.2 |" in headroom
    assert headroom.index("Perplexity at each level") < headroom.index("Share of the oracle's headroom")
    assert "Selection policies" in (out / "report.html").read_text()

    # the long-prompt stage (issue 45 for any model), named: the retrieval frontier at the budget's lengths
    code, stdout, err = run_cli(capsys, "study", "--model", tiny_long_folder, "--budget", "test", "--out", out,
                                "--stages", "long-prompt", "--threads", "1")
    assert code == 0, err
    front = json.loads((out / "long-prompt" / "frontier.json").read_text())
    assert front["complete"] and list(front["lengths"]) == ["256"]
    points = front["lengths"]["256"]["points"]
    # four layers: the depth schedule's one layer cannot skip a removed layer's compute, so it is left out, saying so
    assert {"dense", "sleb", "orthorank", "progressive"} <= {p["method"] for p in points}
    assert "frontier: depth at 0.2 left out" in stdout + err
    assert set(front["lengths"]["256"]["free_speedups"]) == {p["method"] for p in points} - {"dense"}
    assert front["lengths"]["256"]["tails"]["largest_shared_with_evaluation"] < 0.2
    assert (out / "long-prompt" / "frontier-256.png").is_file()
    assert "Long prompts: the retrieval frontier" in (out / "report.html").read_text()

    import browser_check

    if browser_check.chromium_available():
        result = browser_check.check_report(out / "report.html")
        assert not result["problems"], result["problems"]

    other = tmp_path / "other"
    shutil.copytree(out, other, ignore=shutil.ignore_patterns("store"))
    data = json.loads((other / "study.json").read_text())
    data["model"] = "second-model"
    (other / "study.json").write_text(json.dumps(data))
    code, stdout, err = run_cli(capsys, "study", "--summary", out, other, "--out", tmp_path / "summary")
    assert code == 0, err
    md = (tmp_path / "summary" / "summary.md").read_text()
    assert tiny_long_folder.name in md and "second-model" in md and "OrthoRank's perplexity is below sleb's" in md

    assert_user_error(capsys, "holds a study of budget 'test'", "study", "--model", tiny_long_folder,
                      "--budget", "quick", "--out", out)
    assert_user_error(capsys, "holds a study of model", "study", "--model", "llama-tiny", "--budget", "test",
                      "--out", out)
    assert_user_error(capsys, "two studies of the same model", "study", "--summary", out, out, "--out",
                      tmp_path / "s2")


@pytest.mark.data
def test_transfer_stage_fits_every_method_per_source_and_renders_the_matrix(capsys, tiny_long_folder, tmp_path,
                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "study"
    code, stdout, err = run_cli(capsys, "study", "--model", tiny_long_folder, "--budget", "test", "--out", out,
                                "--stages", "transfer", "--threads", "1")
    assert code == 0, err
    matrix = json.loads((out / "transfer" / "transfer.json").read_text())
    assert list(matrix["settings"]) == ["c4-128", "code-128"] and matrix["complete"] is True
    cells = {(c["method"], c["calibration"]) for c in matrix["cells"]}
    assert cells == {(m, s) for m in ("shortgpt", "shortened-ppl", "orthorank") for s in ("c4-128", "code-128")}
    for c in matrix["cells"]:
        assert set(c["ratios"]) == {"wikitext2", "c4", "code", "news"} and c["worst"] is not None
    code_cells = [c for c in matrix["cells"] if c["calibration"] == "code-128"]
    assert all(c["in_domain_geomean"] == pytest.approx(c["ratios"]["code"]["ratio"]) for c in code_cells)
    assert (out / "transfer" / "transfer-0.2.png").is_file()
    choice = matrix["default_calibration"]  # computed from the intervals, never typed
    assert choice["chosen"] in ("c4-128", "code-128") and choice["runner_up"] != choice["chosen"]
    assert choice["scores"][choice["chosen"]] <= choice["scores"][choice["runner_up"]]
    assert choice["separated"] == (choice["vs_runner_up"]["high"] < 1)
    assert "Default calibration" in (out / "transfer" / "transfer.md").read_text()
    plan = json.loads((tmp_path / "plans" / tiny_long_folder.name / "transfer" / "code-128" / "sleb-0.2.json")
                      .read_text())
    assert plan["provenance"]["calibration"]["data"] == "code" and plan["provenance"]["calibration"]["tokens"] == 128
    assert "Transfer" in (out / "report.html").read_text()
    code, stdout, err = run_cli(capsys, "study", "--model", tiny_long_folder, "--budget", "test", "--out", out,
                                "--stages", "transfer", "--threads", "1")
    assert code == 0 and "transfer: done before" in err

    from orthorank.harness.study.budgets import get_budget
    from orthorank.harness.study.context import StudyContext
    from orthorank.harness.study.transfer import render_matrix, transfer_done

    from orthorank.harness.study.transfer import transfer_calls

    ctx = StudyContext(str(tiny_long_folder), tiny_long_folder.name, out, get_budget("test"), {}, None, None,
                       tmp_path / "plans")
    assert list(transfer_calls(ctx)) == []  # finished evaluations are not run again (the store may have moved on)
    plan_file = tmp_path / "plans" / tiny_long_folder.name / "transfer" / "code-128" / "sleb-0.2.json"
    plan = json.loads(plan_file.read_text())
    plan["layers"] = plan["layers"][:-1]
    plan_file.write_text(json.dumps(plan))  # a changed plan is evaluated again, and only its setting
    again = list(transfer_calls(ctx))
    assert [c.command for c in again] == ["compare"] and again[0].out.endswith("code-128")
    (out / "transfer" / "code-128" / "compare.json").unlink()  # as after the first setting's evaluation
    ctx = StudyContext(str(tiny_long_folder), tiny_long_folder.name, out, get_budget("test"), {}, None, None,
                       tmp_path / "plans")
    partial = render_matrix(ctx)
    assert list(partial["settings"]) == ["c4-128"] and partial["complete"] is False
    assert not transfer_done(out / "transfer" / "transfer.json")  # a partial matrix does not finish the stage


def test_study_bad_input(capsys, tmp_path):
    assert_user_error(capsys, "holds no study.json", "study", "--summary", tmp_path, "--out", tmp_path / "s")
    assert_user_error(capsys, "unknown stage nope", "study", "--model", "llama-tiny", "--budget", "test",
                      "--stages", "nope", "--out", tmp_path / "x")
    f = tmp_path / "file"
    f.write_text("x")
    assert_user_error(capsys, "is a file, not a folder", "study", "--model", "llama-tiny", "--out", f)


def test_transfer_stage_runs_cheap_settings_first_and_the_hybrid_search_last_on_the_chosen_setting(tmp_path,
                                                                                                  monkeypatch):
    from orthorank.harness.study import transfer
    from orthorank.harness.study.budgets import get_budget
    from orthorank.harness.study.context import StudyContext
    from orthorank.harness.study.budgets import TransferSetting
    from orthorank.harness.study.transfer import transfer_calls

    from pathlib import Path

    ctx = StudyContext("m", "m", tmp_path / "study", get_budget("standard"), {}, None, None, tmp_path)
    done = ctx.plans_dir / "transfer" / "c4-8k"  # one setting's greedy plans exist already
    done.mkdir(parents=True)
    for method in ("sleb", "shortgpt", "shortened-ppl", "orthorank"):
        for level in ("0.1", "0.2"):
            (done / f"{method}-{level}.json").write_text("{}")

    def setting(call) -> str:
        return Path(call.out).name

    calls = list(transfer_calls(ctx))  # nothing evaluated: no choice yet, so no hybrid search
    calibrations = [(setting(c), c.method) for c in calls if c.command == "calibrate"]
    greedy = [s for s, m in calibrations if m != "hybrid"]
    assert "c4-8k" not in greedy and greedy[0] == "c4-2k" and greedy[-1] == "c4-32k"
    assert all(m != "hybrid" for _, m in calibrations) and len([c for c in calls if c.command == "compare"]) == 6

    monkeypatch.setattr(transfer, "chosen_setting", lambda ctx: TransferSetting("mix", 8192))
    calls = list(transfer_calls(ctx))
    calibrations = [(setting(c), c.method) for c in calls if c.command == "calibrate"]
    assert [s for s, m in calibrations if m == "hybrid"] == ["mix-8k"]  # the dearest search: the default only
    assert calibrations[-1] == ("mix-8k", "hybrid")
    table = next(i for i, c in enumerate(calls) if c.command == "bench")  # the cost table, measured once, before it
    assert all(i > table for i, c in enumerate(calls) if c.command == "calibrate" and c.method == "hybrid")
    compares = [c for c in calls if c.command == "compare"]
    assert len(compares) == 7  # every setting after its greedy plans, and the chosen one again with its hybrid rows
    first, last = compares[0], compares[-1]
    assert "hybrid" not in first.methods and "hybrid" in last.methods
    assert setting(last) == "mix-8k"


def test_calibrate_default_is_the_calibration_the_transfer_matrix_chooses():
    """The default of `calibrate --calib-data/--calib-tokens` is not typed from memory: it is the setting the
    committed transfer matrix chooses by the worst domain (harness/study/transfer.py choose_calibration)."""
    from orthorank.harness.search.calibration import DEFAULT_CALIB_DATA, DEFAULT_CALIB_TOKENS
    from orthorank.harness.study.budgets import ISSUE_SETTINGS

    root = Path(__file__).resolve().parents[2]
    matrix = json.loads((root / "studies" / "smollm2-135m" / "transfer" / "transfer.json").read_text())
    chosen = next(s for s in ISSUE_SETTINGS if s.name == matrix["default_calibration"]["chosen"])
    assert (DEFAULT_CALIB_DATA, DEFAULT_CALIB_TOKENS) == (chosen.source, chosen.tokens)



def test_long_context_stage_batches_one_task_per_generate_call(tmp_path):
    """The suite lists items task by task, so a batch that divides the samples per task never mixes tasks; the
    batched rows equal single prompts (test_longctx.test_padded_batch_generation_equals_single_prompts)."""
    from orthorank.harness.study.budgets import get_budget
    from orthorank.harness.study.context import StudyContext
    from orthorank.harness.study.stages import _longctx_calls, task_aligned_batch

    assert [task_aligned_batch(n) for n in (1, 2, 6, 7, 20, 50, 64)] == [1, 2, 6, 7, 5, 5, 8]
    for name in ("quick", "standard", "full"):
        budget = get_budget(name)
        ctx = StudyContext("m", "m", tmp_path / name, budget, {}, None, None, tmp_path)
        for call in _longctx_calls(ctx):
            batch = call.batch_size
            assert budget.longctx_samples % batch == 0 and 1 < batch <= 8


def test_study_runs_in_bfloat16_where_the_cpu_multiplies_it_natively(monkeypatch, capsys):
    from orthorank.harness import cpu_info
    from orthorank.harness.study import runner as study

    monkeypatch.setattr(cpu_info, "cpu_multiplies_bf16", lambda: True)
    assert study.study_dtype("auto", "cpu") == "bfloat16" and "bfloat16" in capsys.readouterr().err
    assert study.study_dtype("float32", "cpu") == "float32"  # asked for: kept
    assert study.study_dtype("auto", "cuda") == "auto"  # a GPU's auto is bfloat16 already
    monkeypatch.setattr(cpu_info, "cpu_multiplies_bf16", lambda: False)
    assert study.study_dtype("auto", "cpu") == "auto"  # emulated bfloat16 is slower than float32


def test_study_costs_sum_the_stage_seconds_and_each_search_once(tmp_path):
    """scripts/study_time.py costs: stage seconds from the folder, each plan search once (both levels share it),
    optional stages named but not counted (their last run resumed earlier ones)."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("study_time", root / "scripts" / "study_time.py")
    study_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study_time)
    folder, plans_dir = tmp_path / "study", tmp_path / "plans"
    (folder / "plans").mkdir(parents=True)
    plans_dir.mkdir()
    (folder / "study-manifest.json").write_text(json.dumps({"model": "m", "budget": "standard", "dtype": "float32"}))
    (folder / "stage-seconds.json").write_text(json.dumps({"sink": 10, "perplexity": 90, "transfer": 5}))
    plan = lambda search, s: {"method": search, "provenance": {"search": search, "search_seconds": s}}  # noqa: E731
    (folder / "plans" / "plans.json").write_text(json.dumps({"plans_dir": str(plans_dir), "plans": {
        "sleb-0.1": plan("sleb", 100), "sleb-0.2": plan("sleb", 100), "orthorank-0.2": plan("orthorank", 50)}}))
    (plans_dir / "hybrid-0.2.json").write_text(json.dumps(plan("hybrid", 1000)))
    out = tmp_path / "costs.md"
    study_time.main(["costs", str(folder), "--out", str(out)])
    text = out.read_text()
    assert "| **stages recorded** | **100** |" in text and "| **searches** | **1150** |" in text
    assert "No time recorded for stage plans, zeroshot," in text  # the stages the folder holds no time for
    assert "Optional stages not counted: transfer." in text
    # a hybrid search resumed across sessions before per-step timing: its 0.1 plan was written during the replay
    # (0 s after 600 evaluations), so its 0.2 plan's seconds are its last run's only, a lower bound
    resumed = lambda s, n: {"method": "hybrid", "provenance": {"search": "hybrid", "search_seconds": s,  # noqa: E731
                                                               "evaluations": n}}
    (plans_dir / "hybrid-0.1.json").write_text(json.dumps(resumed(0.0, 600)))
    (plans_dir / "hybrid-0.2.json").write_text(json.dumps(resumed(1000, 900)))
    study_time.main(["costs", str(folder), "--out", str(out)])
    text = out.read_text()
    assert "resumed across sessions, only its last run timed; 900 move evaluations) | >= 1000 |" in text
    assert "| **searches** | **>= 1150** |" in text


def test_router_stage_routes_a_hybrid_plan_that_removes_layers_at_sleb_compute(tmp_path):
    """Where a hybrid plan removes layers and selects in others, the router stage fits a second router on its
    selection layers (matched to SLEB's compute) and compares it; a hybrid plan that only selects gets none."""
    from orthorank.harness.study.budgets import get_budget
    from orthorank.harness.study.context import StudyContext
    from orthorank.harness.study.stages import _router_calls, _router_output

    ctx = StudyContext("gemma3-270m", "gemma3-270m", tmp_path / "study", get_budget("standard"), {}, None, None,
                       tmp_path)
    ctx.plans_dir.mkdir(parents=True)
    for name in ("hybrid-0.1.json", "hybrid-0.2.json"):  # 0.1 selects only, 0.2 removes layers too
        shutil.copy(Path(__file__).resolve().parents[2] / "plans" / "gemma3-270m" / name, ctx.plans_dir / name)
    calls = _router_calls(ctx)
    fits = [c for c in calls if c.command == "fit-router"]
    hybrid_fits = [c for c in fits if "router-hybrid" in c.json_out]
    assert len(hybrid_fits) == 1 and hybrid_fits[0].json_out.endswith("router-hybrid-0.2.json")
    assert hybrid_fits[0].match_compute_of.endswith("sleb-0.2.json")
    last = calls[-1]
    assert last.command == "compare" and last.methods == "sleb,hybrid,router-hybrid" and last.sparsity == "0.2"
    assert _router_output(ctx) == ctx.out / "router" / "hybrid" / "compare.json"
    (ctx.plans_dir / "hybrid-0.2.json").unlink()
    assert not any("router-hybrid" in " ".join(c.argv()) for c in _router_calls(ctx))
    assert _router_output(ctx) == ctx.out / "router" / "compare.json"


def test_the_speed_claim_is_left_out_below_the_repeats_that_can_decide_it():
    from orthorank.harness.evaluation.claims import MIN_SPEED_REPEATS, speed_claims

    def bench(k):
        times = [[0.10 + 0.001 * i for i in range(k)], [1.02 * (0.10 + 0.001 * i) for i in range(k)]]
        return {"runs": [{"mode": "prefill", "batch": 1, "seq_len": 512, "methods": [
            {"method": "orthorank", "timing": {"times_s": times[0]}},
            {"method": "sleb", "timing": {"times_s": times[1]}}]}]}

    said = []
    assert speed_claims(bench(MIN_SPEED_REPEATS - 1), 0.2, log=said.append) == [] and "left out" in said[0]
    (claim,) = speed_claims(bench(MIN_SPEED_REPEATS), 0.2)
    assert claim.verdict == "supported" and abs(claim.value - 1.02) < 1e-9  # 2% apart: within the +-10% band
