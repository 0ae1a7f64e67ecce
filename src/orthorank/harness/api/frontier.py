"""`orthorank frontier`: at each prompt length, how much faster prefill gets per method before long-context answers
get worse (harness/evaluation/frontier.py).

    orthorank frontier --methods dense,sleb,shortgpt,orthorank,depth,progressive,local --levels 0.05,0.1,0.15,0.2 \\
        --lengths 4k,8k --samples 10 --repeats 5 --out DIR

Each method runs at several levels, each level a plan skipping about the compute of removing ceil(s L) layers at
that length: pruning methods and OrthoRank take the first layers of their saved searches' order (greedy searches
are sequential, so a shorter prefix is what the search would have chosen at a lower level); the schedules
(method/schedules.py: depth, progressive) are built for that compute. `--policies` adds rows with other selection
policies on the OrthoRank and depth plans. With `--tails`, every selecting method also gets rows that always update
the prompt's last W tokens (the question; within K, so compute is unchanged), W chosen per method and length on
calibration prompts (the same tasks built from calibration text, checked to share no text with the evaluation
prompts), never on evaluation samples. Every row is scored on the offline suite's needle tasks (paired with
dense, same items, through the result store: runs resume) and timed against dense in interleaved rounds of time to
first token (batch 1, one prompt of that length, the LM head on the last position only).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from orthorank.harness.api.common import expected_model_name, load_model_from_options, store_from_options
from orthorank.harness.api.options import FrontierOptions
from orthorank.errors import UserError
from orthorank.harness.evaluation import frontier
from orthorank.harness.evaluation.longctx import Item, Row, longctx_key, run_row, summarize
from orthorank.harness.evaluation.data import find_data_dir, load_calibration_text
from orthorank.harness.evaluation.longbench import build_prompt_ids, load_task, score_prediction, stop_tokens
from orthorank.harness.api.frontier_rows import (
    checked_preset, level_rows, methods_of, parse_levels, parse_tails, saved_order,
)
from orthorank.harness.api.frontier_suite import chat_modes, largest_shared, parse_spans, span_rows, suite_items
from orthorank.harness.evaluation.longctx_suite import (
    SuiteBuilder, load_pools, load_qa_rows, parse_layouts, parse_lengths, parse_tasks, split_sentences,
)
from orthorank.harness.evaluation.noninferiority import RULE, decide
from orthorank.harness.evaluation.overlap import MAX_SHARED
from orthorank.harness.evaluation.stats import paired_time_ratio
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.cost import Arch, prefill_sparsity
from orthorank.method.policies import parse_variants
from orthorank.method.registry import get_method, is_reference
from orthorank.models.last_token import LastTokenForward
from orthorank.models.sliding_attention import kernel_name
from orthorank.models.loading import check_context, input_device
from orthorank.harness.results import atomic_write_text, check_writable, write_json
from orthorank.harness.runtime.timing import interleaved_rounds, time_call
from orthorank.harness.store import digest, model_fingerprint

SELECTING = ("orthorank", "router", "router-searched", "depth")  # methods whose rows take tails
CALIBRATION_SEED = 1_000_003  # calibration prompts: another seed and calibration text, so no sample repeats


# Calibration prompts' haystacks: text no evaluation prompt can hold. The suite's evaluation pools are the whole
# WikiText-2 test file (its calibration part included: the standard perplexity protocol scores the whole file) and
# C4's evaluation documents, so WikiText-2's calibration part is left out here: at 8k tokens an evaluation haystack
# drawn from it shared 34% of a calibration prompt's text. News is LongBench multi_news' calibration documents.
CALIBRATION_POOLS = ("c4", "news")


def calibration_items(lm, tasks: list[str], length: int, samples: int, data_dir, layouts=("last",),
                      chats=(False,)) -> list[Item]:
    """The suite's tasks built from calibration text (C4's and news' calibration parts, BoolQ's calibration rows)
    with another seed."""
    pools = {name: split_sentences(load_calibration_text(name, data_dir)) for name in CALIBRATION_POOLS}
    qa = load_qa_rows(data_dir, "calibration") if "qa" in tasks else None
    builder = SuiteBuilder(lm.tokenizer, pools, seed=CALIBRATION_SEED, qa_rows=qa)
    return [dataclasses.replace(it, key="calibration/" + it.key)
            for it in _items(builder, lm.tokenizer, tasks, length, samples, layouts, chats)]


def choose_tail(opts: FrontierOptions, lm, row: Row, tails: list[int], items: list[Item],
                settings: dict[str, Any]) -> tuple[int, dict[int, float]]:
    """The tail W (always-updated last tokens) with the best mean score on calibration prompts for this row's plan
    (ties: the shortest); returns W and every candidate's score."""
    sel = row.plan.selection
    variants = [Row(f"{row.name} [+recent={w}]", row.method, row.level,
                    dataclasses.replace(row.plan, selection=dataclasses.replace(sel, keep_recent=w))) for w in tails]
    scores = _scores(opts, lm, variants, items, {**settings, "calibration": True})
    means = {w: float(np.mean([r["score"] for r in scores[v.name].values()])) for w, v in zip(tails, variants)}
    best = max(tails, key=lambda w: (means[w], -w))
    return best, means


