"""Every committed table the README and docs quote, with the command that made it, its time and the commit it ran
at, read from the result files themselves (their `environment.command_line`, `seconds` and `git_commit`).

    python -m tools.reproduce_index --out scripts/results/reproduce-index.md

A table whose result file records no command (older runs, scripts) names the script that makes it where one is
known; the page says so rather than guess.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orthorank.harness.results import atomic_write_text
from tools.docs_blocks import BLOCK, pages

# tables rendered from several runs by a script: what makes them (their runs' own commands are in their JSON files)
SCRIPTS = {"studies/router/summary.md": "studies/router/evidence.sh, extra.sh, searched.sh, then python -m "
                                        "orthorank.harness.study.router_evidence studies/router/smollm2-135m "
                                        "studies/router/gemma3-270m --out studies/router/summary.md",
           "studies/long-prompt/summary.md": "studies/long-prompt/run.sh, check-preset.sh and suite/calibrate.sh, then python -m "
                                             "orthorank.harness.study.frontier_summary studies/long-prompt/*/*/frontier.json "
                                             "studies/long-prompt/preset-check/*/*/frontier.json "
                                             "studies/long-prompt/suite/calibration/*/*/frontier.json "
                                             "studies/long-prompt/suite/check/*/*/frontier.json "
                                             "--out studies/long-prompt/summary.md --headline "
                                             "studies/long-prompt/headline.md --headline-runs /suite/",
           "studies/long-prompt/speed/sliding-prefill-gemma3-270m.md": "scripts/sliding_prefill.py --model "
               "gemma3-270m --lengths 4096,8192 --rounds 5 --threads 1 --out "
               "studies/long-prompt/speed/sliding-prefill-gemma3-270m.json, then --render that file --md this one",
           "studies/long-prompt/headline.md": "python -m orthorank.harness.study.relabel (older frontier files), then the "
                                              "frontier_summary command above with --headline "
                                              "studies/long-prompt/headline.md --headline-runs /suite/"}

# result JSONs a block's Markdown may sit beside, first match wins
_SIBLINGS = ("{stem}.json", "compare.json", "longctx.json", "study.json", "summary.json", "bench.json")


def result_of(md: Path) -> tuple[Path | None, dict[str, Any]]:
    """The result JSON behind a block's Markdown file, and its contents ({} when there is none)."""
    for pattern in _SIBLINGS:
        candidate = md.parent / pattern.format(stem=md.stem)
        if candidate.is_file():
            try:
                return candidate, json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError):
                continue
    return None, {}


def rows(root: Path, index: str | None = None) -> list[dict[str, Any]]:
    """One row per generated block of the README and docs, but the index's own (`index`, repository-relative)."""
    out = []
    for page in pages(root):
        for m in BLOCK.finditer(page.read_text()):
            if m["path"] == index:
                continue
            md = root / m["path"]
            path, data = result_of(md)
            env = data.get("environment") or {}
            seconds = data.get("seconds")
            if seconds is None and isinstance(data.get("stage_seconds"), dict):
                seconds = sum(v for v in data["stage_seconds"].values() if isinstance(v, (int, float)))
            out.append({"page": page.relative_to(root).as_posix(), "table": m["path"],
                        "result": path.relative_to(root).as_posix() if path else None,
                        "command": env.get("command_line"), "seconds": seconds,
                        "commit": env.get("git_commit"), "threads": env.get("cpu_threads"),
                        "device": env.get("device_name")})
    return out


def render(found: list[dict[str, Any]]) -> str:
    lines = ["| page | table | command (as recorded) | seconds | threads | commit |", "|---|---|---|---|---|---|"]
    for r in found:
        script = SCRIPTS.get(r["table"])
        cmd = (f"`{r['command']}`" if r["command"] else f"`{script}` (script)" if script
               else "not recorded (see the page's text for the script)")
        secs = f"{r['seconds']:.0f}" if isinstance(r["seconds"], (int, float)) else "-"
        commit = (r["commit"] or "-")[:8] + (" (dirty tree)" if (r["commit"] or "").endswith("-dirty") else "")
        lines.append(f"| {r['page']} | `{r['table']}` | {cmd} | {secs} | {r['threads'] or '-'} | {commit} |")
    n = len(found)
    known = sum(1 for r in found if r["command"])
    lines += ["", f"{n} tables; {known} record the command that made them."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=".", help="the repository root (default: the current folder)")
    p.add_argument("--out", required=True, help="the Markdown file to write")
    args = p.parse_args(argv)
    root = Path(args.root)
    out = Path(args.out)
    try:
        own = out.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        own = None
    atomic_write_text(out, render(rows(root, own)))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
