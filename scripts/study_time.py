"""The study's wall time per stage: one run, recorded, and runs set side by side (issue: evidence that costs less).

    # time a study from scratch (a fresh folder and result store: nothing is read from earlier runs)
    .venv/bin/python scripts/study_time.py run --budget quick --label after --out scripts/results/study-time
    # record a study folder that has already run from scratch (its stage-seconds.json), e.g. at an older commit
    .venv/bin/python scripts/study_time.py record --folder /tmp/quick-before --label before --commit ce82535 \
        --wall 431 --out scripts/results/study-time
    # the table: every label's seconds per stage, and each label against the first
    .venv/bin/python scripts/study_time.py table scripts/results/study-time
    # what committed studies cost: their stage seconds and the searches behind their plans
    .venv/bin/python scripts/study_time.py costs studies/smollm2-135m studies/gemma3-270m \
        --out scripts/results/study-time/costs.md

Each JSON holds the budget, the seconds per stage, the wall time, the load average before the run, the versions,
device and git commit (results.environment). Compare runs made on the same machine, one at a time: the machines
are shared and a second job on the two cores doubles every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _write(out: Path, label: str, budget: str, seconds: dict, wall: float, extra: dict) -> Path:
    from orthorank.harness.results import write_json

    path = out / f"{budget}-{label}.json"
    payload = {"label": label, "budget": budget, "stage_seconds": seconds, "wall_s": round(wall, 1), **extra}
    write_json(path, payload, overwrite=True)
    print(f"wrote {path}: {json.dumps(seconds)}, wall {wall:.0f} s")
    return path


def run(args) -> None:
    folder = Path(tempfile.mkdtemp(prefix="study-time-"))
    load = list(os.getloadavg())
    cmd = [str(ROOT / ".venv" / "bin" / "orthorank"), "study", "--model", args.model, "--budget", args.budget,
           "--out", str(folder / "study"), *args.extra]
    started = time.perf_counter()
    try:
        subprocess.run(cmd, check=True, cwd=ROOT)
        wall = time.perf_counter() - started
        seconds = json.loads((folder / "study" / "stage-seconds.json").read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _write(Path(args.out), args.label, args.budget, seconds, wall,
           {"model": args.model, "command": cmd[1:], "load_average_before": load})


def record(args) -> None:
    folder = Path(args.folder)
    seconds = json.loads((folder / "stage-seconds.json").read_text())
    found = folder / "study-manifest.json"
    manifest = json.loads(found.read_text()) if found.is_file() else {}
    _write(Path(args.out), args.label, manifest.get("budget", args.budget), seconds, args.wall,
           {"model": manifest.get("model"), "recorded_from": str(folder), "run_at_commit": args.commit,
            "note": "recorded after the run: the environment below is the recording's, the run's commit is "
                    "run_at_commit"})


def _machine(run: dict) -> str:
    env = run["environment"]
    isa = env.get("cpu_isa")
    if isa is None:  # runs recorded before the CPU's name and instruction sets were
        return "the first machine (AVX-512 with bfloat16; name not recorded)"
    return f"{env.get('device_name', 'cpu')} ({', '.join(isa) or 'no AVX2'})"


def table(args) -> None:
    """Prints the table and writes it to FOLDER/study-time.md (docs/study.md quotes it)."""
    from orthorank.harness.results import atomic_write_text

    runs = [json.loads(p.read_text()) for p in sorted(Path(args.folder).glob("*.json"))]
    lines = []
    # one table per budget and machine: a ratio between two machines' runs would measure the machines
    for budget, machine in sorted({(r["budget"], _machine(r)) for r in runs}):
        rows = sorted((r for r in runs if r["budget"] == budget and _machine(r) == machine),
                      key=lambda r: r["environment"]["time_utc"])
        stages = list(dict.fromkeys(s for r in rows for s in r["stage_seconds"]))
        lines += [f"Study time per stage, budget {budget}, {rows[0].get('model')}, 2 cores of {machine}, one run each, "
                  f"a fresh result store each run (labels: {', '.join(r['label'] + ' at ' + str(r.get('run_at_commit') or r['environment']['git_commit'])[:7] for r in rows)})", "",
                  ("| stage | " + "".join(f"{r['label']} (s) | " for r in rows)
                   + "".join(f"{r['label']} / {rows[0]['label']} | " for r in rows[1:])).rstrip(),
                  "|" + "---|" * (2 * len(rows))]
        for s in stages + ["wall"]:
            vals = [r["wall_s"] if s == "wall" else r["stage_seconds"].get(s) for r in rows]
            ratios = [f"{v / vals[0]:.2f}" if v and vals[0] else "-" for v in vals[1:]]
            lines.append((f"| {s} | " + "".join(("-" if v is None else f"{v:.0f}") + " | " for v in vals)
                          + "".join(f"{x} | " for x in ratios)).rstrip())
        lines.append("")
    text = "\n".join(lines)
    print(text)
    atomic_write_text(Path(args.folder) / "study-time.md", text)


def _plan_searches(folder: Path) -> dict[str, tuple[float | None, bool, int | None]]:
    """Each search behind a study's plans (one search gives both levels), from the plans' provenance: its seconds,
    whether they cover the whole search, and its move evaluations. Hybrid plans written before per-step timing
    (no `search_resumed_steps`) and searches resumed from steps stored without seconds record only their last
    run's time: a lower bound, marked so."""
    path = folder / "plans" / "plans.json"
    listed = json.loads(path.read_text()) if path.is_file() else {"plans": {}}
    plans = list(listed["plans"].values())
    plans_dir = ROOT / listed.get("plans_dir", "")
    if listed.get("plans_dir"):
        plans += [json.loads(f.read_text()) for f in sorted(plans_dir.glob("hybrid-0.*.json"))]
    found: dict[str, tuple[float | None, bool, int | None]] = {}
    replayed: set[str] = set()
    for plan in plans:
        prov = plan.get("provenance", {})
        if "search_seconds" not in prov:
            continue
        name = prov.get("search", plan.get("method"))
        seconds = prov["search_seconds"]
        # Plans from before per-step timing: a level written at 0 s after move evaluations was reached while an
        # interrupted search's stored steps were replayed, so that search's times are its last run's only.
        if "search_resumed_steps" not in prov and seconds == 0 and (prov.get("evaluations") or 0) > 0:
            replayed.add(name)
        whole = seconds is not None and (prov.get("search_resumed_steps") is not None or name not in replayed)
        seen = found.get(name)
        if seen is None or (seconds or 0) > (seen[0] or 0):  # the higher level's search ran longest
            found[name] = (None if seconds is None else float(seconds), whole, prov.get("evaluations"))
    return {k: (v[0], v[1] and k not in replayed, v[2]) for k, v in found.items()}


