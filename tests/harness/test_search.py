"""Layer searches: prefix reuse is exact, greedy choices are the best candidates, plans and compare run."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import tiny_model
from orthorank.harness.search.registry import SEARCH_METHODS
from orthorank.harness.search.layer_search import StackRunner, block_influence, greedy_search, one_shot_ppl
from orthorank.harness.cli.main import main
from orthorank.method import SelectionConfig, apply_orthorank, layers_for_sparsity, prune_layers, restore_dense


def full_loss(model, windows):
    logits = model(windows, use_cache=False).logits[:, :-1]
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)))


@pytest.fixture
def setup():
    m = tiny_model(layers=6)
    windows = torch.randint(1, 128, (6, 24), generator=torch.Generator().manual_seed(0))
    return m, windows


def test_prefix_reuse_equals_full_forward(setup):
    m, windows = setup
    runner = StackRunner(m, windows, batch_size=4)
    sel = SelectionConfig(ratio=0.33)
    assert math.isclose(runner.cache({}), full_loss(m, windows), rel_tol=1e-5)
    config = {2: runner.wrap(2, sel)}
    runner.cache(config)
    trial = runner.loss_with({**config, 4: None}, 4)  # reuses the cached inputs of layer 4
    # Reference through the real model: OrthoRank in layer 2, layer 4 removed.
    ref = tiny_model(layers=6)
    apply_orthorank(ref, [2], sel)
    ref.model.layers = nn.ModuleList(layer for i, layer in enumerate(ref.model.layers) if i != 4)
    ref.config.num_hidden_layers = 5
    assert math.isclose(trial, full_loss(ref, windows), rel_tol=1e-5)


def test_greedy_picks_lowest_loss_and_is_deterministic(setup):
    m, windows = setup
    runner = StackRunner(m, windows)
    result = greedy_search(runner, 2, [1, 2, 3, 4], lambda i: None, progress=False)
    # check step 1 by brute force through the real model
    losses = {}
    for c in [1, 2, 3, 4]:
        prune_layers(m, [c])
        losses[c] = full_loss(m, windows)
        restore_dense(m)
    assert result.order[0] == min(losses, key=losses.get)
    again = greedy_search(StackRunner(m, windows), 2, [1, 2, 3, 4], lambda i: None, progress=False)
    assert again.order == result.order and again.losses == result.losses


def test_one_shot_criteria(setup):
    m, windows = setup
    ppl = one_shot_ppl(StackRunner(m, windows), list(range(6)), progress=False)
    assert sorted(ppl.order) == list(range(6)) and ppl.losses == sorted(ppl.losses)
    bi = block_influence(StackRunner(m, windows))
    assert sorted(bi.order) == list(range(6)) and all(0 <= s <= 2 for s in bi.scores.values())


def test_layer_counts_for_sparsity():
    assert layers_for_sparsity(0.2, 30, "prune") == 6
    assert layers_for_sparsity(0.1, 30, "prune") == 3
    assert layers_for_sparsity(0.2, 30, "orthorank", 0.33) == 9
    assert layers_for_sparsity(0.1, 30, "orthorank", 0.33) == 4
    assert layers_for_sparsity(0.2, 32, "prune") == 7  # ceil(6.4)


@pytest.mark.parametrize("method", ["orthorank", "sleb"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_search_equals_exhaustive_on_tiny_models(method, seed):
    """Screening candidates on a quarter of the calibration windows and re-checking the best 3 on all gives the
    exhaustive greedy plan on the tiny test models."""
    m = tiny_model(layers=8, seed=seed)
    windows = torch.randint(1, 128, (8, 32), generator=torch.Generator().manual_seed(seed))
    sel = SelectionConfig(ratio=0.33)
    search = SEARCH_METHODS[method]
    full = search.run(StackRunner(m, windows, 1), 4, sel, False)
    fast = search.run(StackRunner(m, windows, 1), 4, sel, False, screen_batches=2, recheck=3)
    assert fast.order == full.order
    assert fast.losses == pytest.approx(full.losses, rel=1e-6)


def test_search_runner_is_causal_under_eager_attention():
    """The runner gives eager attention the causal mask (SDPA is causal by itself when given none)."""
    windows = torch.randint(1, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    for attn in ("sdpa", "eager"):
        m = tiny_model(layers=4, attn=attn)
        assert math.isclose(StackRunner(m, windows).cache({}), full_loss(m, windows), rel_tol=1e-5)


@pytest.mark.data
def test_calibrate_and_compare_cli(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    text = tmp_path / "calib.txt"
    text.write_text("Some calibration text about many different things. " * 200)
    monkeypatch.chdir(tmp_path)
    name = tiny_hf_folder.name
    for method in [m for m, s in SEARCH_METHODS.items() if not s.per_layer]:  # per-layer searches: test_hybrid
        code = main(["calibrate", "--model", str(tiny_hf_folder), "--method", method, "--sparsity", "0.2,0.3",
                     "--calib-data", str(text), "--calib-samples", "4", "--seq-len", "32",
                     "--out", f"plans/{name}", "--match", "nominal" if method == "orthorank" else "compute"])
        assert code == 0, capsys.readouterr().err
    plan = json.loads((tmp_path / "plans" / name / "orthorank-nominal-0.3.json").read_text())
    assert plan["method"] == "orthorank" and len(plan["layers"]) == round(0.3 * 4 / 0.67)
    assert plan["provenance"]["search_seconds"] >= 0 and plan["provenance"]["match"] == "nominal"
    assert set(plan["sparsity"]) == {"nominal", "compute", "compute_seq_len", "measured_speedup"}
    # refuses to overwrite without asking
    assert main(["calibrate", "--model", str(tiny_hf_folder), "--method", "sleb", "--sparsity", "0.2",
                 "--calib-data", str(text), "--json", f"plans/{name}/sleb-0.2.json"]) == 2
    capsys.readouterr()
    code = main(["compare", "--model", str(tiny_hf_folder), "--methods", "dense,sleb,shortgpt,orthorank",
                 "--match", "nominal", "--sparsity", "0.2,0.3", "--datasets", "wikitext2", "--seq-len", "64",
                 "--max-windows", "3", "--ablations", "--out", "out", "--store", "store"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| orthorank-nominal (random) | 0.3 |" in out and "| sleb | 0.2 |" in out and "[95% CI]" in out
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert len(result["rows"]) == 1 + 2 + 2 + 2 + 2 * 5
    row = result["rows"][-1]
    assert len(row["wikitext2"]["window_nll"]) == 3 and row["wikitext2"]["ci95"][0] <= row["wikitext2"]["perplexity"]
    assert {c["b"] for c in result["comparisons"] if c["a"] == "orthorank-nominal"} == {"sleb", "shortgpt"}
    assert (tmp_path / "out" / "compare.png").stat().st_size > 1000
    assert main(["compare", "--model", str(tiny_hf_folder), "--methods", "dense", "--datasets", "wikitext2",
                 "--out", "out"]) == 2  # would overwrite
    # a second run reads every window back from the store and gives the same numbers
    capsys.readouterr()
    stored = sorted(p.name for p in (tmp_path / "store").rglob("e-*.json"))
    assert main(["compare", "--model", str(tiny_hf_folder), "--methods", "dense,sleb,shortgpt,orthorank",
                 "--match", "nominal", "--sparsity", "0.2,0.3", "--datasets", "wikitext2", "--seq-len", "64",
                 "--max-windows", "3", "--ablations", "--out", "out2", "--store", "store"]) == 0
    assert sorted(p.name for p in (tmp_path / "store").rglob("e-*.json")) == stored
    again = json.loads((tmp_path / "out2" / "compare.json").read_text())
    assert [r["wikitext2"] for r in again["rows"]] == [r["wikitext2"] for r in result["rows"]]


@pytest.mark.data
def test_compare_missing_plan(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["compare", "--model", str(tiny_hf_folder), "--methods", "sleb", "--sparsity", "0.45",
                 "--datasets", "wikitext2", "--out", "o"])
    assert code == 2 and "orthorank calibrate" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["1.0", "-0.1", "abc"])
def test_calibrate_bad_sparsity(tiny_hf_folder, tmp_path, capsys, bad):
    code = main(["calibrate", "--model", str(tiny_hf_folder), "--method", "sleb", "--sparsity", bad,
                 "--json", str(tmp_path / "p.json")])
    assert code == 2 and "sparsity" in capsys.readouterr().err


@pytest.mark.data
def test_compare_with_zeroshot(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["compare", "--model", str(tiny_hf_folder), "--methods", "dense", "--datasets", "wikitext2",
                 "--seq-len", "64", "--max-windows", "1", "--zeroshot", "--tasks", "piqa,arc_easy", "--limit", "3",
                 "--out", "zs", "--no-store"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| dense |" in out and "PIQA" in out and "Mean" in out
    result = json.loads((tmp_path / "zs" / "compare.json").read_text())
    zs = result["zeroshot"]["rows"][0]
    assert zs["method"] == "dense" and len(zs["piqa"]["outcomes"]) == 3 and "stderr" in zs["piqa"]


# -- racing ---------------------------------------------------------------------------------------------------------


def test_t_quantiles_match_the_table_and_expansion():
    from orthorank.harness.search.racing import t_quantile

    assert t_quantile(7) == pytest.approx(4.785)
    assert t_quantile(31) == pytest.approx(3.3749, abs=2e-3)
    assert t_quantile(1000) == pytest.approx(3.0984, abs=1e-3)
    assert t_quantile(0) == math.inf


def _constructed_scores(means: dict[int, float], windows_per_batch: int = 4, noise: float = 0.5, seed: int = 0):
    """Per-window NLL = a window difficulty shared by all candidates (large) + the candidate's mean + small noise."""
    g = torch.Generator().manual_seed(seed)
    n_batches = 16
    difficulty = torch.rand(n_batches, windows_per_batch, generator=g, dtype=torch.float64) * 100
    table = {c: difficulty + m + noise * torch.randn(n_batches, windows_per_batch, generator=g, dtype=torch.float64)
             for c, m in means.items()}
    calls = []

    def score(cands, batches):
        calls.append((list(cands), list(batches)))
        return {c: {b: table[c][b] for b in batches} for c in cands}
    return score, calls, table, n_batches


