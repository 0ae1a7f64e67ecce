"""Selection layers against their FLOP ideal, and the plans that use them against SLEB, from the files
scripts/selection_speed.sh writes:

    python -m orthorank.harness.reports.selection_speed scripts/results/selection-speed --out FILE.md

- the layer: the selective layer's time over the dense layer's (median of the paired per-round ratios, bootstrap
  interval over the interleaved rounds) against the FLOP ideal, and its profiled time per phase (input norm,
  scoring, top-K, gather, attention kernel, projections, MLP, scatter) against each phase's ideal, in points of the
  dense layer's time: what is left to remove;
- the plans: prefill throughput against SLEB's and dense's, paired per round, with the verdict computed from the
  interval (faster: its lower bound above 1; slower: its upper bound below 1; else level).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from orthorank.harness.reports.speed import paired_ratio, speed_ratio
from orthorank.harness.results import atomic_write_text

ROWS = ("orthorank", "router", "router-searched")


def verdict(lo: float, hi: float) -> str:
    return "faster" if lo > 1 else "slower" if hi < 1 else "level"


def _length(T: int) -> str:
    return f"{T // 1024}k" if T % 1024 == 0 else str(T)


def layer_section(data: dict[str, Any]) -> list[str]:
    runs = [r for r in data.get("runs", []) if r.get("mode") == "layer"]
    if not runs:
        return []
    first = runs[0]
    lines = [f"**One selection layer** ({data['model']}, layer {first['layer_index']}, its plan's selection at keep "
             f"ratio {first['kept_tokens_per_row'] / first['seq_len']:.3f}, {data['dtype']}, batch 1; "
             f"{first['repeats']} interleaved rounds): selective time over dense [95% CI] against the FLOP ideal",
             "", "| tokens | selective / dense | FLOP ideal | % of ideal | attention path |", "|---|---|---|---|---|"]
    for r in runs:
        t = r["timing"]
        mid, lo, hi = paired_ratio(t["selective_layer"]["times_s"], t["dense_layer"]["times_s"])
        ideal = r["ideal_selective_cost_fraction"]
        lines.append(f"| {_length(r['seq_len'])} | {mid:.3f} [{lo:.3f}, {hi:.3f}] | {ideal:.3f} | "
                     f"{100 * ideal / mid:.0f}% | {r['attention_path']} ({r['attention_chunks']} chunks) |")
    profiled = [r for r in runs if isinstance(r.get("profile"), dict) and "phases" in r["profile"]]
    if profiled:
        calls = profiled[0]["profile"]["phases"]["calls"]
        lines += ["", f"Where the rest goes: each phase's profiled time over its ideal, in points of the dense layer's "
                      f"profiled time (medians of {calls} profiled calls, alternating dense and selective; ideal: every "
                      "token's input norm, keys and values, the kept rows' share of queries, output projection, MLP and "
                      "norms, the selected queries' attention at their positions, nothing for scoring, top-K, gathers "
                      "and scatters; harness/speed/phase_profile.py)", "",
                  "| phase | " + " | ".join(_length(r["seq_len"]) for r in profiled) + " |",
                  "|---|" + "---|" * len(profiled)]
        names = list(profiled[0]["profile"]["phases"]["phases"])
        for name in names:
            cells = [f"{r['profile']['phases']['phases'][name]['excess_points']:+.1f}" for r in profiled]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        cells = [f"{p['selective_fraction']:.3f} / {p['ideal_fraction']:.3f}"
                 for p in (r["profile"]["phases"] for r in profiled)]
        lines.append("| profiled selective / dense (ideal) | " + " | ".join(cells) + " |")
    return lines


def prefill_section(data: dict[str, Any]) -> list[str]:
    lengths = sorted({int(r["seq_len"]) for r in data.get("runs", []) if r.get("mode") == "prefill"})
    if not lengths:
        return []
    repeats = data["runs"][0].get("repeats")
    lines = [f"**Prefill at {data['sparsity']:g}** ({data['model']}, {data['dtype']}, batch 1, {repeats} interleaved "
             "rounds): throughput over SLEB's and over dense's, median of the paired per-round ratios [95% CI]; "
             "verdict against SLEB from the interval", "",
             "| row | " + " | ".join(f"{_length(T)} vs SLEB | {_length(T)} vs dense" for T in lengths) + " |",
             "|---|" + "---|---|" * len(lengths)]
    for row in ROWS:
        sleb, dense = speed_ratio(data, row, "sleb"), speed_ratio(data, row, "dense")
        if not sleb:
            continue
        cells = []
        for T in lengths:
            s, d = sleb.get(T), dense.get(T)
            cells.append("-" if s is None else f"{s[0]:.3f} [{s[1]:.3f}, {s[2]:.3f}] {verdict(s[1], s[2])}")
            cells.append("-" if d is None else f"{d[0]:.3f} [{d[1]:.3f}, {d[2]:.3f}]")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    sleb_dense = speed_ratio(data, "sleb", "dense")
    lines.append("| sleb | " + " | ".join(
        f"1 | {sleb_dense[T][0]:.3f} [{sleb_dense[T][1]:.3f}, {sleb_dense[T][2]:.3f}]" if T in sleb_dense else "- | -"
        for T in lengths) + " |")
    return lines


def _machine(data: dict[str, Any]) -> str:
    env = data.get("environment", {})
    return (f"{env.get('device_name', '?')}, {env.get('cpu_threads', '?')} threads, torch {env.get('torch', '?')}, "
            f"commit {env.get('git_commit', '?')}, {env.get('time_utc', '?')}")


def summary(folder: Path) -> str:
    parts = []
    for path in sorted(folder.glob("layer-phases-*.json")) + sorted(folder.glob("prefill-*.json")):
        data = json.loads(path.read_text())
        section = layer_section(data) if path.name.startswith("layer-") else prefill_section(data)
        if section:
            parts.append("\n".join(section) + f"\n\n`{path.as_posix()}`: {_machine(data)}.\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orthorank.harness.reports.selection_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    text = summary(args.folder)
    if args.out:
        atomic_write_text(args.out, text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