def _search_row(name: str, seconds: float | None, whole: bool, evaluations: int | None) -> str:
    evals = f"{evaluations} move evaluations" if evaluations else ""
    if whole:
        return f"| search {name} (both levels) | {seconds:.0f} | {seconds / 3600:.2f} |"
    last = "unknown" if seconds is None else f">= {seconds:.0f}"
    return (f"| search {name} (both levels; resumed across sessions, only its last run timed; {evals}) | {last} | "
            f"{'-' if seconds is None else f'>= {seconds / 3600:.2f}'} |")


def costs(args) -> None:
    """What each committed study cost on its machine: the study's own stage seconds (its runs reuse the result store
    where earlier runs computed the same windows, so a stage can cost less than from scratch) and the searches behind
    its plans (run once per model and kept in plans/<model>/)."""
    from orthorank.harness.results import atomic_write_text
    from orthorank.harness.study.stages import stage_names

    always = set(stage_names(optional=False))
    lines = []
    for folder in map(Path, args.folders):
        manifest = json.loads((folder / "study-manifest.json").read_text())
        stages = json.loads((folder / "stage-seconds.json").read_text())
        searches = _plan_searches(folder)
        optional = {k: v for k, v in stages.items() if k not in always}
        core = {k: v for k, v in stages.items() if k not in optional}
        lines += [f"{manifest['model']}, budget {manifest['budget']}, {manifest['dtype']}, 2 cores "
                  f"(`{folder}/stage-seconds.json`, the plans' provenance):", "",
                  "| part | seconds | hours |", "|---|---|---|"]
        lines += [f"| stage {k} | {v:.0f} | {v / 3600:.2f} |" for k, v in core.items()]
        missing = [n for n in stage_names(optional=False) if n not in core]
        label = "stages recorded" if missing else "stages"
        lines.append(f"| **{label}** | **{sum(core.values()):.0f}** | **{sum(core.values()) / 3600:.2f}** |" if core else
                     "| stages | none recorded yet | |")
        lines += [_search_row(k, *v) for k, v in searches.items()]
        total = sum(v[0] or 0.0 for v in searches.values())
        bound = "" if all(v[1] for v in searches.values()) else ">= "
        lines.append(f"| **searches** | **{bound}{total:.0f}** | **{bound}{total / 3600:.2f}** |")
        if missing:
            lines += ["", f"No time recorded for stage {', '.join(missing)}: run by sessions that ended before the "
                      "study did, when stage times were written only at a study's end (now: as each stage ends)."]
        if optional:  # resumed across sessions: its last run's seconds are not its cost (docs/transfer.md has that)
            lines += ["", f"Optional stages not counted: {', '.join(optional)}."]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    atomic_write_text(Path(args.out), text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="smollm2-135m")
    r.add_argument("--budget", default="quick")
    r.add_argument("--label", required=True)
    r.add_argument("--out", default=str(ROOT / "scripts" / "results" / "study-time"))
    r.add_argument("extra", nargs="*", help="more study flags, after --")
    c = sub.add_parser("record")
    c.add_argument("--folder", required=True)
    c.add_argument("--label", required=True)
    c.add_argument("--budget", default="quick")
    c.add_argument("--commit", required=True, help="the commit the recorded run used")
    c.add_argument("--wall", type=float, required=True, help="the run's wall time in seconds")
    c.add_argument("--out", default=str(ROOT / "scripts" / "results" / "study-time"))
    t = sub.add_parser("table")
    t.add_argument("folder")
    k = sub.add_parser("costs")
    k.add_argument("folders", nargs="+")
    k.add_argument("--out", default=str(ROOT / "scripts" / "results" / "study-time" / "costs.md"))
    args = p.parse_args(argv)
    {"run": run, "record": record, "table": table, "costs": costs}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
