"""`orthorank zeroshot`: zero-shot accuracy (PIQA, WinoGrande, HellaSwag, ARC-e, ARC-c, ...) through
lm-evaluation-harness, offline, for a dense, OrthoRank or layer-pruned model."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from orthorank.harness import distributed as dist
from orthorank.harness.api.common import (
    check_plan_options,
    load_model_from_options,
    plan_for,
    saved_plan_path,
    store_from_options,
)
from orthorank.harness.api.options import ZeroshotOptions
from orthorank.errors import UserError
from orthorank.harness.evaluation.compare import Row
from orthorank.harness.evaluation.stats import mean_stderr
from orthorank.harness.evaluation.zeroshot.convert import resolve_data_dir
from orthorank.harness.evaluation.zeroshot.registry import TASKS, check_task_files, resolve_tasks
from orthorank.harness.evaluation.zeroshot.runner import DEFAULT_BATCH_SIZE, format_table, require_lm_eval
from orthorank.harness.evaluation.zeroshot.scoring import evaluate_zeroshot_rows
from orthorank.harness.results import check_writable, write_json


def run(opts: ZeroshotOptions) -> int:
    check_writable(opts.json_out, opts.overwrite)
    names = resolve_tasks(opts.tasks)
    check_plan_options(opts)
    root = resolve_data_dir(opts.data_dir)
    check_task_files(names, root)
    require_lm_eval()
    saved = saved_plan_path(opts)
    if isinstance(opts.batch_size, str):
        raise UserError("the per-item scorer takes a whole-number --batch-size")
    dist.init(opts.device)
    opts = dataclasses.replace(opts, device=dist.local_device(opts.device))  # the caller's options stay theirs
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError(f"{opts.model} is a random-weight shape; zero-shot evaluation needs a real model")
    plan = plan_for(opts, lm, saved)
    label = plan.label()
    batch_size = opts.batch_size or DEFAULT_BATCH_SIZE
    start = time.perf_counter()
    zs = evaluate_zeroshot_rows(lm, [Row(label, plan.target_sparsity or 0.0, plan)], names, opts.limit, root,
                                store_from_options(opts), batch_size)[0]
    seconds = time.perf_counter() - start
    if not dist.is_main():
        return 0
    results = {}
    for t in names:
        results[t] = {}
        for metric, x in zs[t].items():
            if metric == "perplexity":  # LAMBADA: per-item log-likelihoods, aggregated as the harness does
                results[t]["perplexity"] = float(np.exp(-x.mean()))
                continue
            results[t][metric] = float(x.mean())
            results[t][f"{metric}_stderr"] = mean_stderr(x)
    examples = {t: int(len(next(iter(zs[t].values())))) for t in names}
    layers = ",".join(map(str, plan.layers)) or "-"
    print(format_table({label: results}, names, metric=opts.metric), end="")
    for name in names:
        extra = "  ".join(f"{k} {v:.4f}" for k, v in results[name].items() if not k.endswith("_stderr"))
        print(f"{TASKS[name].title}: {extra}  ({examples[name]} examples)")
    print(f"(method {plan.method}, layers {layers}, nominal sparsity {plan.nominal_sparsity:.3f}, batch size "
          f"{batch_size}, {dist.world_size()} process(es), {seconds:.1f}s)")
    if opts.json_out:
        path = write_json(opts.json_out, {
            "command": "zeroshot",
            "model": lm.name,
            "tasks": names,
            "limit": opts.limit,
            "seed": opts.seed,
            "plan": plan.to_dict(),
            "results": results,
            "outcomes": {t: {m: x.tolist() for m, x in zs[t].items()} for t in names},
            "examples": examples,
            "batch_size": batch_size,
            "world_size": dist.world_size(),
            "harness_tasks": {t: TASKS[t].offline for t in names},
            "seconds": round(seconds, 3),
        }, device=lm.device, overwrite=opts.overwrite)
        print(f"wrote {path}")
    return 0
