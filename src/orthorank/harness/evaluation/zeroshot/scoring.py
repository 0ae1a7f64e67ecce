"""Zero-shot scoring with per-item outcomes: the harness's tasks (prompts, choices, metrics), our batched scorer.

The harness builds each task's requests (context, continuation) and turns per-choice log-likelihoods into per-item
metrics (`task.process_results`); in between, this module computes the log-likelihoods itself so that:
- every item's outcome is kept (paired comparisons between methods on the same items need them);
- OrthoRank rows run batched: rows are right-padded *with* an attention mask, so padding never counts towards a
  row's K nor gets selected, and each row's result equals its batch-size-1 result;
- items go through the result store in fixed chunks and split across torchrun ranks.
Tokenization follows the harness's HF backend for causal models (context trailing spaces moved to the
continuation, continuation tokens = tokens of context + continuation after the context's, no special tokens).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from orthorank.harness import distributed as dist
from orthorank.errors import UserError
from orthorank.harness.evaluation.compare import reference_rows
from orthorank.harness.evaluation.stats import _interval, mean_stderr, paired_difference, resample_indices
from orthorank.harness.evaluation.zeroshot.convert import resolve_data_dir
from orthorank.harness.evaluation.zeroshot.registry import TASKS, tasks_dir
from orthorank.harness.evaluation.zeroshot.runner import _quiet_harness, task_manager
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.registry import is_reference
from orthorank.models.loading import input_device
from orthorank.harness.store import code_version, fill, model_fingerprint

CHUNK_ITEMS = 32  # items per store entry: an interrupted run loses at most this many items


@dataclass
class TaskItems:
    name: str  # harness name, e.g. "piqa"
    task: Any  # the harness Task
    doc_ids: list[int]
    docs: dict[int, dict]
    requests: dict[int, list[tuple[str, str]]]  # doc_id -> (context, continuation) per choice, in choice order
    data_digest: str


def _load_task_dict(names: list[str], manager) -> dict:
    """Task name -> Task, through TaskManager.load where the harness has it (get_task_dict is deprecated there)."""
    if hasattr(manager, "load"):
        return manager.load(names)["tasks"]
    from lm_eval.tasks import get_task_dict  # lazily: optional dependency (orthorank[eval])

    return get_task_dict(names, manager)


def load_tasks(names: list[str], limit: int | None, data_dir) -> dict[str, TaskItems]:
    root = resolve_data_dir(data_dir)
    out = {}
    with _quiet_harness():
        tdict = _load_task_dict([TASKS[n].offline for n in names], task_manager(root))
    for n in names:
        spec = TASKS[n]
        task = tdict[spec.offline]
        if getattr(task.config, "output_type", None) not in ("multiple_choice", "loglikelihood"):
            raise UserError(f"task {n} is neither multiple choice nor log-likelihood; the per-item scorer "
                            "supports those (use `python -m orthorank.harness.evaluation.zeroshot` for others)")
        task.build_all_requests(limit=limit, rank=0, world_size=1)
        reqs: dict[int, list[tuple[int, tuple[str, str]]]] = {}
        docs = {}
        for inst in task.instances:
            reqs.setdefault(inst.doc_id, []).append((inst.idx, tuple(inst.args)))
            docs[inst.doc_id] = inst.doc
        requests = {d: [a for _, a in sorted(v)] for d, v in reqs.items()}
        h = hashlib.sha256()
        for rel in spec.files:
            h.update((root / rel).read_bytes())
        h.update((tasks_dir() / f"{spec.offline}.yaml").read_bytes())
        out[n] = TaskItems(n, task, sorted(requests), docs, requests, h.hexdigest()[:16])
    return out


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The harness's causal _encode_pair, with its default of no special tokens."""
    if not context:
        raise UserError("empty contexts are not supported by the per-item scorer")
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    ctx = tokenizer.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


