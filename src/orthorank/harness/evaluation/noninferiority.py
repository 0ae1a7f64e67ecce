"""The non-inferiority rule: when may a faster setting be said to answer as well as dense? Stated before any run.

A setting passes against dense on a set of paired items (the same prompts, each scored 0 or 1) when all hold:

1. **Enough solved items.** Dense solves at least `min_dense_solved` (30) of them. Where dense solves few, a setting
   can lose only few, and a cell at the floor (both solve nothing) would pass by saying nothing. With 30 solved
   items a setting that loses 10% of dense's answers shows at least one loss with probability 1 - 0.9^30 = 96%.
2. **No loss beyond the margin.** The lower bound of the 95% interval of the paired accuracy difference (setting
   minus dense, in points) is at or above -`margin` (5 points). The interval is Newcombe's hybrid score interval for
   paired proportions (Newcombe 1998, method 10): built from the 2x2 table of paired outcomes, no resampling, so it is
   deterministic and keeps its coverage where losses are rare (a bootstrap of 2 losses in 10 items under-covers).
3. **No loss shown, overall or in any group.** The interval does not lie wholly below 0, and within every group the
   items are split by (the suite's task, layout and template) no group's interval does. A setting that wins on easy
   tasks cannot hide a failed task in the mean.

What it admits: a true loss smaller than the margin that the items cannot show. That is what non-inferiority means;
the margin is the largest loss a user is asked to accept, and every table prints the discordant pairs beside it.

Why 5 points and 30 items: the evaluation check is sized so that a 5-point loss would show (`items_for_power`);
a margin of 2 points would need about 2,000 paired items per model and length at a 10% discordance rate
(`items_for_power(2, 0.10)`), days of prefill at 8k on 2 cores. Why not the old "free" rule (the interval reaches 0 and the mean is inside dense's
interval): with 10 items it called a setting that loses 2 of the 9 items dense solves free, because 10 items cannot
show that loss; this rule refuses it twice, by (1) and by (2).

    verdict = decide(setting_scores, dense_scores, groups)   # lists of 0/1 per item, same order; group labels
    verdict.passes, verdict.reason, verdict.only_dense, verdict.only_setting
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Rule:
    margin: float = 5.0  # points of accuracy: the largest loss the rule admits as "no worse"
    min_dense_solved: int = 30  # items dense must solve before a cell decides anything
    z: float = Z95  # two-sided 95% interval (a one-sided 97.5% bound on the loss)

    def describe(self) -> str:
        return (f"non-inferior: dense solves >= {self.min_dense_solved} items, the paired difference's 95% interval "
                f"(Newcombe) has its lower bound >= -{self.margin:g} points, and no task or layout shows a loss")


RULE = Rule()


@dataclass(frozen=True)
class PairedCounts:
    both: int
    only_dense: int  # items dense solves and the setting does not: losses
    only_setting: int  # items the setting solves and dense does not
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.only_dense + self.only_setting + self.neither

    @property
    def dense_solved(self) -> int:
        return self.both + self.only_dense

    @classmethod
    def of(cls, setting: Sequence[float], dense: Sequence[float]) -> "PairedCounts":
        if len(setting) != len(dense):
            raise ValueError(f"paired scores need the same items: {len(setting)} against {len(dense)}")
        bad = [x for x in (*setting, *dense) if x not in (0, 1, 0.0, 1.0)]
        if bad:
            raise ValueError(f"the rule pairs binary item scores (0 or 1), got {bad[0]!r}")
        pairs = list(zip((bool(x) for x in setting), (bool(x) for x in dense)))
        return cls(sum(s and d for s, d in pairs), sum(d and not s for s, d in pairs),
                   sum(s and not d for s, d in pairs), sum(not s and not d for s, d in pairs))


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(c: PairedCounts, z: float = Z95) -> tuple[float, float, float]:
    """The setting's accuracy minus dense's, in points, with Newcombe's hybrid score interval (method 10) for paired
    proportions: Wilson intervals of both accuracies, combined with the correlation of the pairs."""
    n = c.n
    if n == 0:
        return 0.0, -100.0, 100.0
    a, b, cc, d = c.both, c.only_setting, c.only_dense, c.neither  # rows: setting 1/0, columns: dense 1/0
    p1, p2 = (a + b) / n, (a + cc) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + cc, n, z)
    denom = (a + b) * (cc + d) * (a + cc) * (b + d)
    if denom == 0:
        phi = 0.0
    else:
        num = a * d - b * cc
        num = max(num - n / 2, 0.0) if num > 0 else num  # Newcombe's continuity correction of phi
        phi = num / math.sqrt(denom)
    theta = p1 - p2
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    eps = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return 100 * theta, 100 * max(-1.0, theta - delta), 100 * min(1.0, theta + eps)


@dataclass
class Verdict:
    passes: bool
    reason: str
    n: int
    dense_solved: int
    only_dense: int
    only_setting: int
    diff: float  # points
    low: float
    high: float
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # per group: counts and interval
    rule: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def discordant(self) -> str:
        return f"{self.only_dense} only dense / {self.only_setting} only it"


def _group_entry(c: PairedCounts, rule: Rule) -> dict[str, Any]:
    diff, low, high = paired_difference(c, rule.z)
    return {"n": c.n, "dense_solved": c.dense_solved, "only_dense": c.only_dense, "only_setting": c.only_setting,
            "diff": round(diff, 3), "low": round(low, 3), "high": round(high, 3), "loss_shown": high < 0.0}


def decide(setting: Sequence[float], dense: Sequence[float], groups: Mapping[str, Sequence[str]] | None = None,
           rule: Rule = RULE) -> Verdict:
    """The rule on paired binary scores. `groups`: {grouping: a label per item}, e.g. {"task": [...], "layout":
    [...]}, for condition 3; each group is reported as "task=niah_single" with its counts and interval."""
    counts = PairedCounts.of(setting, dense)
    diff, low, high = paired_difference(counts, rule.z)
    by_group: dict[str, dict[str, Any]] = {}
    for kind, labels in (groups or {}).items():
        if len(labels) != len(dense):
            raise ValueError(f"one {kind} label per item")
        for g in dict.fromkeys(labels):
            idx = [i for i, x in enumerate(labels) if x == g]
            by_group[f"{kind}={g}"] = _group_entry(PairedCounts.of([setting[i] for i in idx],
                                                                   [dense[i] for i in idx]), rule)
    shown = [g for g, e in by_group.items() if e["loss_shown"]]
    if counts.dense_solved < rule.min_dense_solved:
        passes, reason = False, (f"too few items to decide: dense solves {counts.dense_solved} "
                                 f"(< {rule.min_dense_solved})")
    elif low < -rule.margin:
        passes, reason = False, f"a loss beyond {rule.margin:g} points is not excluded (lower bound {low:+.1f})"
    elif high < 0.0:
        passes, reason = False, f"a loss shown overall ({diff:+.1f} [{low:+.1f}, {high:+.1f}] points)"
    elif shown:
        passes, reason = False, "a loss shown on " + ", ".join(shown)
    else:
        passes, reason = True, f"non-inferior (lower bound {low:+.1f} >= -{rule.margin:g} points)"
    return Verdict(passes, reason, counts.n, counts.dense_solved, counts.only_dense, counts.only_setting,
                   round(diff, 3), round(low, 3), round(high, 3), by_group, asdict(rule))


def decide_from_summary(setting_mean: float, dense_mean: float, n: int, rule: Rule = RULE) -> Verdict:
    """The rule on a committed frontier point that kept only means (older files): the counts with the fewest
    discordant pairs the means allow. That is the narrowest interval the data could have had, so a point failing here
    fails on its items too; a point passing here is not certified (its items may be more discordant) and is reported
    as not decided."""
    dense_solved = round(dense_mean * n / 100)
    net = round((setting_mean - dense_mean) * n / 100)  # only_setting - only_dense
    only_dense, only_setting = max(0, -net), max(0, net)
    both = dense_solved - only_dense
    neither = n - both - only_dense - only_setting
    counts = PairedCounts(both, only_dense, only_setting, max(0, neither))
    diff, low, high = paired_difference(counts, rule.z)
    if dense_solved < rule.min_dense_solved:
        passes, reason = False, f"too few items to decide: dense solves {dense_solved} (< {rule.min_dense_solved})"
    elif low < -rule.margin:
        passes, reason = False, f"a loss beyond {rule.margin:g} points is not excluded (lower bound {low:+.1f})"
    else:
        passes, reason = False, "not decided: the file keeps means only, not the paired items"
    return Verdict(passes, reason, n, dense_solved, only_dense, only_setting, round(diff, 3), round(low, 3),
                   round(high, 3), {}, {**asdict(rule), "from_summary": True})


def items_for_power(loss: float = 5.0, discordance: float = 0.10, power: float = 0.8, z: float = Z95) -> int:
    """Paired items needed so that a true loss of `loss` points shows (the 95% interval lies below 0) with the given
    power, at a discordance rate `discordance` (share of items where the two disagree): Connor's (1987) sample size
    for McNemar's test, n = (z sqrt(psi) + z_b sqrt(psi - delta^2))^2 / delta^2."""
    from statistics import NormalDist

    delta, psi = loss / 100, discordance
    if not 0 < delta <= psi <= 1:
        raise ValueError(f"the discordance rate ({psi}) must be at least the loss ({delta})")
    zb = NormalDist().inv_cdf(power)
    return math.ceil((z * math.sqrt(psi) + zb * math.sqrt(psi - delta * delta)) ** 2 / (delta * delta))
