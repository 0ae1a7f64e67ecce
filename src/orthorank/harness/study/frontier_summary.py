"""One table over committed frontier files: per model and length, each method's best speed-up among its points that
pass the non-inferiority rule (harness/evaluation/noninferiority.py; "free" in the files), with its interval, where it was
measured, and the first level that did not pass and why; then each model and length's best setting against a speed-up
bar (issue 45's anchor: 1.25x), judged from the interval. Relabel older files first (python -m
orthorank.harness.study.relabel).

    python -m orthorank.harness.study.frontier_summary studies/long-prompt/*/*/frontier.json \\
        --out studies/long-prompt/summary.md --bar 1.25
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.method.local_attention import LocalAttention
from orthorank.method.registry import get_method
from orthorank.harness.results import atomic_write_text

RUN_KINDS = ("preset-check", "calibration", "check")  # folders of runs that are not a method sweep on evaluation items


def _iv(d: dict[str, Any], spec: str = ".3f", unit: str = "") -> str:
    value = d["value"] if "value" in d else d["mean"]  # a speed-up has a value, a score a mean
    return f"{format(value, spec)}{unit} [{format(d['low'], spec)}, {format(d['high'], spec)}]{unit}"


def _diff(score: dict[str, Any]) -> str:
    d = score["diff"]
    return f"{d['value']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"


def bar_verdict(speedup: dict[str, Any], bar: float) -> str:
    """Against the bar from the interval: "above" (its whole interval), "below" (its whole interval), else "not
    decided" (the interval straddles the bar)."""
    if speedup["low"] >= bar:
        return "above"
    if speedup["high"] < bar:
        return "below"
    return "not decided"


def _why(point: dict[str, Any]) -> str:
    v = point.get("verdict") or point["score"].get("verdict")
    if not v:
        return ""
    least = "at least " if v.get("from_summary") else ""  # older files keep means: the fewest pairs they allow
    return f"; {least}{v['only_dense']} only dense / {v['only_setting']} only it; {v['reason']}"


def method_rows(entry: dict[str, Any]) -> list[list[str]]:
    points = entry["points"]
    families = list(dict.fromkeys(p["method"] for p in points if p["method"] != "dense"))
    rows = []
    for f in families:
        mine = sorted((p for p in points if p["method"] == f), key=lambda p: p["level"] or 0.0)
        best = entry["free_speedups"].get(f)
        lost = next((p for p in mine if not p["free"]), None)
        loss = (f"{lost['name']}: {_diff(lost['score'])}{_why(lost)}" if lost
                else "none (every level measured passed)")
        if best is None:
            rows.append([f, "none", "-", "-", "-", "-", loss])
            continue
        point = next(p for p in mine if p["name"] == best["point"])
        rows.append([f, f"{_iv(best['speedup'])}x", f"{best['point']} ({point['layers']} layers)",
                     f"{point['compute']:.3f}", f"{point['ideal_speedup']:.3f}x", _diff(point["score"]), loss])
    return rows


def run_label(source: str, data: dict[str, Any]) -> str:
    """The run's folder (two runs may cover one model and length), with the kind of run where the folders say it:
    studies/long-prompt/preset-check/<model>/4096/frontier.json -> "preset-check 4096"."""
    parts = Path(source).parent.parts
    if len(parts) >= 3 and parts[-2] == data.get("model") and parts[-3] in RUN_KINDS:
        return f"{parts[-3]} {parts[-1]}"
    return parts[-1] if parts else str(source)


def headline(files: dict[str, dict[str, Any]], bar: float, preset: dict[str, Any] | None) -> str:
    """The README's long-prompt lines: the best non-inferior point per model and length, and the shipped preset."""
    table = summarize(files, bar).split("\n\n### ")[0].rstrip() + "\n"
    if preset is None:
        return table
    if preset["method"] == "dense":
        line = (f"`generate --preset {preset['name']}` runs **dense**: "
                f"{preset['evidence'].get('reason', 'no setting passed')}.")
    else:
        tail = preset.get("global_tail")
        spans = (f" (global spans: the sink, the prompt's first {preset.get('global_head', 0)} tokens and its last "
                 f"{LocalAttention().tail if tail is None else tail})" if _is_local(preset["method"]) else "")
        line = (f"`generate --preset {preset['name']}`: {preset['method']} at {preset['level']:g}{spans}, chosen on "
                f"calibration prompts of {', '.join(preset.get('models') or ['every model'])} at "
                f"{preset['min_length']}-{preset.get('max_length') or preset['min_length']} tokens.")
    return table + "\n" + line + "\n"


