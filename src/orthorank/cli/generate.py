"""`orthorank generate`: text from a model under a plan, streamed as it comes, with time to first token and
decode speed at the end.

    orthorank generate --method orthorank --sparsity 0.2 --prompt "The attention sink is" --max-new-tokens 40
    orthorank generate --plan plans/smollm2-135m/sleb-0.2.json --file prompts.txt --chat
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orthorank.cli.common import (
    add_model_args, add_output_args, add_plan_args, check_memory, check_plan_args, load_from_args, plan_for,
    positive_int,
    saved_plan_path,
)
from orthorank.errors import UserError
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.registry import saved
from orthorank.evaluation.generation import generate_rows
from orthorank.models.loading import check_context
from orthorank.results import check_writable, write_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text under a plan (streamed; time to first token, tokens/s)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_plan_args(p, methods=("dense", "prune", *saved()), saved=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt (required: --prompt or --file)")
    src.add_argument("--file", help="a text file of prompts, one per line; batched with left padding (required: "
                                    "--prompt or --file)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64,
                   help="tokens generated per prompt (default %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts per batch for --file (default %(default)s)")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to each prompt")
    p.add_argument("--compile", action="store_true",
                   help="compile the decode step with torch.compile (static cache; the first tokens pay the "
                        "compilation); eager with one warning line where compile cannot run")
    add_output_args(p)
    p.set_defaults(func=run)


def read_prompts(args) -> list[str]:
    if args.prompt is not None:
        prompts = [args.prompt]
    else:
        path = Path(args.file)
        if not path.is_file():
            raise UserError(f"prompt file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"prompt file {path} is not UTF-8 text: {exc}") from None
        prompts = [line.rstrip("\n") for line in text.splitlines()]
        prompts = [p for p in prompts if p.strip()]
        if not prompts:
            raise UserError(f"prompt file {path} holds no prompt (one per line)")
    if any(not p.strip() for p in prompts):
        raise UserError("the prompt is empty")
    return prompts


def encode(tokenizer, prompts: list[str], chat: bool) -> list[list[int]]:
    if chat:
        if getattr(tokenizer, "chat_template", None) is None:
            raise UserError("--chat: this tokenizer has no chat template")
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts]
        return [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    return [tokenizer(p).input_ids for p in prompts]


def run(args) -> int:
    check_writable(args.json_out, args.overwrite)
    check_plan_args(args)
    prompts = read_prompts(args)
    saved = saved_plan_path(args)
    lm = load_from_args(args)
    if lm.tokenizer is None:
        raise UserError(f"{args.model} is a random-weight shape; generation needs a real model with a tokenizer")
    plan = plan_for(args, lm, saved)
    rows = encode(lm.tokenizer, prompts, args.chat)
    for r in rows:
        check_context(lm.model, len(r) + args.max_new_tokens)
    check_memory(lm, min(args.batch_size, len(rows)), max(map(len, rows)),
                 "generate", new_tokens=args.max_new_tokens)
    apply_plan(lm.model, plan)
    results, timings = [], []
    try:
        for i in range(0, len(rows), args.batch_size):
            batch = rows[i: i + args.batch_size]
            echo = len(rows) == 1
            if args.compile:  # compile outside the timed run: same batch, same cache length, two new tokens
                generate_rows(lm, batch, 2, compile=True, cache_len=max(map(len, batch)) + args.max_new_tokens)
            new, timing = generate_rows(lm, batch, args.max_new_tokens, echo=echo, compile=args.compile)
            timings.append(timing)
            for j, toks in enumerate(new):
                text = lm.tokenizer.decode(toks, skip_special_tokens=True)
                results.append({"prompt": prompts[i + j], "output": text, "new_tokens": len(toks)})
                if not echo:
                    print(f"[{i + j + 1}] {prompts[i + j]!r}\n{text}\n", flush=True)
    finally:
        restore_dense(lm.model)
    ttft = sum(t["time_to_first_token_s"] for t in timings) / len(timings)
    speeds = [t["decode_tokens_per_s"] for t in timings if t["decode_tokens_per_s"]]
    bounds = [t["bandwidth_bound_tokens_per_s"] for t in timings if t.get("bandwidth_bound_tokens_per_s")]
    speed = f"{sum(speeds) / len(speeds):.1f} tokens/s" if speeds else "n/a (one new token)"
    if bounds:
        speed += f" (memory-bandwidth bound {sum(bounds) / len(bounds):.1f} tokens/s)"
    print(f"\n{plan.method} ({len(plan.layers)} layers, decode {plan.selection.decode if plan.selection else '-'}, "
          f"{timings[0]['decode_impl']}): "
          f"time to first token {ttft:.3f}s (mean over {len(timings)} batch(es)), decode {speed}",
          file=sys.stderr)
    if args.json_out:
        write_json(args.json_out, {"command": "generate", "model": lm.name, "plan": plan.to_dict(),
                                   "max_new_tokens": args.max_new_tokens, "chat": args.chat,
                                   "results": results, "timings": timings})
    return 0
