"""Relabel committed frontier files under the non-inferiority rule (harness/evaluation/noninferiority.py): every point's
"free" becomes whether it passes, its verdict is stored beside it, and each method's best speed-up is recomputed.

    python -m orthorank.harness.study.relabel studies/long-prompt/*/*/frontier.json studies/long-prompt/*/*/*/frontier.json

Files written before the rule kept each point's mean score, not its paired items, so their verdicts come from
`decide_from_summary` and none passes (said in each verdict's reason); the numbers themselves are not touched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orthorank.harness.evaluation import frontier
from orthorank.harness.evaluation.noninferiority import RULE
from orthorank.harness.results import atomic_write_text


def _point(d: dict[str, Any]) -> frontier.Point:
    return frontier.Point(d["name"], d["method"], d["compute"], d["speedup"], d["score"], d.get("layers", 0),
                          d.get("level"), d.get("extra", {}))


def relabel(data: dict[str, Any]) -> dict[str, Any]:
    for entry in data["lengths"].values():
        points = [_point(p) for p in entry["points"]]
        dense = points[0]
        for raw, p in zip(entry["points"], points):
            v = frontier.verdict(p, dense)
            raw["free"] = frontier.is_free(p, dense)
            raw["verdict"] = None if v is None else {k: v.to_dict()[k] for k in (
                "passes", "reason", "n", "dense_solved", "only_dense", "only_setting", "diff", "low", "high")}
            if v is not None and v.rule.get("from_summary"):
                raw["verdict"]["from_summary"] = True  # discordant pairs: the fewest the means allow
        entry["free_speedups"] = frontier.free_speedups(points)
    data["rule"] = RULE.describe()
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orthorank.harness.study.relabel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("frontiers", nargs="+", help="frontier.json files, rewritten in place")
    args = p.parse_args(argv)
    try:
        done = {f: relabel(json.loads(Path(f).read_text())) for f in args.frontiers}
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        print(f"relabel: error: {exc}", file=sys.stderr)
        return 2
    for f, data in done.items():
        # the run's own environment (commit, versions) stays: only the labels change
        atomic_write_text(Path(f), json.dumps(data, indent=2, default=str) + "\n")
        kept = sum(p["free"] for e in data["lengths"].values() for p in e["points"][1:])
        print(f"{f}: {kept} point(s) pass the rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
