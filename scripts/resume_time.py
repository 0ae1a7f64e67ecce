"""What a killed search costs: run `orthorank calibrate ...`, SIGKILL it right after step K is checkpointed, run the
same command again and time how long it takes to be searching again (loading, calibration windows, the replay of
the K stored steps) against the steps the first run had finished.

    .venv/bin/python scripts/resume_time.py --kill-after 5 --out scripts/results/resume -- \
        calibrate --model smollm2-135m --method orthorank --sparsity 0.1,0.2 --calib-data c4 --calib-tokens 2048 ...

The command after `--` is any `orthorank calibrate` command line with a `--store` (where its steps are
checkpointed); the resumed run is left to finish, so its plan is the one the command would have written
uninterrupted (the resume tests check they are identical). Writes resume.json and resume.md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from orthorank.harness.results import atomic_write_text, write_json  # noqa: E402

STEP = re.compile(r"step (\d+): layer (\d+)")
RESUMED = re.compile(r"resumed (\d+) finished step")


def _run(argv: list[str], kill_after: int | None) -> dict:
    """Run one calibrate; stamp each logged step (seconds since start); SIGKILL after step `kill_after`."""
    cmd = [sys.executable, "-m", "orthorank.harness.cli.main", *argv]
    start = time.perf_counter()
    # calibrate logs its steps on stdout, tqdm and errors go to stderr: read both
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    steps: dict[int, float] = {}
    resumed, log = None, []
    for line in proc.stdout:
        now = time.perf_counter() - start
        log.append(line.rstrip())
        if m := RESUMED.search(line):
            resumed = {"steps": int(m.group(1)), "at_s": round(now, 2)}
        if m := STEP.search(line):
            steps[int(m.group(1))] = round(now, 2)
            if kill_after is not None and int(m.group(1)) >= kill_after:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait()
    return {"returncode": proc.returncode, "wall_s": round(time.perf_counter() - start, 2), "steps_at_s": steps,
            "resumed": resumed, "log_tail": log[-12:]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kill-after", type=int, default=5, help="SIGKILL right after this step is logged (default 5)")
    p.add_argument("--out", default="scripts/results/resume")
    p.add_argument("calibrate", nargs=argparse.REMAINDER, help="-- calibrate ARGS...")
    args = p.parse_args()
    argv = args.calibrate[1:] if args.calibrate[:1] == ["--"] else args.calibrate
    if argv[:1] != ["calibrate"] or "--store" not in argv:
        print("resume_time.py: give an `orthorank calibrate ... --store DIR` command after --", file=sys.stderr)
        return 2
    first = _run(argv, args.kill_after)
    if first["returncode"] != -signal.SIGKILL:
        print(f"the search ended before step {args.kill_after} (exit {first['returncode']})", file=sys.stderr)
        return 1
    second = _run(argv, None)
    killed_at = first["steps_at_s"][args.kill_after]
    first_step = min(first["steps_at_s"])
    next_step = args.kill_after + 1
    per_step = (killed_at - first["steps_at_s"][first_step]) / max(1, args.kill_after - first_step)
    result = {
        "command": ["orthorank", *argv],
        "kill_after_step": args.kill_after,
        "first_run": first,
        "resumed_run": second,
        "killed_run_s": killed_at,
        "resume_overhead_s": second["resumed"]["at_s"] if second["resumed"] else None,
        "next_step_after_resume_s": second["steps_at_s"].get(next_step),
        "mean_step_s_first_run": round(per_step, 2),
        "completed": second["returncode"] == 0,
    }
    out = Path(args.out)
    write_json(out / "resume.json", result, overwrite=True)
    lines = [
        f"A search killed with SIGKILL right after step {args.kill_after} and run again with the same command "
        f"(`orthorank {' '.join(argv)}`).", "",
        "| | seconds |", "|---|---|",
        f"| first run, start to step {args.kill_after} checkpointed (then killed) | {killed_at:.1f} |",
        f"| first run, mean search step | {per_step:.1f} |",
        f"| rerun, start to the {args.kill_after} stored steps replayed (load, windows, one forward) | "
        f"{result['resume_overhead_s']} |",
        f"| rerun, start to step {next_step} | {result['next_step_after_resume_s']} |",
        f"| rerun, whole (to the plan) | {second['wall_s']:.1f} (exit {second['returncode']}) |", "",
        f"Work lost to the kill: the step in progress only (at most one step, {per_step:.0f} s on average here); "
        f"the {args.kill_after} finished steps cost the rerun {result['resume_overhead_s']} s instead of "
        f"{killed_at:.0f} s.",
    ]
    atomic_write_text(out / "resume.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if second["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