@torch.no_grad()
def loglikelihoods(model, pairs: list[tuple[list[int], list[int]]], batch_size: int = 16,
                   max_length: int | None = None, pad_id: int = 0) -> list[tuple[float, bool]]:
    """(sum of continuation log-probs, whether greedy decoding reproduces the continuation) per pair.

    Inputs are (context + continuation)[:-1], left-truncated to max_length as the harness does, right-padded with an
    attention mask; the LM head runs only on the continuation positions. Longest first, so batches are tight."""
    device = input_device(model)
    seqs = []
    for ctx, cont in pairs:
        full = (ctx + cont)
        if max_length is not None:
            full = full[-(max_length + 1):]
        seqs.append((full[:-1], cont))
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0]))
    out: list[tuple[float, bool] | None] = [None] * len(seqs)
    head = model.get_output_embeddings()
    decoder = model.get_decoder()
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(seqs[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            inp = seqs[i][0]
            ids[r, :len(inp)] = torch.tensor(inp)
            mask[r, :len(inp)] = 1
        hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).last_hidden_state
        for r, i in enumerate(idx):
            inp, cont = seqs[i]
            n = len(inp)
            h = hidden[r, n - len(cont):n]
            logp = F.log_softmax(head(h).float(), dim=-1)
            target = torch.tensor(cont, device=logp.device)
            ll = float(logp.gather(1, target[:, None]).sum())
            greedy = bool((logp.argmax(-1) == target).all())
            out[i] = (ll, greedy)
    return out  # type: ignore[return-value]


def score_items(model, tokenizer, items: TaskItems, doc_ids: list[int], batch_size: int) -> dict[int, dict]:
    """Per-item metrics ({metric: value}) of the given documents, computed in one batched pass."""
    pairs, owners = [], []
    for d in doc_ids:
        for ctx, cont in items.requests[d]:
            pairs.append(encode_pair(tokenizer, ctx, cont))
            owners.append(d)
    max_len = getattr(model.config, "max_position_embeddings", None)
    lls = loglikelihoods(model, pairs, batch_size, max_len, tokenizer.pad_token_id or 0)
    per_doc: dict[int, list[tuple[float, bool]]] = {}
    for d, res in zip(owners, lls):
        per_doc.setdefault(d, []).append(res)
    out = {}
    for d in doc_ids:
        metrics = items.task.process_results(items.docs[d], per_doc[d])
        out[d] = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, bool, np.floating))}
        out[d]["ll"] = [round(x[0], 6) for x in per_doc[d]]
    return out


def zeroshot_key(model, plan, items: TaskItems, fingerprint: str) -> dict:
    return {"model": fingerprint, "plan": plan.content_hash(), "task": items.name, "data": items.data_digest,
            "dtype": str(next(model.parameters()).dtype), "device": input_device(model).type,
            "code": code_version("zeroshot")}


def evaluate_zeroshot_rows(lm, rows, tasks: list[str], limit: int | None, data_dir, store, batch_size: int = 16,
                           fingerprint: str | None = None, progress: bool = True) -> dict[int, dict[str, dict]]:
    """{row index: {task: {metric: outcomes array over items, in doc order}}} for every row's plan."""
    fp = fingerprint or model_fingerprint(lm.model)
    task_items = load_tasks(tasks, limit, data_dir)
    out: dict[int, dict[str, dict]] = {}
    for ri, row in enumerate(rows):
        apply_plan(lm.model, row.plan)
        try:
            out[ri] = {}
            for name, items in task_items.items():
                ns = store.namespace("zeroshot", zeroshot_key(lm.model, row.plan, items, fp)) if store else None
                label = row.method if is_reference(row.method) else f"{row.method}@{row.level:g}"
                bar = tqdm(total=len(items.doc_ids), desc=f"{label} {name}", leave=False, unit="item",
                           disable=not progress or not dist.is_main())

                def compute(ids: list[int], items=items, bar=bar) -> dict[int, dict]:
                    res = score_items(lm.model, lm.tokenizer, items, ids, batch_size)
                    bar.update(len(ids) * dist.world_size())
                    return res

                values = fill(ns, items.doc_ids, compute, chunk=CHUNK_ITEMS)
                bar.close()
                metrics = [k for k in values[items.doc_ids[0]] if k != "ll"]
                out[ri][name] = {m: np.array([values[d][m] for d in items.doc_ids]) for m in metrics}
        finally:
            restore_dense(lm.model)
    return out


