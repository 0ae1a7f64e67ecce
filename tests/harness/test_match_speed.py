"""`orthorank match-speed` and the bisection under it (harness/runtime/matching.py): a selection plan's keep ratio
set to another plan's measured speed-up, downwards where the plan is slower, never past --min-ratio."""

from __future__ import annotations

import json

import pytest
import torch

from orthorank.harness.cli.main import main
from orthorank.harness.runtime import matching
from orthorank.method.plan import Plan
from orthorank.method.selection import SelectionConfig, keep_count
from orthorank.models.loading import load_model


def _fake_speed(monkeypatch, cost_of_ratio, reference_speedup=1.2, iqr=0.001):
    """measured_speedups replaced by a model of speed: speed-up 1 / cost(ratio), the reference's fixed."""
    def fake(model, plans, window, repeats):
        ref, cand = plans
        return [{"speedup": reference_speedup, "iqr": iqr},
                {"speedup": 1 / cost_of_ratio(cand.selection.ratio), "iqr": iqr}]
    monkeypatch.setattr(matching, "measured_speedups", fake)


def _plan(ratio=0.4):
    return Plan("orthorank", [1, 2], "m", {}, selection=SelectionConfig(ratio=ratio))


@pytest.mark.parametrize("target", [0.15, 0.3, 0.6])
def test_bisection_finds_the_ratio_on_either_side_of_the_start(monkeypatch, target):
    # speed-up 1.2 at ratio `target`: cost(r) = r / target / 1.2
    _fake_speed(monkeypatch, lambda r: r / target / 1.2, iqr=0.01)
    window = torch.zeros(1000, dtype=torch.long)
    found = matching.match_speed(None, lambda r: matching.with_ratio(_plan(), r), _plan(), window, 0.4,
                                 max_probes=12, min_ratio=0.05)
    assert found["within_noise"] and found["ratio"] == pytest.approx(target, abs=0.01)
    assert found["probes"][0]["ratio"] == 0.4  # it starts from the plan's own ratio


def test_without_min_ratio_a_slower_plan_stays_at_its_ratio(monkeypatch):
    _fake_speed(monkeypatch, lambda r: 1.0)  # never faster than dense: slower than the reference at every ratio
    window = torch.zeros(1000, dtype=torch.long)
    found = matching.match_speed(None, lambda r: matching.with_ratio(_plan(), r), _plan(), window, 0.4)
    assert found["ratio"] == 0.4 and len(found["probes"]) == 1 and not found["within_noise"]
    # with a floor it goes down to the floor, and says the match was not reached
    found = matching.match_speed(None, lambda r: matching.with_ratio(_plan(), r), _plan(), window, 0.4,
                                 max_probes=20, min_ratio=0.1)
    assert min(p["ratio"] for p in found["probes"]) == pytest.approx(keep_count(1000, 0.1) / 1000)
    assert not found["within_noise"]


def test_match_speed_command_writes_the_plan_with_its_probes(tiny_hf_folder, tmp_path, monkeypatch, capsys):
    lm = load_model(str(tiny_hf_folder), device="cpu")
    plan, ref = tmp_path / "router.json", tmp_path / "sleb.json"
    Plan("orthorank", [1, 2], lm.name, lm.signature(), selection=SelectionConfig(ratio=0.4)).save(plan)
    Plan("prune", [2], lm.name, lm.signature()).save(ref)
    _fake_speed(monkeypatch, lambda r: 0.5 + r, reference_speedup=1 / 0.7, iqr=0.02)  # matched at r = 0.2
    out = tmp_path / "matched.json"
    base = ["match-speed", "--model", str(tiny_hf_folder), "--device", "cpu", "--plan",
            str(plan), "--to", str(ref), "--seq-len", "64", "--max-probes", "12", "--tolerance", "0.02"]
    assert main([*base, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    sm = data["provenance"]["speed_matched"]
    assert sm["within_tolerance"] and data["selection"]["ratio"] == pytest.approx(0.2, abs=0.02)
    assert sm["base_ratio"] == 0.4 and sm["probes"][0]["ratio"] == 0.4 and sm["reference"] == str(ref)
    assert data["layers"] == [1, 2]
    assert "keep ratio" in capsys.readouterr().err
    # bad input: one line, exit 2, nothing overwritten
    before = out.read_text()
    assert main([*base, "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == before
    assert main([*base[:-4], "--to", str(plan), "--plan", str(ref), "--out", str(tmp_path / "x.json")]) == 2
    assert "one keep ratio" in capsys.readouterr().err
    assert main([*base, "--min-ratio", "0.9", "--out", str(tmp_path / "y.json")]) == 2
    assert "--min-ratio" in capsys.readouterr().err
