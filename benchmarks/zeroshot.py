"""Zero-shot accuracy of dense, SLEB, Shortened-PPL, ShortGPT and OrthoRank at 10% and 20% sparsity, through
lm-evaluation-harness on the offline task copies (the paper's table: PIQA, WinoGrande, HellaSwag, ARC-e, ARC-c
and the mean; --tasks all adds BoolQ, OpenBookQA and LAMBADA).

Plans are read from plans/<model>/<method>-<sparsity>.json (made by `orthorank calibrate`); missing ones are
skipped with a message. --plan LABEL=FILE adds or replaces a row with any plan file.

    python benchmarks/zeroshot.py                                 # full task sets: hours on a CPU
    python benchmarks/zeroshot.py --limit 100 --out results/zeroshot-limit100
    python benchmarks/zeroshot.py --plan "OrthoRank 20%=my-plan.json" --methods dense

Writes <out>.json (every result, plan and timing) and <out>.md (the table).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from orthorank.cli.common import positive_int
from orthorank.errors import UserError
from orthorank.evaluation.zeroshot.registry import MAIN_TASKS, resolve_tasks
from orthorank.method.plan import Plan
from orthorank.method.plan_store import find_plan, plan_relpath

METHODS = ("dense", "sleb", "shortened-ppl", "shortgpt", "orthorank")
TITLES = {"dense": "Dense", "sleb": "SLEB", "shortened-ppl": "Shortened-PPL", "shortgpt": "ShortGPT",
          "orthorank": "OrthoRank"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of " + ", ".join(METHODS))
    p.add_argument("--sparsities", default="0.1,0.2")
    p.add_argument("--plan", action="append", default=[], metavar="LABEL=FILE",
                   help="an extra (or replacing) row from a plan file; repeatable")
    p.add_argument("--tasks", default=",".join(MAIN_TASKS), help="harness task names, main or all")
    p.add_argument("--limit", type=positive_int, default=None, help="first N examples of each task (a quick look)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--batch-size", type=positive_int, default=8, help="dense/pruned rows; OrthoRank always uses 1")
    p.add_argument("--metric", choices=("acc", "acc_norm"), default="acc")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--out", default="results/zeroshot", help="output prefix: <out>.json and <out>.md")
    p.add_argument("--overwrite", action="store_true")
    return p.parse_args(argv)


def planned_rows(args, model_name: str) -> list[tuple[str, Path | None]]:
    """(row label, plan file or None for dense), skipping saved plans that do not exist."""
    rows: list[tuple[str, Path | None]] = []
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UserError(f"unknown methods {bad}; choose from {', '.join(METHODS)}")
    sparsities = [float(s) for s in args.sparsities.split(",") if s.strip()]
    for method in methods:
        if method == "dense":
            rows.append(("Dense", None))
            continue
        for s in sparsities:
            label = f"{TITLES[method]} {round(s * 100, 6):g}%"
            try:
                rows.append((label, find_plan(model_name, method, s)))
            except UserError:
                print(f"skip {label}: no {plan_relpath(model_name, method, s)} (make it with `orthorank calibrate "
                      f"--model {model_name} --method {method} --sparsity {s:g} --out-dir "
                      f"{plan_relpath(model_name, method, s).parent}`, or pass --plan LABEL=FILE)", file=sys.stderr)
    for item in args.plan:
        label, sep, path = item.partition("=")
        if not sep or not label.strip() or not path.strip():
            raise UserError(f"--plan takes LABEL=FILE, got {item!r}")
        rows = [r for r in rows if r[0] != label.strip()] + [(label.strip(), Path(path.strip()))]
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    from orthorank.evaluation.zeroshot.convert import resolve_data_dir
    from orthorank.evaluation.zeroshot.registry import check_task_files
    from orthorank.evaluation.zeroshot.runner import format_table, require_lm_eval, run_zeroshot
    from orthorank.models.loading import load_model
    from orthorank.results import check_writable, write_json

    out_json, out_md = Path(args.out + ".json"), Path(args.out + ".md")
    for path in (out_json, out_md):
        check_writable(path, args.overwrite)
    names = resolve_tasks(args.tasks)
    root = resolve_data_dir(args.data_dir)
    check_task_files(names, root)
    require_lm_eval()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    rows = planned_rows(args, lm.name)
    if not rows:
        raise UserError("nothing to run: no method has a plan (see the messages above)")

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results, records = {}, []
    for label, path in rows:
        plan = Plan("dense", [], lm.name, lm.signature()) if path is None else Plan.load(path)
        plan.check_model(lm.name, lm.signature())
        info: dict = {}
        print(f"== {label}: {plan.method} layers {plan.layers or '-'} "
              f"(effective sparsity {plan.effective_sparsity:.3f})", file=sys.stderr)
        results[label] = run_zeroshot(lm, plan, names, limit=args.limit, data_dir=root,
                                      batch_size=args.batch_size, info=info)
        records.append({"label": label, "plan_file": str(path) if path else None, "plan": plan.to_dict(),
                        "results": results[label], "examples": info["examples"],
                        "batch_size": info["batch_size"], "seconds": info["seconds"]})
        print(f"   {info['seconds']:.0f}s", file=sys.stderr)
        print(format_table({label: results[label]}, names, metric=args.metric).splitlines()[2], file=sys.stderr)

    table = format_table(results, names, metric=args.metric)
    title = f"Zero-shot accuracy, {lm.name}" + (f" (first {args.limit} examples per task)" if args.limit else "")
    print(f"\n{title}\n\n{table}")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    if out_md.exists() and not args.overwrite:
        raise UserError(f"{out_md} exists; pass --overwrite to replace it")
    out_md.write_text(f"### {title}\n\n{table}")
    write_json(out_json, {"command": "benchmarks/zeroshot.py", "model": lm.name, "tasks": names,
                          "limit": args.limit, "metric": args.metric, "runs": records,
                          "started": started},
               device=lm.device, overwrite=args.overwrite)
    print(f"wrote {out_json} and {out_md}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"benchmarks/zeroshot.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