def test_race_drops_clear_losers_early_and_ranks_survivors_on_every_batch():
    from orthorank.harness.search.racing import race

    means = {c: 0.0 if c == 7 else 0.05 if c == 3 else 5.0 for c in range(1, 29)}
    score, calls, table, n = _constructed_scores(means)
    totals = race(list(means), score, n, first=2, keep=2)
    exhaustive = {c: float(table[c].sum()) for c in means}
    assert min(totals, key=totals.get) == min(exhaustive, key=exhaustive.get) == 7
    assert all(totals[c] == pytest.approx(exhaustive[c]) for c in totals)  # survivors saw every batch
    assert set(totals) == {3, 7}  # the 26 layers 5 nats worse were dropped after the first chunk
    scored = sum(len(c) * len(b) for c, b in calls)
    assert scored < 0.2 * len(means) * n  # exhaustive would score 28 x 16 batch evaluations
    assert [b for _, b in calls] == [[0, 1], [2, 3], [4, 5, 6, 7], list(range(8, 16))]  # chunks double


@pytest.mark.parametrize("means", [{c: 0.0 for c in range(6)}, {c: 0.1 * c for c in range(10)},
                                   {c: 0.0 if c == 4 else 0.3 + 0.02 * c for c in range(28)}],
                         ids=["all-equal", "spread", "one-best"])