def _items(builder: SuiteBuilder, tokenizer, tasks: list[str], length: int, samples: int, layouts=("last",),
           chats=(False,)) -> list[Item]:
    del tokenizer  # the builder tokenizes (a chat template's prompt is tokenized without a second BOS)
    return suite_items(builder, tasks, length, samples, list(layouts), list(chats))


def _scores(opts: FrontierOptions, lm, rows: list[Row], items: list[Item], settings: dict[str, Any],
            suite: str = "ruler-offline") -> dict:
    """{row name: {item key: result}}, through the store under the same keys as `orthorank longctx` (suite
    "ruler-offline") or `orthorank longbench` ("longbench-v1")."""
    store = store_from_options(opts)
    fp = model_fingerprint(lm.model) if store is not None else None
    settings = {**settings, "items": digest([[it.key, it.ids, it.max_new_tokens] for it in items])}
    out = {}
    for row in rows:
        ns = store.namespace("longctx", longctx_key(lm.model, row.applied(), suite, settings, fp)) \
            if store is not None else None
        bar = tqdm(total=len(items), desc=f"{row.name} @ {settings.get('length', settings.get('task'))}", leave=True)
        out[row.name] = run_row(lm, row, items, ns, opts.batch_size, progress=bar.update)
        bar.close()
    return out


def lost(row_scores: dict, dense_scores: dict) -> bool:
    """A loss the sample shows: the paired difference to dense has its whole 95% interval below 0."""
    keys = sorted(dense_scores)
    row, dense = [row_scores[k]["score"] for k in keys], [dense_scores[k]["score"] for k in keys]
    return summarize({"all": row}, {"all": dense})["all"]["diff"]["high"] < 0.0


def _scores_until_loss(opts: FrontierOptions, lm, rows: list[Row], items: list[Item],
                       settings: dict[str, Any]) -> tuple[dict, dict[str, str]]:
    """Every row's scores; with --stop-after-loss, a setting's levels (rows of one `method`, in rising level) stop
    after the first that lost against dense. Returns the scores and {row left out: the row that lost before it}."""
    if not opts.stop_after_loss:
        return _scores(opts, lm, rows, items, settings), {}
    scores = _scores(opts, lm, [rows[0]], items, settings)  # dense
    lost_at: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for row in sorted(rows[1:], key=lambda r: (r.level is None, r.level or 0.0)):
        if row.method in lost_at:
            left_out[row.name] = lost_at[row.method]
            continue
        scores.update(_scores(opts, lm, [row], items, settings))
        if lost(scores[row.name], scores["dense"]):
            lost_at[row.method] = row.name
    return scores, left_out


@torch.no_grad()
def _times(lm, rows: list[Row], ids: list[int], repeats: int) -> dict[str, list[float]]:
    """Seconds to the first token of every row (batch 1, the prompt `ids`), in interleaved rounds."""
    forward = LastTokenForward(lm.model)
    batch = torch.tensor([ids], device=input_device(lm.model))
    device = batch.device
    by_name = {r.name: r for r in rows}

    def time_one(name: str) -> float:
        apply_plan(lm.model, by_name[name].applied())
        try:
            return time_call(lambda: forward(batch, use_cache=True), device)
        finally:
            restore_dense(lm.model)

    def progress(r: int, times: dict[str, list[float]]) -> None:
        dense = times["dense"][-1]
        print(f"frontier: round {r + 1}/{repeats} at {len(ids)} tokens: dense {dense:.2f}s", flush=True)

    return interleaved_rounds([r.name for r in rows], time_one, repeats, warmup=1, on_round=progress)


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in name).strip("-").replace("--", "-")