def zeroshot_report(zs: dict[int, dict[str, dict]], rows, tasks: list[str], limit: int | None,
                    metrics: tuple[str, ...] = ("acc", "acc_norm")) -> tuple[str, dict]:
    """Markdown tables (accuracy +- standard error per task and the mean over tasks; paired differences to each
    reference row with 95% bootstrap intervals, ** where the interval excludes 0) and their JSON."""
    n_items = {t: len(next(iter(zs.values()))[t]["acc"]) for t in tasks}
    sliced = any(n_items[t] < TASKS[t].size for t in tasks)
    lines = []
    data: dict[str, Any] = {"items": n_items, "limit": limit, "rows": [], "comparisons": []}
    for metric in metrics:
        cols = [t for t in tasks if metric in zs[0][t]] or []
        use = {t: (metric if metric in zs[0][t] else "acc") for t in tasks}
        caption = (f"Zero-shot {metric} (%), +- standard error; items per task: "
                   + ", ".join(f"{TASKS[t].title} {n_items[t]}" for t in tasks)
                   + (" (a slice: the first items of each task)" if sliced else "")
                   + ("" if len(cols) == len(tasks) else "; tasks without " + metric + " show acc"))
        head = ["method", "level", *[TASKS[t].title + ("" if t in cols else "*") for t in tasks], "Mean"]
        lines += [caption + "\n", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for ri, row in enumerate(rows):
            cells = [row.method, f"{row.level:g}"]
            per_item_mean = np.mean([zs[ri][t][use[t]] for t in tasks], axis=0) if _same_len(zs[ri], tasks) else None
            for t in tasks:
                x = zs[ri][t][use[t]]
                cells.append(f"{100 * x.mean():.2f} +- {100 * mean_stderr(x):.2f}")
            means = [zs[ri][t][use[t]].mean() for t in tasks]
            se = np.sqrt(sum(mean_stderr(zs[ri][t][use[t]]) ** 2 for t in tasks)) / len(tasks)
            cells.append(f"{100 * np.mean(means):.2f} +- {100 * se:.2f}")
            lines.append("| " + " | ".join(cells) + " |")
            data["rows"].append({"method": row.method, "level": row.level, "metric": metric,
                                 **{t: {"accuracy": float(zs[ri][t][use[t]].mean()),
                                        "stderr": mean_stderr(zs[ri][t][use[t]]),
                                        "outcomes": zs[ri][t][use[t]].astype(int).tolist()} for t in tasks},
                                 "mean": float(np.mean(means)), "mean_stderr": float(se)})
            del per_item_mean
        lines += ["", f"Paired differences in {metric} (percentage points, row - reference, same items; 95% "
                  "bootstrap interval; ** = excludes 0)\n"]
        head = ["row", "level", "vs", *[TASKS[t].title for t in tasks], "Mean"]
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for ri, row in enumerate(rows):
            for ref in reference_rows(row, rows):
                rj = rows.index(ref)
                cells = [row.method, f"{row.level:g}", ref.method]
                comp = {}
                for t in tasks:
                    ci = paired_difference(zs[ri][t][use[t]], zs[rj][t][use[t]])
                    comp[t] = ci
                    text = ci.text("+.2f", 100, "item")
                    cells.append(f"**{text}**" if ci.excludes(0.0) else text)
                # mean over tasks: difference of task means, items resampled within each task (paired)
                ci_mean = _mean_over_tasks(zs[ri], zs[rj], tasks, use)
                text = ci_mean.text("+.2f", 100, "item")
                cells.append(f"**{text}**" if ci_mean.excludes(0.0) else text)
                lines.append("| " + " | ".join(cells) + " |")
                data["comparisons"].append({"a": row.method, "b": ref.method, "level": row.level, "metric": metric,
                                            **{t: comp[t].to_dict() for t in tasks}, "mean": ci_mean.to_dict()})
        lines.append("")
    return "\n".join(lines), data


def _same_len(res: dict, tasks: list[str]) -> bool:
    return len({len(res[t]["acc"]) for t in tasks}) == 1


def _mean_over_tasks(a: dict, b: dict, tasks: list[str], use: dict[str, str], iters: int = 10_000, seed: int = 0):
    value = float(np.mean([a[t][use[t]].mean() - b[t][use[t]].mean() for t in tasks]))
    draws = np.zeros(iters)
    for k, t in enumerate(tasks):
        d = a[t][use[t]] - b[t][use[t]]
        draws += d[resample_indices(d.size, iters, seed + k)].mean(1)
    draws /= len(tasks)
    return _interval(value, draws, 0.95, min(a[t][use[t]].size for t in tasks))
