"""`orthorank longctx` (offline RULER-style suite) and `orthorank longbench` (LongBench v1 files): long-context
accuracy of dense, layer pruning and OrthoRank under each decode policy, with intervals.

    orthorank longctx --methods dense,sleb,orthorank --sparsity 0.2 --lengths 1k,2k,4k --samples 50 --out DIR
    orthorank longbench --methods dense,sleb,orthorank --sparsity 0.2 --tasks multi_news --out DIR
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from orthorank.harness import distributed as dist
from orthorank.harness.api.common import (
    check_memory,
    expected_model_name,
    load_model_from_options,
    saved_plan_file,
    store_from_options,
    variants_without_decode,
)
from orthorank.harness.api.options import LongbenchOptions, LongctxOptions, LongInputOptions
from orthorank.errors import UserError
from orthorank.harness.evaluation.compare import policy_plans
from orthorank.harness.evaluation.data import find_data_dir
from orthorank.harness.evaluation.longbench import (
    available_tasks,
    build_prompt_ids,
    length_bucket,
    load_task,
    score_prediction,
    stop_tokens,
)
from orthorank.harness.evaluation.longctx import Item, Row, fmt, fmt_diff, grouped, longctx_key, run_row, summarize
from orthorank.harness.evaluation.longctx_suite import SuiteBuilder, load_pools, parse_lengths, parse_tasks, score
from orthorank.method.plan import Plan
from orthorank.method.plan_store import sparsity_label
from orthorank.method.policies import DECODE_MODES
from orthorank.method.registry import get_method, is_paper, is_reference, saved
from orthorank.models.loading import check_context
from orthorank.harness.results import atomic_save_figure, atomic_write_text, check_writable, write_json
from orthorank.harness.store import digest, model_fingerprint


OWN_DECODE = "own"  # --decode-modes: each plan under the decode policy it was saved with


def _plan_path(opts: LongInputOptions, model_name: str, label: str, check: bool = True) -> Path:
    return saved_plan_file(model_name, label, opts.sparsity, opts.plans_dir, check=check)


def _rows(opts: LongInputOptions, lm) -> list[Row]:
    policies = _variants(opts)
    methods = [m.strip() for m in opts.methods.split(",") if m.strip()]
    decodes = _decodes(opts)
    rows = []
    for name in methods:
        method = get_method(name, ["dense", *saved()])
        if method.kind.dense:
            rows.append(Row("dense", "dense", None, Plan("dense", [], lm.name, lm.signature())))
            continue
        plan = Plan.load(_plan_path(opts, lm.name, method.plan_label, check=False))
        plan.check_model(lm.name, lm.signature())
        label = f"{name} {sparsity_label(opts.sparsity)}"
        if plan.kind.one_selection:  # decode policies apply where one selection runs every selecting layer
            rows += [Row(f"{label} ({d} decode)", name, opts.sparsity, plan, d) for d in plan_decodes(plan, decodes)]
            for spec, (_, variant) in zip(policies, policy_plans(plan, policies)):
                rows += [Row(f"{label} [{spec}] ({d} decode)", name, opts.sparsity, variant, d, spec)
                         for d in plan_decodes(variant, decodes)]
        else:
            rows.append(Row(label, name, opts.sparsity, plan))
    if not rows:
        raise UserError("--methods names no method")
    return rows


def _check_saved_plans(opts: LongInputOptions) -> None:
    """Missing plans and bad --policies or --decode-modes fail before the model loads."""
    decodes = _decodes(opts)
    for name in (m.strip() for m in opts.methods.split(",") if m.strip()):
        method = get_method(name, ["dense", *saved()])
        if not method.kind.dense:
            plan = Plan.load(_plan_path(opts, expected_model_name(opts.model), method.plan_label, check=False))
            if plan.kind.one_selection:
                for d in plan_decodes(plan, decodes):  # a policy the plan cannot decode under fails here, not mid-run
                    Row(name, name, opts.sparsity, plan, d).applied()
    _variants(opts)


def _decodes(opts: LongInputOptions) -> list[str]:
    decodes = [d.strip() for d in opts.decode_modes.split(",") if d.strip()]
    bad = [d for d in decodes if d not in (*DECODE_MODES, OWN_DECODE)]
    if bad or not decodes:
        raise UserError(f"unknown decode policy {bad[0] if bad else opts.decode_modes!r}; choose from "
                        f"{', '.join((*DECODE_MODES, OWN_DECODE))}")
    return decodes


def plan_decodes(plan: Plan, decodes: list[str]) -> list[str]:
    """The decode policies a plan's rows run under: `own` is the one the plan was saved with (a causal router
    plan's causal decoding, a top-K plan's dense one), so one run can put each plan under its own policy."""
    return list(dict.fromkeys(plan.selection.decode if d == OWN_DECODE else d for d in decodes))


def _variants(opts: LongInputOptions) -> list[str]:
    if not opts.policies:
        return []
    return variants_without_decode(opts.policies, f"orthorank {opts.command}",
                                   "decodes every OrthoRank row under each policy of --decode-modes")


def _evaluate(opts: LongInputOptions, lm, rows: list[Row], parts: list[tuple[str, list[Item], dict]], suite: str) -> dict[str, dict]:
    """Every row on every part (a length of the suite, a LongBench task), parts outermost so that a run stopped
    early has whole tables for the parts it finished. Each (row, part) is its own store namespace: a later run
    with more lengths or tasks reuses what earlier runs computed."""
    store = store_from_options(opts)
    fp = model_fingerprint(lm.model) if store is not None else None
    results: dict[str, dict] = {row.name: {} for row in rows}
    for part, items, settings in parts:
        settings = {**settings, "items": digest([[it.key, it.ids, it.max_new_tokens] for it in items])}
        for row in rows:
            ns = store.namespace("longctx", longctx_key(lm.model, row.applied(), suite, settings, fp)) \
                if store is not None else None
            bar = tqdm(total=len(items), desc=f"{row.name} @ {part}", disable=not dist.is_main(), leave=True)
            t0 = time.perf_counter()
            results[row.name].update(run_row(lm, row, items, ns, opts.batch_size, progress=bar.update))
            bar.close()
            if dist.is_main():
                print(f"{row.name} @ {part}: {len(items)} items in {time.perf_counter() - t0:.0f}s", flush=True)
    return results


def _check_memory(opts: LongInputOptions, lm, parts) -> None:
    """The longest prompt with the most new tokens, at the batch asked, must fit (harness/runtime/memory.py)."""
    items = [it for _, its, _ in parts for it in its]
    if items:
        check_memory(lm, min(opts.batch_size, len(items)), max(len(it.ids) for it in items), opts.command,
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
    baselines = [r for r in rows if not is_reference(r.method) and not is_paper(r.method)]
    versus = [r for r in rows if is_paper(r.method)]
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


def _finish(opts: LongInputOptions, lm, rows, results, tables: list[str], summaries: dict, command: str, extra: dict) -> None:
    if not dist.is_main():
        return
    text = "\n\n".join(tables)
    print("\n" + text)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{command}.md", text + "\n")
    write_json(out / f"{command}.json", {
        "command": command, "model": lm.name, "sparsity": opts.sparsity, "world_size": dist.world_size(),
        "rows": [{"name": r.name, "method": r.method, "level": r.level, "decode": r.decode,
                  "plan": r.applied().to_dict()} for r in rows],
        "summary": summaries, "items": results, **extra}, overwrite=True)
    print(f"wrote {out / (command + '.md')}, {out / (command + '.json')}")


def run_suite(opts: LongctxOptions) -> int:
    tasks, lengths = parse_tasks(opts.tasks), parse_lengths(opts.lengths)
    out = Path(opts.out)
    check_writable(out / "longctx.json", opts.overwrite)
    _check_saved_plans(opts)
    dist.init(opts.device)
    pools = load_pools(opts.data_dir)  # input errors before the model loads (minutes for a 7B model)
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError("the long-context suite needs a real model with a tokenizer")
    for length in lengths:
        check_context(lm.model, length)
    rows = _rows(opts, lm)
    builder = SuiteBuilder(lm.tokenizer, pools, seed=opts.seed)
    parts = []
    for length in lengths:
        items = []
        for task in tasks:
            for i in range(opts.samples):
                s = builder.sample(task, length, i)
                items.append(Item(f"{length:06d}/{task}/{i:04d}", lm.tokenizer(s.prompt).input_ids,
                                  s.max_new_tokens, lambda text, a=s.answers: score(text, a)))
        parts.append((f"{length} tokens", items,
                      {"tasks": tasks, "length": length, "samples": opts.samples, "seed": opts.seed}))
    _check_memory(opts, lm, parts)
    results = _evaluate(opts, lm, rows, parts, "ruler-offline")
    tables, summaries = [], {}
    for length in lengths:
        sub = {r: {k: v for k, v in res.items() if k.startswith(f"{length:06d}/")} for r, res in results.items()}
        table, summary = _tables(rows, sub, lambda k: k.split("/")[1], tasks,
                                 f"Accuracy (%) at {length} tokens, {opts.samples} samples per task (95% bootstrap "
                                 "interval); a sample is correct when every expected string is in the output",
                                 "dense" if "dense" in results else None)
        tables.append(table)
        summaries[str(length)] = summary
    _finish(opts, lm, rows, results, tables, summaries, "longctx", {"tasks": tasks, "lengths": lengths})
    if dist.is_main():
        _plot(rows, summaries, lengths, Path(opts.out) / "longctx.png")
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


def run_longbench(opts: LongbenchOptions) -> int:
    out = Path(opts.out)
    check_writable(out / "longbench.json", opts.overwrite)
    if opts.data_dir:
        data_dir = Path(opts.data_dir)
    else:
        root = find_data_dir()
        if root is None:
            raise UserError("LongBench files not found: pass --data-dir (a folder of <task>.jsonl and config/)")
        data_dir = Path(root) / "longbench"
    if not data_dir.is_dir():
        raise UserError(f"LongBench folder {data_dir} does not exist")
    names = [t.strip() for t in opts.tasks.split(",")] if opts.tasks else available_tasks(data_dir)
    if not names:
        raise UserError(f"no LongBench task files (*.jsonl) in {data_dir}")
    tasks = [load_task(data_dir, n, opts.limit) for n in names]
    _check_saved_plans(opts)
    dist.init(opts.device)
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError("LongBench needs a real model with a tokenizer")
    context = lm.model.config.max_position_embeddings
    rows = _rows(opts, lm)
    parts, buckets = [], {}
    for task in tasks:
        items = []
        budget = opts.max_length or context - task.max_new_tokens
        if budget + task.max_new_tokens > context:
            raise UserError(f"--max-length {budget} + {task.max_new_tokens} new tokens exceed the model's context "
                            f"of {context} tokens")
        for i, row in enumerate(task.rows):
            ids = build_prompt_ids(lm.tokenizer, task, row, budget, chat=not opts.no_chat)
            key = f"{task.name}/{i:05d}"
            buckets[key] = length_bucket(int(row["length"]))
            items.append(Item(key, ids, task.max_new_tokens,
                              lambda text, t=task.base, r=row: score_prediction(t, text, r["answers"],
                                                                                 r["all_classes"]),
                              stop_tokens(lm.tokenizer, task)))
        parts.append((task.name, items, {"task": task.name, "limit": opts.limit, "max_length": opts.max_length,
                                         "chat": not opts.no_chat}))
    _check_memory(opts, lm, parts)
    results = _evaluate(opts, lm, rows, parts, "longbench-v1")
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
    _finish(opts, lm, rows, results, tables, summaries, "longbench",
            {"tasks": names, "data_dir": str(data_dir), "buckets": buckets})
    return 0