def _points(rows: list[Row], scores: dict, times: dict[str, list[float]], arch: Arch, length: int,
            items: list[Item] | None = None) -> list:
    keys = sorted(scores["dense"])
    dense_scores = [scores["dense"][k]["score"] for k in keys]
    labels = {it.key: it.labels for it in items or []}
    groups = {kind: [labels.get(k, {}).get(kind, "-") for k in keys] for kind in ("task", "layout", "chat")
              if len({labels.get(k, {}).get(kind) for k in keys}) > 1}
    points = []
    for row in rows:
        vals = [scores[row.name][k]["score"] for k in keys]
        summary = summarize({"all": vals}, None if is_reference(row.method) else {"all": dense_scores})["all"]
        if not is_reference(row.method):  # the non-inferiority rule on the paired items (harness/evaluation/noninferiority.py)
            summary["verdict"] = decide(vals, dense_scores, groups).to_dict()
        else:
            summary["groups"] = {f"{kind}={g}": 100 * float(np.mean([v for v, x in zip(vals, lab) if x == g]))
                                 for kind, lab in groups.items() for g in dict.fromkeys(lab)}
        sp = paired_time_ratio(times["dense"], times[row.name])
        compute = prefill_sparsity(arch, length, row.plan.compute_sparsity(arch, length) or 0.0)
        points.append(frontier.Point(
            row.name, row.method, round(compute, 6),
            {"value": sp.value, "low": sp.low, "high": sp.high, "n": sp.n}, summary,
            layers=len(row.plan.layers), level=row.level, extra={"plan": row.applied().to_dict(), "times_s": times[row.name]}))
    return points


def _longbench_dir(opts: FrontierOptions) -> Path:
    root = find_data_dir(opts.data_dir)
    folder = Path(opts.longbench_dir) if opts.longbench_dir else (Path(root) / "longbench" if root else None)
    if folder is None or not folder.is_dir():
        raise UserError("--longbench: LongBench files not found: pass --longbench-dir (a folder of <task>.jsonl and "
                        "config/)")
    return folder


def _longbench_check(opts: FrontierOptions, lm, rows: list[Row], points: list, length: int) -> dict[str, Any]:
    """LongBench on the free points: dense and, per method, the row of its free speed-up, on the first N examples of
    one task, middle-truncated to the frontier's length (LongBench's own truncation), paired with dense."""
    task = load_task(_longbench_dir(opts), opts.longbench_task, opts.longbench)
    new = min(task.max_new_tokens, opts.longbench_new_tokens or task.max_new_tokens)
    items = [Item(f"{task.name}/{i:05d}", build_prompt_ids(lm.tokenizer, task, row, length - new, chat=True), new,
                  lambda text, t=task.base, r=row: score_prediction(t, text, r["answers"], r["all_classes"]),
                  stop_tokens(lm.tokenizer, task)) for i, row in enumerate(task.rows)]
    free = {b["point"] for b in frontier.free_speedups(points).values() if b is not None}
    chosen = [r for r in rows if is_reference(r.method) or r.name in free]
    settings = {"task": task.name, "limit": opts.longbench, "max_length": length - new, "chat": True,
                "new_tokens": new}
    scores = _scores(opts, lm, chosen, items, settings, suite="longbench-v1")
    dense = [scores["dense"][k]["score"] for k in sorted(scores["dense"])]
    out = {"task": task.name, "examples": len(items), "new_tokens": new, "task_new_tokens": task.max_new_tokens,
           "prompt_tokens": [len(it.ids) for it in items], "rows": {}}
    for row in chosen:
        vals = [scores[row.name][k]["score"] for k in sorted(scores[row.name])]
        out["rows"][row.name] = summarize({"all": vals}, None if is_reference(row.method) else {"all": dense})["all"]
    return out


def _longbench_table(check: dict[str, Any]) -> str:
    lines = ["", f"LongBench {check['task']} on the free points: first {check['examples']} examples, middle-truncated "
             f"to this length ({min(check['prompt_tokens'])}-{max(check['prompt_tokens'])} prompt tokens), "
             f"{check['new_tokens']} new tokens at most (the task's own: {check['task_new_tokens']}); score in %, "
             "paired with dense, 95% bootstrap intervals", "",
             "| row | score [95% CI] | vs dense (points) [95% CI] |", "|---|---|---|"]
    for name, e in check["rows"].items():
        diff = "-" if "diff" not in e else frontier._iv(e["diff"], spec="+.1f")
        lines.append(f"| {name} | {frontier._iv(e, 'mean', '.1f')} | {diff} |")
    return "\n".join(lines) + "\n"


