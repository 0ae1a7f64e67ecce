"""Choose a preset from frontier files scored on calibration prompts (method/presets.py): of the settings free on
every model and length measured, the one with the best free speed-ups (their geometric mean), its level the highest
that was free on each (a model where it was free with every layer the schedule may use does not lower it). A frontier scored on the evaluation samples is
refused: a preset is tuned like a plan, on calibration text only, and checked afterwards on evaluation samples.

    orthorank frontier --model smollm2-135m --score-on calibration ... --out studies/long-prompt/calibration/smollm2-135m
    python -m orthorank.harness.study.presets studies/long-prompt/calibration/*/frontier.json --name long-prompt

A candidate is a method as the frontier names its rows: "depth", "orthorank[attention+window=64]" (a policy
variant), "depth[+recent=64]" (a tail chosen on calibration prompts). One without a free point somewhere is out; the
winner's geometric mean must beat 1.0, else the preset is dense.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.harness.evaluation.noninferiority import RULE
from orthorank.method.presets import PRESET_DIR, Preset
from orthorank.harness.results import atomic_write_text


def parse_family(family: str) -> tuple[str, str | None, int]:
    """"depth[+recent=64]" -> ("depth", None, 64); "orthorank[attention+window=64]" -> ("orthorank",
    "attention+window=64", 0); "local[head=192+tail=64]" -> ("local", None, 0) (its spans: `parse_spans_of`)."""
    base, _, rest = family.partition("[")
    spec = rest.rstrip("]")
    if spec.startswith("+recent="):
        return base, None, int(spec.split("=", 1)[1])
    if spec.startswith("head="):
        return base, None, 0
    return base, spec or None, 0


def parse_spans_of(family: str) -> tuple[int, int | None]:
    """"local[head=192+tail=64]" -> (192, 64); a family without spans -> (0, None): the plan's own."""
    spec = family.partition("[")[2].rstrip("]")
    if not spec.startswith("head="):
        return 0, None
    fields = dict(part.split("=", 1) for part in spec.split("+"))
    return int(fields["head"]), int(fields["tail"])


def free_through(entry: dict[str, Any], family: str) -> float | None:
    """The highest level at which `family` was still free in one frontier entry (below its first loss, and no higher
    than measured); None where its highest free point already used every layer the schedule may use (levels past a
    schedule's reach are not measured, and the preset's plan stops at the reach). An entry without its points bounds
    the family at its best free point's level."""
    points = [p for p in entry.get("points", []) if p["method"] == family]
    best = entry["free_speedups"][family]["level"]
    if not points:
        return best
    lost = [p["level"] for p in points if not p["free"]]
    free = [p for p in points if p["free"] and (not lost or p["level"] < min(lost))]
    top = max(free, key=lambda p: p["level"], default=None)
    if top is None:
        return best
    if not lost and top.get("extra", {}).get("plan", {}).get("provenance", {}).get("at_most_reach"):
        return None  # free with every layer the schedule may use: nothing measured bounds it here
    return top["level"]


def choose(frontiers: dict[str, dict[str, Any]], name: str) -> Preset:
    """frontiers: {label (e.g. the model): frontier.json contents}, each scored on calibration prompts.

    A candidate must be free (no retrieval loss shown) on every model and length measured: a preset's first promise is
    that it does not cost answers. Among those, the one with the largest geometric mean of its free speed-ups wins; it
    must exceed 1.0, else the preset is dense. Not the smallest speed-up: where a model lets a setting change little
    (Gemma 3 270M's three full-attention layers for local attention), its free speed-up is 1.0 give or take the
    timing noise, and the smallest would let that noise alone decide between a setting and dense."""
    for label, data in frontiers.items():
        if data.get("scored_on") != "calibration":
            raise UserError(f"{label} was scored on {data.get('scored_on', 'evaluation')} prompts: a preset is chosen "
                            "on calibration prompts only (`orthorank frontier --score-on calibration`)")
    settings = [(label, length, entry) for label, data in frontiers.items()
                for length, entry in data["lengths"].items()]
    if not settings:
        raise UserError("no frontier length to choose a preset from")
    families = sorted({f for _, _, e in settings for f in e["free_speedups"]})
    free_everywhere: dict[str, dict[str, float]] = {}
    for f in families:
        values = [entry["free_speedups"].get(f) for _, _, entry in settings]
        if all(v is not None for v in values):
            speeds = [v["speedup"]["value"] for v in values]
            free_everywhere[f] = {"geometric_mean": round(math.exp(sum(map(math.log, speeds)) / len(speeds)), 4),
                                  "smallest": round(min(speeds), 4)}
    ranked = sorted(free_everywhere, key=lambda f: -free_everywhere[f]["geometric_mean"])
    where = [f"{label} at {length} tokens" for label, length, _ in settings]
    not_free = [f for f in families if f not in free_everywhere]
    if not ranked or free_everywhere[ranked[0]]["geometric_mean"] <= 1.0:
        return Preset(name, "dense", evidence={"reason": "no setting passes the non-inferiority rule (harness/evaluation/"
                                               "noninferiority.py) on every model and length measured with a "
                                               "speed-up", "rule": RULE.describe(), "measured": where, "free_everywhere": free_everywhere,
                                               "not_free_somewhere": not_free, "scored_on": "calibration"})
    family = ranked[0]
    method, policy, tail = parse_family(family)
    head, global_tail = parse_spans_of(family)
    bounds = [b for b in (free_through(entry, family) for _, _, entry in settings) if b is not None]
    level = min(bounds) if bounds else max(entry["free_speedups"][family]["level"] for _, _, entry in settings)
    per_setting = {f"{label} {length}": entry["free_speedups"][family] for label, length, entry in settings}
    # the shortest prompt measured: a length's prompts leave room for the answer, so they are a little shorter
    shortest = min(int(entry.get("prompt_tokens", [length])[0]) for _, length, entry in settings)
    return Preset(name, method, level, tail, policy, shortest,
                  global_head=head, global_tail=global_tail,
                  models=sorted({data["model"] for data in frontiers.values()}),
                  max_length=max(int(length) for _, length, _ in settings),
                  evidence={"chosen": family, "scored_on": "calibration", "free_everywhere": free_everywhere,
                            "not_free_somewhere": not_free, "measured": where,
                            "free_points": {k: {"point": v["point"], "level": v["level"], "speedup": v["speedup"],
                                                "score_mean": v["score"]["mean"]} for k, v in per_setting.items()}})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orthorank.harness.study.presets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("frontiers", nargs="+", help="frontier.json files (one per model)")
    p.add_argument("--name", default="long-prompt", help="the preset's name (default %(default)s)")
    p.add_argument("--out", default=None, help="the preset file (default: src/orthorank/presets/NAME.json)")
    args = p.parse_args(argv)
    try:
        data = {}
        for f in args.frontiers:
            d = json.loads(Path(f).read_text())
            data[f"{d['model']} ({f})"] = d
        preset = choose(data, args.name)
    except (OSError, json.JSONDecodeError, KeyError, UserError) as exc:
        print(f"presets: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else PRESET_DIR / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(preset.to_dict(), indent=1) + "\n")
    print(f"{args.name}: {preset.method}" + (f" at {preset.level:g}" if preset.level else "")
          + (f", tail {preset.tail}" if preset.tail else "") + (f", policy {preset.policy}" if preset.policy else "")
          + f" -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
