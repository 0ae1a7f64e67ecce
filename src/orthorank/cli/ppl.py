"""`orthorank ppl`: perplexity of a dense, OrthoRank or pruned model on WikiText-2, C4 or a text file."""

from __future__ import annotations

from orthorank.models.loading import check_context

import argparse
import time

import torch

from orthorank.cli.common import (
    DATA_DIR_HELP, add_model_args, add_output_args, add_plan_args, check_memory, check_plan_args, load_from_args,
    plan_for, positive_int, saved_plan_path,
)
from orthorank.evaluation.data import load_eval_text
from orthorank.evaluation.compare import dataset_stream
from orthorank.evaluation.perplexity import make_windows, window_nll
from orthorank.evaluation.stats import perplexity_interval
from orthorank.method.cost import Arch
from orthorank import distributed as dist
from orthorank.errors import UserError
from orthorank.method.apply import apply_plan
from orthorank.method.registry import saved
from orthorank.results import check_writable, write_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ppl", help="perplexity on a text domain (wikitext2, c4, news, code) or a text file",
                       description="Perplexity the GPTQ/SLEB way: non-overlapping windows, mean token NLL.")
    add_model_args(p)
    p.add_argument("--dataset", default="wikitext2",
                   help="wikitext2, c4, news, code (docs/data.md), or a path to a UTF-8 text file (default "
                        "%(default)s)")
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--seq-len", type=positive_int, default=2048, help="tokens per window (default %(default)s)")
    p.add_argument("--max-windows", type=positive_int, default=None,
                   help="evaluate the first N windows (default: every window of the dataset)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="windows per forward (default %(default)s)")
    add_plan_args(p, methods=("dense", "prune", *saved()), saved=True)
    add_output_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    check_writable(args.json_out, args.overwrite)
    check_plan_args(args)
    saved = saved_plan_path(args)  # a missing saved plan is an error before the model loads
    text = load_eval_text(args.dataset, args.data_dir)
    dist.init(args.device)  # under torchrun each process scores its share of the windows
    args.device = dist.local_device(args.device)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError(f"{args.model} is a random-weight shape; perplexity needs a real model")
    plan = plan_for(args, lm, saved)
    windows = make_windows(dataset_stream(lm.tokenizer, args.dataset, text, args.seq_len), args.seq_len,
                           args.max_windows)
    check_context(lm.model, args.seq_len)
    check_memory(lm, args.batch_size, args.seq_len, "ppl", loss=True)
    arch = Arch.from_config(lm.config, lm.num_layers)
    apply_plan(lm.model, plan)
    start = time.perf_counter()
    mine = dist.shard(list(range(windows.shape[0])))  # windows r, r + N, ... of this process
    part = window_nll(lm.model, windows[mine], args.batch_size, progress=dist.is_main(),
                      desc=f"ppl {args.dataset}") if mine else torch.zeros(0, dtype=torch.float64)
    scored = sorted(pair for rank_pairs in dist.all_gather(list(zip(mine, part.tolist()))) for pair in rank_pairs)
    nll = torch.tensor([v for _, v in scored], dtype=part.dtype)
    seconds = time.perf_counter() - start
    if not dist.is_main():  # one process prints and writes
        return 0
    ci = perplexity_interval(nll.numpy(), args.seq_len - 1)
    sparsity = plan.sparsity(arch, args.seq_len)
    layers = ",".join(map(str, plan.layers)) or "-"
    print(f"{args.dataset} perplexity {ci.text('.4f')} (95% CI)  (method {plan.method}, "
          f"layers {layers}, sparsity nominal {sparsity['nominal']:.3f} / compute {sparsity['compute']:.3f}, "
          f"{windows.shape[0]} windows x {args.seq_len} tokens, {seconds:.1f}s)")
    result = {"perplexity": ci.value, "ci95": [ci.low, ci.high], "mean_nll": float(nll.sum()) / nll.numel() /
              (args.seq_len - 1), "windows": int(windows.shape[0]), "seq_len": args.seq_len,
              "window_nll": nll.tolist(), "sparsity": sparsity}
    if args.json_out:
        path = write_json(args.json_out, {
            "command": "ppl",
            "model": lm.name,
            "dataset": args.dataset,
            "seq_len": args.seq_len,
            "max_windows": args.max_windows,
            "seed": args.seed,
            "plan": plan.to_dict(),
            "result": result,
            "seconds": round(seconds, 3),
        }, device=lm.device, overwrite=args.overwrite)
        print(f"wrote {path}")
    return 0