def test_race_chooses_as_exhaustive_greedy(means):
    """Over 20 noisy draws per regime the race's choice is the exhaustive choice (its only way to differ is to drop
    the exhaustive winner, which a paired test at 0.001 does not)."""
    from orthorank.harness.search.racing import race

    for seed in range(20):
        score, calls, table, n = _constructed_scores(means, seed=seed)
        totals = race(list(means), score, n, first=2, keep=1)
        exhaustive = {c: float(table[c].sum()) for c in means}
        assert min(totals, key=lambda c: (totals[c], c)) == min(exhaustive, key=lambda c: (exhaustive[c], c))


def test_race_never_keeps_fewer_than_keep():
    from orthorank.harness.search.racing import race

    means = {0: 0.0, 1: 9.0, 2: 9.0, 3: 9.0}
    score, calls, table, n = _constructed_scores(means)
    kept = set(race(list(means), score, n, first=2, keep=3))
    assert 0 in kept and len(kept) == 3  # the 3 best so far always go on
    score, calls, table, n = _constructed_scores(means)
    assert set(race(list(means), score, n, first=n)) == set(means)  # first chunk = every batch: exhaustive


def test_race_stops_when_one_candidate_is_left():
    from orthorank.harness.search.racing import race

    means = {c: 0.0 if c == 2 else 5.0 for c in range(10)}
    score, calls, table, n = _constructed_scores(means)
    trace = []
    totals = race(list(means), score, n, first=2, keep=1, trace=trace)
    assert list(totals) == [2] and trace == [(2, 10)]  # the others dropped after 8 windows: nothing more scored
    assert totals[2] == pytest.approx(float(table[2][:2].sum()))