def _is_local(method: str) -> bool:
    """Whether a preset's method runs local attention (its plans carry global spans)."""
    return "attention" in get_method(method).kind.own_fields


def summarize(files: dict[str, dict[str, Any]], bar: float) -> str:
    out = []
    best_rows = []
    for source, data in files.items():
        run = run_label(source, data)
        for length, entry in data["lengths"].items():
            dense = entry["points"][0]
            items = dense["score"]["n"]
            out += [f"### {data['model']}, {length} tokens ({run})", "",
                    f"`{source}`: {items} needle items, dense {_iv(dense['score'], '.1f')}%; speed-up median of "
                    f"{data['repeats']} interleaved rounds, batch 1, with its bootstrap interval; a point counts "
                    "only where it passes the non-inferiority rule against dense (harness/evaluation/noninferiority.py: "
                    "dense solves >= 30 items, the paired difference's lower bound >= -5 points, no task or layout "
                    "showing a loss); a slice: say so when quoting", "",
                    "| method | non-inferior speed-up [95% CI] | at | compute | FLOP ideal | score vs dense (points) "
                    "| first point that does not pass |",
                    "|---|---|---|---|---|---|---|"]
            rows = method_rows(entry)
            out += ["| " + " | ".join(r) + " |" for r in rows]
            out.append("")
            free = {f: b for f, b in entry["free_speedups"].items() if b is not None}
            solved = f"{items} ({round(dense['score']['mean'] * items / 100)})"
            if free:
                f, b = max(free.items(), key=lambda kv: kv[1]["speedup"]["value"])
                point = next(p for p in entry["points"] if p["name"] == b["point"])
                v = point.get("verdict") or point["score"].get("verdict") or {}
                pairs = f"{v['only_dense']} / {v['only_setting']}" if "only_dense" in v else "-"
                best_rows.append([data["model"], length, run, solved, f, f"{_iv(b['speedup'])}x", b["point"], pairs,
                                  bar_verdict(b["speedup"], bar)])
            else:
                best_rows.append([data["model"], length, run, solved, "none", "-", "-", "-",
                                  "no point passes the rule"])
    head = [f"Best non-inferior speed-up per model and length, against the {bar:g}x bar (above / below: the whole 95% "
            "interval; not decided: the interval straddles it)", "",
            "| model | length | run | items (dense solves) | best setting | speed-up [95% CI] | at | "
            "items only dense / only it solves | vs the bar |",
            "|---|---|---|---|---|---|---|---|---|"]
    head += ["| " + " | ".join(r) + " |" for r in best_rows]
    return "\n".join(head + [""] + out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orthorank.harness.study.frontier_summary", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("frontiers", nargs="+", help="frontier.json files")
    p.add_argument("--out", default=None, help="write the summary here (default: print it)")
    p.add_argument("--bar", type=float, default=1.25, help="the speed-up bar (default %(default)s)")
    p.add_argument("--headline", default=None, metavar="FILE",
                   help="also write the README's lines here: the best table and the shipped preset (--preset)")
    p.add_argument("--preset", default="src/orthorank/presets/long-prompt.json", help="that preset file")
    p.add_argument("--headline-runs", default=None, metavar="TEXT",
                   help="the headline covers only the frontier files whose path contains TEXT (e.g. /suite/: the "
                        "runs large enough for the rule); the summary covers all")
    args = p.parse_args(argv)
    try:
        files = {}
        for f in args.frontiers:
            data = json.loads(Path(f).read_text())
            if not data.get("complete"):
                raise UserError(f"{f} is not a complete frontier run")
            files[f] = data
        text = summarize(files, args.bar)
        if args.headline:
            preset = json.loads(Path(args.preset).read_text()) if args.preset else None
            chosen = {f: d for f, d in files.items() if args.headline_runs is None or args.headline_runs in f}
            if not chosen:
                raise UserError(f"--headline-runs {args.headline_runs}: no frontier file's path contains it")
            atomic_write_text(Path(args.headline), headline(chosen, args.bar, preset))
    except (OSError, json.JSONDecodeError, KeyError, UserError) as exc:
        print(f"frontier_summary: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        atomic_write_text(Path(args.out), text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