def check(opts: FrontierOptions) -> tuple[list[int], list[str], list[float]]:
    """Bad options and missing plans are one-line errors before the model loads."""
    lengths, tasks, levels = parse_lengths(opts.lengths), parse_tasks(opts.tasks), parse_levels(opts.levels)
    parse_tails(opts.tails)
    parse_layouts(opts.layouts), chat_modes(opts.chat)
    if parse_spans(opts.spans) and "local" not in methods_of(opts):
        raise UserError("--spans sets local attention's global spans: add local to --methods")
    if "qa" in tasks:
        load_qa_rows(opts.data_dir, "evaluation")
    if opts.policies:
        parse_variants(opts.policies)
    checked_preset(opts)
    for m in methods_of(opts):
        if get_method(m).layers == "plan":
            saved_order(opts, expected_model_name(opts.model), m)
    if opts.score_on not in ("evaluation", "calibration"):
        raise UserError(f"--score-on must be evaluation or calibration, got {opts.score_on!r}")
    if opts.longbench and opts.score_on == "calibration":
        raise UserError("--longbench scores LongBench's evaluation examples: leave it out with --score-on "
                        "calibration (a preset is chosen on calibration prompts only)")
    if opts.longbench:
        load_task(_longbench_dir(opts), opts.longbench_task, 1)
    if opts.repeats < 2:
        raise UserError("--repeats must be at least 2: a speed-up interval needs paired rounds")
    return lengths, tasks, levels


def _with_tails(opts: FrontierOptions, lm, rows: list[Row], items: list[Item], tasks: list[str], tails: list[int],
                length: int) -> tuple[list[Row], dict[str, Any]]:
    """The rows plus, per selecting method, its rows with the tail W chosen on calibration prompts (W > 0 only), and
    what was chosen; the calibration prompts are checked to share no text with the evaluation prompts first."""
    chosen: dict[str, Any] = {}
    if not tails:
        return rows, chosen
    calib = calibration_items(lm, tasks, length, opts.calib_samples, opts.data_dir)
    shared = largest_shared(items, calib)
    if shared > MAX_SHARED:
        raise UserError(f"a calibration prompt shares {shared:.0%} of an evaluation prompt's text at {length} "
                        "tokens: the tail would be chosen on evaluation text")
    chosen["largest_shared_with_evaluation"] = round(shared, 4)
    calib_settings = {"tasks": tasks, "length": length, "samples": opts.calib_samples,
                      "seed": CALIBRATION_SEED}
    for method in dict.fromkeys(r.method for r in rows if r.method in SELECTING):
        # at the method's lowest level: where it still retrieves, so candidates can differ (at its highest
        # level every candidate may score 0, and the tie would always choose no tail)
        top = min((r for r in rows if r.method == method and r.variant is None), key=lambda r: r.level)
        w, means = choose_tail(opts, lm, top, tails, calib, calib_settings)
        chosen[method] = {"tail": w, "calibration_scores": means, "chosen_on": top.name}
        print(f"frontier: {method} at {length} tokens: tail W = {w} (calibration scores "
              + ", ".join(f"{k}: {v:.1f}" for k, v in means.items()) + ")", flush=True)
        if w:
            rows += [Row(f"{r.name} [+recent={w}]", f"{method}[+recent={w}]", r.level,
                         dataclasses.replace(r.plan, selection=dataclasses.replace(r.plan.selection,
                                                                                   keep_recent=w)),
                         variant=f"+recent={w}")
                     for r in list(rows) if r.method == method and r.variant is None]
    return rows, chosen


def _scored_items(opts: FrontierOptions, lm, builder: SuiteBuilder, tasks: list[str],
                  length: int) -> tuple[list[Item], dict[str, Any], float | None]:
    """The prompts rows are scored on, their store settings, and (on calibration prompts) the largest share of an
    evaluation prompt's text any of them holds, checked below the overlap bar."""
    layouts, chats = parse_layouts(opts.layouts), chat_modes(opts.chat)
    evaluation = _items(builder, lm.tokenizer, tasks, length, opts.samples, layouts, chats)
    settings = {"tasks": tasks, "length": length, "samples": opts.samples}
    if (layouts, chats) != (["last"], [False]):  # settings of runs before layouts keep their store keys
        settings.update(layouts=layouts, chat=opts.chat)
    if opts.score_on == "evaluation":
        return evaluation, {**settings, "seed": opts.seed}, None
    calib = calibration_items(lm, tasks, length, opts.samples, opts.data_dir, layouts, chats)
    shared = largest_shared(evaluation, calib)
    if shared > MAX_SHARED:
        raise UserError(f"a calibration prompt shares {shared:.0%} of an evaluation prompt's text at {length} "
                        "tokens: scoring on it would tune on evaluation text")
    return calib, {**settings, "seed": CALIBRATION_SEED, "calibration": True}, round(shared, 4)


