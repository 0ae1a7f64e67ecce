"""The non-inferiority rule (harness/evaluation/noninferiority.py) cannot call a loss free: it refuses a setting that loses 2 of
the 9 items dense solves, the same loss rate on many items, a cell at the floor, and a loss hidden in one task; it
passes a setting whose few discordant pairs exclude a 5-point loss. Committed frontier points relabel under it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orthorank.harness.evaluation import frontier
from orthorank.harness.evaluation.noninferiority import (
    RULE, PairedCounts, decide, decide_from_summary, items_for_power, paired_difference,
)

ROOT = Path(__file__).resolve().parents[2]


def _pairs(both: int, only_dense: int, only_setting: int, neither: int) -> tuple[list[int], list[int]]:
    setting = [1] * both + [0] * only_dense + [1] * only_setting + [0] * neither
    dense = [1] * both + [1] * only_dense + [0] * only_setting + [0] * neither
    return setting, dense


def test_it_refuses_a_setting_that_loses_2_of_the_9_items_dense_solves():
    setting, dense = _pairs(7, 2, 0, 1)  # 10 items: the case the old "free" rule let through
    v = decide(setting, dense)
    assert not v.passes and "too few items" in v.reason
    assert (v.only_dense, v.only_setting, v.dense_solved) == (2, 0, 9)
    assert v.low < -RULE.margin  # and the margin alone refuses it too
    old = frontier.Point("x", "x", 0.1, {"value": 1.5, "low": 1.4, "high": 1.6, "n": 3},
                         {"n": 10, "mean": 70.0, "low": 40.0, "high": 100.0,
                          "diff": {"value": -20.0, "low": -40.0, "high": 0.0}})
    dense_point = frontier.Point("dense", "dense", 0.0, {"value": 1.0, "low": 1.0, "high": 1.0, "n": 3},
                                 {"n": 10, "mean": 90.0, "low": 70.0, "high": 100.0})
    assert not frontier.is_free(old, dense_point)


@pytest.mark.parametrize("scale", [10, 30])
def test_the_same_loss_rate_on_many_items_is_refused_by_the_margin(scale):
    setting, dense = _pairs(7 * scale, 2 * scale, 0, scale)  # loses 22% of dense's answers
    v = decide(setting, dense)
    assert not v.passes and "beyond 5 points" in v.reason


def test_a_loss_shown_overall_fails_even_inside_the_margin_and_spread_over_groups():
    setting, dense = _pairs(580, 40, 10, 370)  # -3.0 points, interval wholly below 0
    task = [f"t{i % 30}" for i in range(len(dense))]  # spread thin: no group shows it alone
    v = decide(setting, dense, {"task": task})
    assert v.low > -RULE.margin and v.high < 0
    assert not v.passes and "loss shown overall" in v.reason


def test_a_cell_at_the_floor_decides_nothing():
    setting, dense = _pairs(0, 0, 0, 300)
    assert not decide(setting, dense).passes


def test_few_discordant_pairs_on_many_items_pass():
    setting, dense = _pairs(200, 2, 1, 97)
    v = decide(setting, dense)
    assert v.passes, v.reason
    assert v.low > -RULE.margin and v.low < 0 < v.high


def test_a_loss_in_one_task_is_not_hidden_by_the_mean():
    # 300 items in 10 tasks: one task loses 8 of its 20 solved items, the others gain 1 each
    setting, dense, task = [], [], []
    for t in range(10):
        if t == 0:
            s, d = _pairs(12, 8, 0, 10)
        else:
            s, d = _pairs(20, 0, 1, 9)
        setting += s
        dense += d
        task += [f"t{t}"] * 30
    v = decide(setting, dense, {"task": task})
    assert v.low > -RULE.margin  # the mean alone would pass
    assert not v.passes and "task=t0" in v.reason
    assert v.groups["task=t0"]["loss_shown"] and not v.groups["task=t1"]["loss_shown"]


def test_the_interval_is_newcombes():
    # Newcombe (1998), Table II example (f): a=36, b=12, c=2, d=0 -> difference 0.2, interval 0.0569 to 0.3404
    diff, low, high = paired_difference(PairedCounts(both=36, only_setting=12, only_dense=2, neither=0))
    assert diff == pytest.approx(20.0)
    assert low == pytest.approx(5.69, abs=0.01) and high == pytest.approx(34.04, abs=0.01)


def test_binary_scores_only_and_equal_lengths():
    with pytest.raises(ValueError):
        decide([0.5, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        decide([1.0], [1.0, 0.0])


def test_power_grows_as_the_loss_shrinks():
    assert items_for_power(5, 0.10) < items_for_power(2, 0.10)
    assert 250 < items_for_power(5, 0.10) < 400


def test_committed_frontier_points_relabel_under_the_rule():
    """Every frontier committed before the rule keeps means only (10-20 items per cell): none of its points passes
    now, and each says why; runs under the rule are labelled by their own stored verdicts."""
    files = sorted((ROOT / "studies" / "long-prompt").glob("**/frontier.json"))
    assert files
    for f in files:
        data = json.loads(f.read_text())
        for entry in data["lengths"].values():
            dense = entry["points"][0]
            for p in entry["points"][1:]:
                if p["score"].get("verdict"):  # a run under the rule: its verdict came from its paired items
                    assert p["free"] == p["score"]["verdict"]["passes"]
                    continue
                v = decide_from_summary(p["score"]["mean"], dense["score"]["mean"], int(p["score"]["n"]))
                assert not v.passes and v.reason
                assert p["free"] == v.passes, f"{f}: {p['name']} is labelled free; rerun the relabelling"
