"""`orthorank longctx` (offline RULER-style suite) and `orthorank longbench` (LongBench v1 files): long-context
accuracy of dense, layer pruning and OrthoRank under each decode policy, with intervals.

    orthorank longctx --methods dense,sleb,orthorank --sparsity 0.2 --lengths 1k,2k,4k --samples 50 --out DIR
    orthorank longbench --methods dense,sleb,orthorank --sparsity 0.2 --tasks multi_news --out DIR
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from orthorank import distributed as dist
from orthorank.cli.common import (
    DATA_DIR_HELP, add_model_args, add_store_args, check_memory, deprecated, expected_model_name, finite_float,
    load_from_args, positive_int, saved_plan_file, store_from_args, variants_without_decode,
)
from orthorank.errors import UserError
from orthorank.evaluation.compare import policy_plans
from orthorank.evaluation.data import find_data_dir
from orthorank.evaluation.longbench import (
    available_tasks, build_prompt_ids, length_bucket, load_task, score_prediction, stop_tokens,
)
from orthorank.evaluation.longctx import Item, Row, fmt, fmt_diff, grouped, longctx_key, run_row, summarize
from orthorank.evaluation.longctx_suite import (
    LENGTHS, TASKS, SuiteBuilder, load_pools, parse_lengths, parse_tasks, score,
)
from orthorank.method.plan import Plan
from orthorank.method.plan_store import sparsity_label
from orthorank.method.policies import DECODE_MODES
from orthorank.method.registry import get_method, saved
from orthorank.models.loading import check_context
from orthorank.results import atomic_save_figure, atomic_write_text, check_writable, write_json
from orthorank.store import digest, model_fingerprint


def _add_common(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--methods", default="dense,sleb,orthorank",
                   help=f"comma-separated, from dense, {', '.join(saved())} (saved plans at --sparsity; default "
                        "%(default)s)")
    p.add_argument("--sparsity", type=finite_float, default=0.2,
                   help="the level of the saved plans (default %(default)s)")
    p.add_argument("--decode-modes", dest="decode_modes", default=",".join(DECODE_MODES), metavar="MODES",
                   help="OrthoRank decode policies, comma-separated, one row each (default: all: "
                        + ",".join(DECODE_MODES) + ")")
    p.add_argument("--policies", default=None, metavar="SPECS",
                   help="add OrthoRank rows with other selection policies on the same layers and ratio (equal "
                        "compute): comma-separated NAME[+recent=W][+first=W], e.g. orthogonal+recent=64 (default: "
                        "none)")
    p.add_argument("--plans-dir", default=None,
                   help="folder of <method>-<sparsity>.json plans (default: plans/<model>/ here or in the repository)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="prompts per generate call (left-padded; default %(default)s)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for <command>.json, .md and the plot")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    add_store_args(p)
    deprecated(p, "--decode-modes", "--decode")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("longctx", help="offline long-context suite (needles, variable tracking, common words)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    p.add_argument("--tasks", default=",".join(TASKS),
                   help=f"comma-separated, from {', '.join(TASKS)} (default: all)")
    p.add_argument("--lengths", default="1k,2k,4k",
                   help=f"prompt lengths in tokens: {', '.join(LENGTHS)} or N (default %(default)s)")
    p.add_argument("--samples", type=positive_int, default=50,
                   help="samples per task and length (default %(default)s)")
    p.set_defaults(func=run_suite)

    q = sub.add_parser("longbench", help="LongBench v1 from its files (prompts, truncation, metrics)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(q)
    q.add_argument("--tasks", default=None, help="task files (stems) in --data-dir (default: every file there)")
    q.add_argument("--limit", type=positive_int, default=None,
                   help="first N examples per task (default: every example)")
    q.add_argument("--max-length", type=positive_int, default=None,
                   help="prompt budget in tokens before middle truncation (default: context - max new tokens)")
    q.add_argument("--no-chat", action="store_true", help="never apply the chat template")
    q.set_defaults(func=run_longbench)


def _plan_path(args, model_name: str, label: str, check: bool = True) -> Path:
    return saved_plan_file(model_name, label, args.sparsity, args.plans_dir, check=check)


def _rows(args, lm) -> list[Row]:
    policies = _variants(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    decodes = _decodes(args)
    rows = []
    for name in methods:
        method = get_method(name, ["dense", *saved()])
        if method.plan_kind == "dense":
            rows.append(Row("dense", "dense", None, Plan("dense", [], lm.name, lm.signature())))
            continue
        plan = Plan.load(_plan_path(args, lm.name, method.plan_label, check=False))
        plan.check_model(lm.name, lm.signature())
        label = f"{name} {sparsity_label(args.sparsity)}"
        if plan.method == "orthorank":
            rows += [Row(f"{label} ({d} decode)", name, args.sparsity, plan, d) for d in decodes]
            for spec, (_, variant) in zip(policies, policy_plans(plan, policies)):
                rows += [Row(f"{label} [{spec}] ({d} decode)", name, args.sparsity, variant, d, spec)
                         for d in decodes]
        else:
            rows.append(Row(label, name, args.sparsity, plan))
    if not rows:
        raise UserError("--methods names no method")
    return rows


def _check_saved_plans(args) -> None:
    """Missing plans and bad --policies or --decode-modes fail before the model loads."""
    for name in (m.strip() for m in args.methods.split(",") if m.strip()):
        method = get_method(name, ["dense", *saved()])
        if method.plan_kind != "dense":
            _plan_path(args, expected_model_name(args.model), method.plan_label)
    _variants(args)
    _decodes(args)


def _decodes(args) -> list[str]:
    decodes = [d.strip() for d in args.decode_modes.split(",") if d.strip()]
    bad = [d for d in decodes if d not in DECODE_MODES]
    if bad or not decodes:
        raise UserError(f"unknown decode policy {bad[0] if bad else args.decode_modes!r}; choose from "
                        f"{', '.join(DECODE_MODES)}")
    return decodes


def _variants(args) -> list[str]:
    if not args.policies:
        return []
    return variants_without_decode(args.policies, f"orthorank {args.command}",
                                   "decodes every OrthoRank row under each policy of --decode-modes")


def _evaluate(args, lm, rows: list[Row], parts: list[tuple[str, list[Item], dict]], suite: str) -> dict[str, dict]:
    """Every row on every part (a length of the suite, a LongBench task), parts outermost so that a run stopped
    early has whole tables for the parts it finished. Each (row, part) is its own store namespace: a later run
    with more lengths or tasks reuses what earlier runs computed."""
    store = store_from_args(args)
    fp = model_fingerprint(lm.model) if store is not None else None
    results: dict[str, dict] = {row.name: {} for row in rows}
    for part, items, settings in parts:
        settings = {**settings, "items": digest([[it.key, it.ids, it.max_new_tokens] for it in items])}
        for row in rows:
            ns = store.namespace("longctx", longctx_key(lm.model, row.applied(), suite, settings, fp)) \
                if store is not None else None
            bar = tqdm(total=len(items), desc=f"{row.name} @ {part}", disable=not dist.is_main(), leave=True)
            t0 = time.perf_counter()
            results[row.name].update(run_row(lm, row, items, ns, args.batch_size, progress=bar.update))
            bar.close()
            if dist.is_main():
                print(f"{row.name} @ {part}: {len(items)} items in {time.perf_counter() - t0:.0f}s", flush=True)
    return results


def _check_memory(args, lm, parts) -> None:
    """The longest prompt with the most new tokens, at the batch asked, must fit (runtime/memory.py)."""
    items = [it for _, its, _ in parts for it in its]
    if items:
        check_memory(lm, min(args.batch_size, len(items)), max(len(it.ids) for it in items), args.command,
                     new_tokens=max(it.max_new_tokens for it in items))


def _longbench_scope(data_dir: Path, tasks) -> str:
    """Which examples a LongBench table covers, e.g. "multi_news: first 20 of 200 examples (a slice)"."""
    parts, sliced = [], False
    for task in tasks:
        with (data_dir / f"{task.name}.jsonl").open(encoding="utf-8") as f:
            total = sum(1 for line in f if line.strip())
        used = len(task.rows)
        sliced |= used < total
        parts.append(f"{task.name}: first {used} of {total} examples" if used < total else f"{task.name}: all {total}")
    return "; ".join(parts) + (" (a slice)" if sliced else "")


def _tables(rows: list[Row], results: dict[str, dict], group_of, groups: list[str], title: str,
            reference: str | None) -> tuple[str, dict]:
    """Markdown table (rows x groups + mean) with intervals and, against `reference`, paired differences."""
    summary: dict[str, Any] = {}
    scores = {}  # row -> {group: item scores, "mean": all of them}, in item order so rows pair up
    for row in rows:
        g = grouped(results[row.name], group_of)
        g["mean"] = [s for grp in groups for s in g.get(grp, [])]
        scores[row.name] = g
    for row in rows:
        ref = scores.get(reference) if row.name != reference else None
        summary[row.name] = summarize(scores[row.name], ref)
    head = "| row | " + " | ".join(groups) + " | mean |\n|---|" + "---|" * (len(groups) + 1)
    lines = [title, "", head]
    for row in rows:
        lines.append(f"| {row.name} | " + " | ".join(fmt(summary[row.name].get(g)) for g in groups + ["mean"])
                     + " |")
    if reference is not None:
        lines += ["", f"Paired difference to {reference} (percentage points, same items; 95% bootstrap interval; "
                      "** = excludes 0)", "", head]
        for row in rows:
            if row.name == reference:
                continue
            lines.append(f"| {row.name} | " + " | ".join(fmt_diff(summary[row.name].get(g))
                                                         for g in groups + ["mean"]) + " |")
    # the paper's claim is OrthoRank against layer pruning at the same sparsity: pair them item by item too
    baselines = [r for r in rows if r.method not in ("dense", "orthorank")]
    versus = [r for r in rows if r.method == "orthorank"]
    for base in baselines if versus else []:
        lines += ["", f"Paired difference to {base.name} (percentage points, same items; 95% bootstrap interval; "
                      "** = excludes 0)", "", head]
        for row in versus:
            diff = summarize(scores[row.name], scores[base.name])
            summary.setdefault("paired", {})[f"{row.name} vs {base.name}"] = {k: v.get("diff") for k, v in diff.items()}
            lines.append(f"| {row.name} | " + " | ".join(fmt_diff(diff.get(k)) for k in groups + ["mean"]) + " |")
    for row in [r for r in rows if r.variant is not None]:
        paper = next((r for r in rows if r.variant is None and r.method == row.method and r.decode == row.decode),
                     None)
        if paper is None:
            continue
        diff = summarize(scores[row.name], scores[paper.name])
        summary.setdefault("paired", {})[f"{row.name} vs {paper.name}"] = {k: v.get("diff") for k, v in diff.items()}
        lines += ["", f"Paired difference to {paper.name} (the plan's own policy; percentage points, same items; 95% "
                      "bootstrap interval; ** = excludes 0)", "", head,
                  f"| {row.name} | " + " | ".join(fmt_diff(diff.get(k)) for k in groups + ["mean"]) + " |"]
    return "\n".join(lines), summary


def _finish(args, lm, rows, results, tables: list[str], summaries: dict, command: str, extra: dict) -> None:
    if not dist.is_main():
        return
    text = "\n\n".join(tables)
    print("\n" + text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{command}.md", text + "\n")
    write_json(out / f"{command}.json", {
        "command": command, "model": lm.name, "sparsity": args.sparsity, "world_size": dist.world_size(),
        "rows": [{"name": r.name, "method": r.method, "level": r.level, "decode": r.decode,
                  "plan": r.applied().to_dict()} for r in rows],
        "summary": summaries, "items": results, **extra}, overwrite=True)
    print(f"wrote {out / (command + '.md')}, {out / (command + '.json')}")


def run_suite(args) -> int:
    tasks, lengths = parse_tasks(args.tasks), parse_lengths(args.lengths)
    out = Path(args.out)
    check_writable(out / "longctx.json", args.overwrite)
    _check_saved_plans(args)
    dist.init(args.device)
    pools = load_pools(args.data_dir)  # input errors before the model loads (minutes for a 7B model)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("the long-context suite needs a real model with a tokenizer")
    for length in lengths:
        check_context(lm.model, length)
    rows = _rows(args, lm)
    builder = SuiteBuilder(lm.tokenizer, pools, seed=args.seed)
    parts = []
    for length in lengths:
        items = []
        for task in tasks:
            for i in range(args.samples):
                s = builder.sample(task, length, i)
                items.append(Item(f"{length:06d}/{task}/{i:04d}", lm.tokenizer(s.prompt).input_ids,
                                  s.max_new_tokens, lambda text, a=s.answers: score(text, a)))
        parts.append((f"{length} tokens", items,
                      {"tasks": tasks, "length": length, "samples": args.samples, "seed": args.seed}))
    _check_memory(args, lm, parts)
    results = _evaluate(args, lm, rows, parts, "ruler-offline")
    tables, summaries = [], {}
    for length in lengths:
        sub = {r: {k: v for k, v in res.items() if k.startswith(f"{length:06d}/")} for r, res in results.items()}
        table, summary = _tables(rows, sub, lambda k: k.split("/")[1], tasks,
                                 f"Accuracy (%) at {length} tokens, {args.samples} samples per task (95% bootstrap "
                                 "interval); a sample is correct when every expected string is in the output",
                                 "dense" if "dense" in results else None)
        tables.append(table)
        summaries[str(length)] = summary
    _finish(args, lm, rows, results, tables, summaries, "longctx", {"tasks": tasks, "lengths": lengths})
    if dist.is_main():
        _plot(rows, summaries, lengths, Path(args.out) / "longctx.png")
    return 0


def _plot(rows, summaries, lengths, path: Path) -> None:
    import matplotlib  # lazily: optional on the bench path (only figures need matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazily: optional on the bench path (only figures need matplotlib)

    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        m = [summaries[str(L)][row.name]["mean"] for L in lengths]
        y = [e["mean"] for e in m]
        err = [[e["mean"] - e["low"] for e in m], [e["high"] - e["mean"] for e in m]]
        ax.errorbar(lengths, y, yerr=err, marker="o", capsize=3, label=row.name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{L // 1024}k" if L % 1024 == 0 else str(L) for L in lengths])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("accuracy, mean over tasks (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)


def run_longbench(args) -> int:
    out = Path(args.out)
    check_writable(out / "longbench.json", args.overwrite)
    if args.data_dir:
        data_dir = Path(args.data_dir)
    else:
        root = find_data_dir()
        if root is None:
            raise UserError("LongBench files not found: pass --data-dir (a folder of <task>.jsonl and config/)")
        data_dir = Path(root) / "longbench"
    if not data_dir.is_dir():
        raise UserError(f"LongBench folder {data_dir} does not exist")
    names = [t.strip() for t in args.tasks.split(",")] if args.tasks else available_tasks(data_dir)
    if not names:
        raise UserError(f"no LongBench task files (*.jsonl) in {data_dir}")
    tasks = [load_task(data_dir, n, args.limit) for n in names]
    _check_saved_plans(args)
    dist.init(args.device)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError("LongBench needs a real model with a tokenizer")
    context = lm.model.config.max_position_embeddings
    rows = _rows(args, lm)
    parts, buckets = [], {}
    for task in tasks:
        items = []
        budget = args.max_length or context - task.max_new_tokens
        if budget + task.max_new_tokens > context:
            raise UserError(f"--max-length {budget} + {task.max_new_tokens} new tokens exceed the model's context "
                            f"of {context} tokens")
        for i, row in enumerate(task.rows):
            ids = build_prompt_ids(lm.tokenizer, task, row, budget, chat=not args.no_chat)
            key = f"{task.name}/{i:05d}"
            buckets[key] = length_bucket(int(row["length"]))
            items.append(Item(key, ids, task.max_new_tokens,
                              lambda text, t=task.base, r=row: score_prediction(t, text, r["answers"],
                                                                                 r["all_classes"]),
                              stop_tokens(lm.tokenizer, task)))
        parts.append((task.name, items, {"task": task.name, "limit": args.limit, "max_length": args.max_length,
                                         "chat": not args.no_chat}))
    _check_memory(args, lm, parts)
    results = _evaluate(args, lm, rows, parts, "longbench-v1")
    ref = "dense" if "dense" in results else None
    scope = _longbench_scope(data_dir, tasks)
    table, summary = _tables(rows, results, lambda k: k.split("/")[0], names,
                             f"LongBench v1 score (%, 95% bootstrap interval over examples; {scope})", ref)
    tables, summaries = [table], {"tasks": summary}
    bucket_names = [b for b in ("0-4k", "4-8k", "8k+") if b in set(buckets.values())]
    table_e, summary_e = _tables(rows, results, lambda k: buckets[k], bucket_names,
                                 f"LongBench-E length buckets (words of the original input), all tasks pooled ({scope})",
                                 ref)
    tables.append(table_e)
    summaries["length_buckets"] = summary_e
    _finish(args, lm, rows, results, tables, summaries, "longbench",
            {"tasks": names, "data_dir": str(data_dir), "buckets": buckets})
    return 0