def run(opts: FrontierOptions) -> int:
    lengths, tasks, levels = check(opts)
    tails = parse_tails(opts.tails)
    out = Path(opts.out)
    check_writable(out / "frontier.json", opts.overwrite)
    pools = load_pools(opts.data_dir)
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError("the frontier needs a real model with a tokenizer (the long-context suite)")
    for length in lengths:
        check_context(lm.model, length)
    arch = Arch.from_config(lm.config, lm.num_layers)
    qa = load_qa_rows(opts.data_dir, "evaluation") if "qa" in tasks else None
    builder = SuiteBuilder(lm.tokenizer, pools, seed=opts.seed, qa_rows=qa)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"command": "frontier", "model": lm.name, "scored_on": opts.score_on, "tasks": tasks,
                              "samples": opts.samples, "layouts": parse_layouts(opts.layouts), "chat": opts.chat,
                              "spans": parse_spans(opts.spans), "rule": RULE.describe(),
                              "sliding_kernel": kernel_name(lm.model),
                              "levels": levels, "repeats": opts.repeats, "lengths": {}}
    tables = []
    for length in lengths:
        t0 = time.perf_counter()
        rows = level_rows(opts, lm, length, levels, print)
        items, settings, shared = _scored_items(opts, lm, builder, tasks, length)
        rows, chosen = _with_tails(opts, lm, rows, items, tasks, tails, length)
        rows += span_rows(rows, parse_spans(opts.spans))
        scores, left_out = _scores_until_loss(opts, lm, rows, items, settings)
        rows = [r for r in rows if r.name in scores]
        times = _times(lm, rows, items[0].ids, opts.repeats)
        points = _points(rows, scores, times, arch, length, items)
        for row in rows[1:]:  # every row's plan, for `bench --plan FILE --profile` and `generate --plan FILE`
            row.applied().save(out / "plans" / f"{length}-{_file_name(row.name)}.json", overwrite=True)
        on = (f"offline suite seed {opts.seed}" if shared is None else "calibration prompts: the tasks built from "
              f"C4's and news' calibration text, seed {CALIBRATION_SEED}, sharing at most {shared:.1%} of an "
              "evaluation prompt's text")
        caption = (f"{lm.name}, {length} tokens: score = mean accuracy (%) on {', '.join(tasks)}, {opts.samples} "
                   f"samples per task, layout ({', '.join(parse_layouts(opts.layouts))}) and chat template "
                   f"({opts.chat}) ({len(items)} items, {on}), paired with dense, 95% "
                   f"bootstrap intervals; speed-up = time to first token of dense / the row's, batch 1, median of "
                   f"{opts.repeats} interleaved rounds with a bootstrap interval over rounds; compute = share of "
                   "the dense prefill's FLOPs skipped at this length (LM head on the last position only); "
                   f"non-inferior = {RULE.describe()} (harness/evaluation/noninferiority.py; the vs-dense column is that "
                   "Newcombe interval, the score's a bootstrap one)")
        tables.append(frontier.table(points, length, caption) + frontier.group_table(points))
        if left_out:
            tables[-1] += ("\nNot scored (`--stop-after-loss`: a lower level of the same setting already lost against "
                           "dense): " + ", ".join(f"{name} (after {after})" for name, after in left_out.items())
                           + ".\n")
        dense = points[0]
        longbench = None
        if opts.longbench:
            longbench = _longbench_check(opts, lm, rows, points, length)
            tables[-1] += _longbench_table(longbench)
        result["lengths"][str(length)] = {
            "points": [{**p.to_dict(), "free": frontier.is_free(p, dense)} for p in points],
            "free_speedups": frontier.free_speedups(points), "tails": chosen, "longbench": longbench,
            "left_out_after_loss": left_out, "largest_shared_with_evaluation": shared,
            "prompt_tokens": [min(len(it.ids) for it in items), max(len(it.ids) for it in items)],
            "seconds": round(time.perf_counter() - t0, 1)}
        frontier.plot(points, length, out / f"frontier-{length}.png", f"{lm.name}: retrieval frontier at {length} "
                      "tokens")
        # every finished length is on disk: a stopped run keeps it (and the store keeps the scores)
        result["complete"] = len(result["lengths"]) == len(lengths)
        atomic_write_text(out / "frontier.md", "\n".join(tables))
        write_json(out / "frontier.json", result, overwrite=True)
        print(tables[-1], flush=True)
    print(f"wrote {out / 'frontier.md'}, {out / 'frontier.json'}")
    return 0
