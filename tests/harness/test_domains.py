"""Text domains and calibration sources: each loads with its provenance and windows deterministically, refuses a
missing or too short source in one line, never shares text between its calibration and evaluation windows (checked
on the real tokenizer), mixes reproducibly; exact compute matching; the worst-domain interval."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from cli_helpers import assert_user_error, run_cli
from orthorank.harness.search.calibration import calibration_set, parse_mix
from orthorank.errors import UserError
from orthorank.harness.evaluation.compare import dataset_stream
from orthorank.harness.evaluation.data import DOMAINS, load_calibration_part, load_eval_part
from orthorank.harness.evaluation.overlap import MAX_SHARED, shared_share
from orthorank.harness.evaluation.perplexity import make_windows
from orthorank.harness.evaluation.stats import paired_perplexity_ratio, worst_ratio
from orthorank.method.cost import Arch, removal_sparsity, selection_sparsity, ratio_to_match
from orthorank.method.plan import layers_for_sparsity


@pytest.fixture(scope="module")
def tokenizer():
    from orthorank.models.loading import embedded_gguf_path
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.mark.data
@pytest.mark.parametrize("name", list(DOMAINS))
def test_domain_loads_windows_deterministically_and_never_overlaps_its_calibration(name, tokenizer):
    ev = load_eval_part(name)
    cal = load_calibration_part(name)
    assert ev.text.strip() and cal.text.strip() and ev.provenance and cal.provenance
    w1 = make_windows(dataset_stream(tokenizer, name, ev.text, 512), 512, 24)
    w2 = make_windows(dataset_stream(tokenizer, name, load_eval_part(name).text, 512), 512, 24)
    assert torch.equal(w1, w2) and w1.shape == (24, 512)
    cs = calibration_set(tokenizer, name, 32, 256, seed=0)  # 8K tokens
    assert torch.equal(cs.windows, calibration_set(tokenizer, name, 32, 256, seed=0).windows)
    assert cs.provenance["windows_sha256"] and cs.provenance["tokens"] == 8192
    share = shared_share(w1, cs.windows)
    assert share.max() <= MAX_SHARED, (name, share.max())


@pytest.mark.data
def test_code_domain_records_its_sorted_file_list_and_splits_by_file():
    ev, cal = load_eval_part("code"), load_calibration_part("code")
    files_e, files_c = ev.provenance["files"], cal.provenance["files"]
    assert files_e == sorted(files_e) and files_c == sorted(files_c) and not set(files_e) & set(files_c)
    assert not any(f.split("/")[0] in ("test", "encodings") for f in files_e + files_c)
    assert ev.provenance["python"] and ev.provenance["stdlib"]


@pytest.mark.data
def test_wikitext2_calibration_part_is_the_tail_and_overlap_is_detected(tokenizer):
    """The held-out part is the last 40% of the articles: evaluation windows from the start share nothing with its
    calibration windows, windows inside it do (the check compare runs finds them)."""
    ev = load_eval_part("wikitext2")
    w = make_windows(dataset_stream(tokenizer, "wikitext2", ev.text, 2048), 2048)
    cs = calibration_set(tokenizer, "wikitext2", 256, 256, seed=0)  # 64K tokens
    share = shared_share(w, cs.windows)
    assert share[:100].max() < 0.01 and share[100:].max() > 0.5  # repeated phrases: under 1%


@pytest.mark.data
def test_missing_and_short_sources_are_refused(tmp_path, tokenizer):
    with pytest.raises(UserError, match="missing data file"):
        load_eval_part("c4", tmp_path)
    with pytest.raises(UserError, match="missing data file"):
        load_calibration_part("news", tmp_path)
    short = tmp_path / "short.txt"
    short.write_text("only a few words here " * 20)
    with pytest.raises(UserError, match="fewer than the"):
        calibration_set(tokenizer, str(short), 16, 64)
    with pytest.raises(UserError, match="unknown calibration data"):
        load_calibration_part("wikipedia")
    with pytest.raises(UserError, match="does not exist"):
        load_eval_part("no/such/file.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(UserError, match="empty"):
        load_eval_part(str(empty))


@pytest.mark.data
def test_mix_is_equal_interleaved_and_reproducible_from_its_seed(tokenizer):
    a = calibration_set(tokenizer, "mix", 8, 128, seed=3)
    b = calibration_set(tokenizer, "mix", 8, 128, seed=3)
    c = calibration_set(tokenizer, "mix", 8, 128, seed=4)
    assert torch.equal(a.windows, b.windows) and not torch.equal(a.windows, c.windows)
    assert a.provenance["mix"] == ["c4", "wikitext2", "news", "code"]
    assert all(p["windows"] == 2 for p in a.provenance["parts"].values())
    # window i comes from domain i mod 4: the c4 windows equal c4's own draw with the mix's first seed
    c4 = calibration_set(tokenizer, "c4", 2, 128, seed=3)
    assert torch.equal(a.windows[0::4], c4.windows)
    assert parse_mix("mix:c4+code") == ["c4", "code"]
    for bad in ("mix:c4", "mix:c4+c4", "mix:c4+books"):
        with pytest.raises(UserError):
            parse_mix(bad)
    with pytest.raises(UserError, match="multiple of 4"):
        calibration_set(tokenizer, "mix", 6, 128)


@pytest.mark.parametrize("arch", [Arch(30, 576, 9, 3, 64, 1536, 49152), Arch(32, 4096, 32, 32, 128, 11008, 32000),
                                  Arch(18, 640, 4, 1, 256, 2048, 262144), Arch(6, 64, 4, 2, 16, 128, 128)])
@pytest.mark.parametrize("sparsity", [0.1, 0.2, 0.3])
@pytest.mark.parametrize("seq_len", [512, 2048])
def test_exact_compute_matching_within_half_a_percent(arch, sparsity, seq_len):
    removed = layers_for_sparsity(sparsity, arch.num_layers, "prune")
    target = removal_sparsity(arch, seq_len, removed)
    try:
        n = layers_for_sparsity(sparsity, arch.num_layers, "orthorank", 0.33, match="compute", arch=arch,
                                seq_len=seq_len)
    except UserError:
        pytest.skip("this sparsity needs more selection layers than the model has")
    r = ratio_to_match(arch, seq_len, target, n, 0.33)
    got = selection_sparsity(arch, seq_len, n, r)
    assert r >= 0.33 and abs(got - target) / target <= 0.005, (n, r, got, target)


def test_worst_domain_ratio_is_the_max_with_an_interval_of_the_max():
    rng = np.random.default_rng(0)
    tok = 100
    b1, b2 = rng.normal(300, 10, 30), rng.normal(400, 10, 40)
    a1, a2 = b1 - 5 + rng.normal(0, 1, 30), b2 + 3 + rng.normal(0, 1, 40)  # better on 1, worse on 2
    interval, k = worst_ratio([(a1, b1, tok), (a2, b2, tok)])
    single = paired_perplexity_ratio(a2, b2, tok)
    assert k == 1 and math.isclose(interval.value, single.value)
    assert interval.low <= interval.value <= interval.high and interval.low > 1.0


def test_worst_ratio_scores_are_paired_across_candidates_that_share_windows():
    from orthorank.harness.evaluation.stats import draw_ratio, worst_ratio_scores

    rng = np.random.default_rng(1)
    tok = 100
    ref = [rng.normal(300, 30, 20), rng.normal(400, 30, 25)]  # windows of very different difficulty
    good = [[(r + 20 + rng.normal(0, 1, r.size), r, tok) for r in ref]]
    bad = [[(a + 2, r, tok) for a, r, _ in good[0]]]  # the same rows, a little worse on every window
    points, draws = worst_ratio_scores({"good": good, "bad": bad, "same": good})
    worst_good, _ = worst_ratio(good[0])
    assert math.isclose(points["good"], worst_good.value) and points["bad"] > points["good"]
    vs = draw_ratio(points["good"] / points["bad"], draws["good"], draws["bad"], 20)
    assert vs.high < 1  # paired: the windows' spread cancels, a small uniform gap is resolved
    same = draw_ratio(1.0, draws["good"], draws["same"], 20)
    assert same.low == same.high == 1.0
    with pytest.raises(ValueError, match="other windows"):
        worst_ratio_scores({"a": good, "b": [[(ref[0][:5], ref[0][:5], tok), good[0][1]]]})


@pytest.mark.data
def test_calibrate_on_domains_with_exact_matching_and_compare_every_domain(tiny_hf_folder, tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.chdir(tmp_path)
    name = tiny_hf_folder.name
    for method in ("sleb", "orthorank", "shortgpt"):
        code, out, err = run_cli(capsys, "calibrate", "--model", tiny_hf_folder, "--method", method,
                                 "--sparsity", "0.25", "--calib-data", "mix:c4+code", "--calib-tokens", "1K",
                                 "--seq-len", "64", "--out", f"plans/{name}", "--measure-speed", "3",
                                 *(["--match", "compute,speed"] if method == "orthorank" else []))
        assert code == 0, err
    speed = json.loads((tmp_path / "plans" / name / "orthorank-speed-0.25.json").read_text())
    m = speed["provenance"]["matched"]
    assert m["rule"] == "equal measured prefill speed-up" and m["probes"] and m["noise_iqr"] >= 0
    assert m["within_noise"] == (abs(m["difference"]) <= m["noise_iqr"]) and m["ratio"] >= 0.33
    plan = json.loads((tmp_path / "plans" / name / "orthorank-0.25.json").read_text())
    matched = plan["provenance"]["matched"]
    assert matched["relative_error"] <= 0.005 and plan["selection"]["ratio"] >= 0.33
    assert plan["provenance"]["calibration"]["mix"] == ["c4", "code"]
    assert plan["sparsity"]["measured_speedup"] > 0 and plan["provenance"]["measured"]["repeats"] == 3
    sleb = json.loads((tmp_path / "plans" / name / "sleb-0.25.json").read_text())
    assert abs(plan["sparsity"]["compute"] - sleb["sparsity"]["compute"]) / sleb["sparsity"]["compute"] <= 0.005
    code, out, err = run_cli(capsys, "compare", "--model", tiny_hf_folder, "--methods", "dense,sleb,shortgpt,orthorank",
                             "--sparsity", "0.25", "--datasets", "wikitext2,c4,code,news", "--seq-len", "64",
                             "--max-windows", "3", "--out", "out", "--store", "store")
    assert code == 0, err
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    worst = {w["method"]: w for w in result["worst_domain"]}
    assert set(worst) == {"shortgpt", "orthorank"} and len(worst["orthorank"]["datasets"]) == 4
    assert "Worst-domain ratio" in out and result["dataset_provenance"]["code"]["files"]
    assert {o["dataset"] for o in result["calibration_overlap"]} == {"wikitext2", "c4", "code", "news"}
    # a later slice, disjoint from the first: for checking a choice made on the first windows
    code, out, err = run_cli(capsys, "compare", "--model", tiny_hf_folder, "--methods", "dense,sleb",
                             "--sparsity", "0.25", "--datasets", "wikitext2,c4", "--seq-len", "64",
                             "--max-windows", "3", "--skip-windows", "3", "--out", "later", "--store", "store")
    assert code == 0, err
    later = json.loads((tmp_path / "later" / "compare.json").read_text())
    assert later["skip_windows"] == 3 and "after the first 3" in out
    first = {r["method"]: r for r in result["rows"]}["dense"]["wikitext2"]["window_nll"]
    again = {r["method"]: r for r in later["rows"]}["dense"]["wikitext2"]["window_nll"]
    assert len(again) == 3 and all(a != b for a, b in zip(first, again))
    assert_user_error(capsys, "nothing is left after --skip-windows", "compare", "--model", tiny_hf_folder,
                      "--methods", "dense", "--datasets", "c4", "--seq-len", "64", "--skip-windows", "100000",
                      "--out", "none", "--store", "store")


@pytest.mark.data
def test_compare_refuses_windows_that_overlap_a_plans_calibration(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = tiny_hf_folder.name
    code, out, err = run_cli(capsys, "calibrate", "--model", tiny_hf_folder, "--method", "sleb", "--sparsity", "0.25",
                             "--calib-data", "wikitext2", "--calib-tokens", "16K", "--seq-len", "256",
                             "--out", f"plans/{name}", "--measure-speed", "0", "--no-store")
    assert code == 0, err
    code, out, err = run_cli(capsys, "compare", "--model", tiny_hf_folder, "--methods", "dense,sleb", "--sparsity",
                             "0.25", "--datasets", "wikitext2", "--seq-len", "256", "--max-windows", "100000",
                             "--out", "o", "--no-store")
    assert code == 2 and "evaluate the windows before it (--max-windows " in err.strip().splitlines()[-1], err
    first = int(err.split("(--max-windows ")[-1].split(")")[0])
    # without --max-windows: the windows before the calibration text, said and recorded (from 3 windows before it)
    code, out, err = run_cli(capsys, "compare", "--model", tiny_hf_folder, "--methods", "dense,sleb", "--sparsity",
                             "0.25", "--datasets", "wikitext2", "--seq-len", "256", "--out", "o", "--no-store",
                             "--skip-windows", str(first - 3))
    assert code == 0, err
    result = json.loads((tmp_path / "o" / "compare.json").read_text())
    n = result["stopped_before_calibration"]["wikitext2"]
    assert result["windows"]["wikitext2"] == n == 3 and f"the first {n} of its" in out
    assert all(o["max_shared"] <= MAX_SHARED and o["windows_checked"] == n for o in result["calibration_overlap"])
    own = tmp_path / "mine.txt"
    own.write_text("A text of my own, about boats and rivers and the people on them. " * 400)
    code, out, err = run_cli(capsys, "calibrate", "--model", tiny_hf_folder, "--method", "sleb", "--sparsity", "0.25",
                             "--calib-data", str(own), "--calib-samples", "8", "--seq-len", "64", "--json", "own.json",
                             "--measure-speed", "0", "--no-store")
    assert code == 0, err
    (tmp_path / "plans" / name / "sleb-0.25.json").unlink()
    (tmp_path / "own.json").rename(tmp_path / "plans" / name / "sleb-0.25.json")
    assert_user_error(capsys, "use a plan calibrated on other text", "compare", "--model", tiny_hf_folder,
                      "--methods", "dense,sleb", "--sparsity", "0.25", "--datasets", str(own), "--seq-len", "64",
                      "--out", "o2", "--no-store")


def test_calibrate_bad_sources_are_one_line_errors(tiny_hf_folder, tmp_path, capsys):
    base = ["calibrate", "--model", tiny_hf_folder, "--method", "sleb", "--sparsity", "0.25", "--json",
            tmp_path / "p.json"]
    assert_user_error(capsys, "unknown calibration data", *base, "--calib-data", "books")
    assert_user_error(capsys, "does not exist", *base, "--calib-data", "no/such.txt")
    assert_user_error(capsys, "a mix names two or more", *base, "--calib-data", "mix:c4")
    assert_user_error(capsys, "not a multiple of --seq-len", *base, "--calib-tokens", "1000", "--seq-len", "64")
