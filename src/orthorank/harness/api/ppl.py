"""`orthorank ppl`: perplexity of a dense, OrthoRank or pruned model on WikiText-2, C4 or a text file."""

from __future__ import annotations

import dataclasses
import time

import torch

from orthorank.harness import distributed as dist
from orthorank.harness.api.common import check_memory, check_plan_options, load_model_from_options, plan_for, saved_plan_path
from orthorank.harness.api.options import PplOptions
from orthorank.errors import UserError
from orthorank.harness.evaluation.compare import dataset_stream
from orthorank.harness.evaluation.data import load_eval_text
from orthorank.harness.evaluation.perplexity import make_windows, window_nll
from orthorank.harness.evaluation.stats import perplexity_interval
from orthorank.method.apply import apply_plan
from orthorank.method.cost import Arch
from orthorank.models.loading import check_context
from orthorank.harness.results import check_writable, write_json


def run(opts: PplOptions) -> int:
    check_writable(opts.json_out, opts.overwrite)
    check_plan_options(opts)
    saved = saved_plan_path(opts)  # a missing saved plan is an error before the model loads
    text = load_eval_text(opts.dataset, opts.data_dir)
    dist.init(opts.device)  # under torchrun each process scores its share of the windows
    opts = dataclasses.replace(opts, device=dist.local_device(opts.device))  # the caller's options stay theirs
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError(f"{opts.model} is a random-weight shape; perplexity needs a real model")
    plan = plan_for(opts, lm, saved)
    windows = make_windows(dataset_stream(lm.tokenizer, opts.dataset, text, opts.seq_len), opts.seq_len,
                           opts.max_windows)
    check_context(lm.model, opts.seq_len)
    check_memory(lm, opts.batch_size, opts.seq_len, "ppl", loss=True)
    arch = Arch.from_config(lm.config, lm.num_layers)
    apply_plan(lm.model, plan)
    start = time.perf_counter()
    mine = dist.shard(list(range(windows.shape[0])))  # windows r, r + N, ... of this process
    part = window_nll(lm.model, windows[mine], opts.batch_size, progress=dist.is_main(),
                      desc=f"ppl {opts.dataset}") if mine else torch.zeros(0, dtype=torch.float64)
    scored = sorted(pair for rank_pairs in dist.all_gather(list(zip(mine, part.tolist()))) for pair in rank_pairs)
    nll = torch.tensor([v for _, v in scored], dtype=part.dtype)
    seconds = time.perf_counter() - start
    if not dist.is_main():  # one process prints and writes
        return 0
    ci = perplexity_interval(nll.numpy(), opts.seq_len - 1)
    sparsity = plan.sparsity(arch, opts.seq_len)
    layers = ",".join(map(str, plan.layers)) or "-"
    print(f"{opts.dataset} perplexity {ci.text('.4f')} (95% CI)  (method {plan.method}, "
          f"layers {layers}, sparsity nominal {sparsity['nominal']:.3f} / compute {sparsity['compute']:.3f}, "
          f"{windows.shape[0]} windows x {opts.seq_len} tokens, {seconds:.1f}s)")
    result = {"perplexity": ci.value, "ci95": [ci.low, ci.high], "mean_nll": float(nll.sum()) / nll.numel() /
              (opts.seq_len - 1), "windows": int(windows.shape[0]), "seq_len": opts.seq_len,
              "window_nll": nll.tolist(), "sparsity": sparsity}
    if opts.json_out:
        path = write_json(opts.json_out, {
            "command": "ppl",
            "model": lm.name,
            "dataset": opts.dataset,
            "seq_len": opts.seq_len,
            "max_windows": opts.max_windows,
            "seed": opts.seed,
            "plan": plan.to_dict(),
            "result": result,
            "seconds": round(seconds, 3),
        }, device=lm.device, overwrite=opts.overwrite)
        print(f"wrote {path}")
    return 0
