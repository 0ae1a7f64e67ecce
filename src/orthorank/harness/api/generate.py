"""`orthorank generate`: text from a model under a plan, streamed as it comes, with time to first token and
decode speed at the end.

    orthorank generate --method orthorank --sparsity 0.2 --prompt "The attention sink is" --max-new-tokens 40
    orthorank generate --plan plans/smollm2-135m/sleb-0.2.json --file prompts.txt --chat
"""

from __future__ import annotations

import sys
from pathlib import Path

from orthorank.harness.api.common import (
    check_memory, check_plan_options, expected_model_name, load_model_from_options, plan_for, saved_plan_file,
    saved_plan_path,
)
from orthorank.harness.api.options import GenerateOptions
from orthorank.errors import UserError
from orthorank.harness.evaluation.generation import generate_rows
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.cost import Arch
from orthorank.method.plan import Plan
from orthorank.method.presets import Preset, load_preset, preset_plan, with_spans
from orthorank.method.registry import get_method, is_reference
from orthorank.models.loading import check_context
from orthorank.harness.results import check_writable, write_json


def read_prompts(opts: GenerateOptions) -> list[str]:
    if opts.prompt is not None:
        prompts = [opts.prompt]
    else:
        path = Path(opts.file)
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


def _preset(opts: GenerateOptions) -> Preset | None:
    """--preset NAME, checked before the model loads: it replaces --method/--plan, and a preset of a method with
    saved plans needs them."""
    if opts.preset is None:
        return None
    if not is_reference(opts.method) or opts.plan or opts.layers or opts.sparsity is not None:
        raise UserError("--preset chooses the plan: leave out --method, --plan, --layers and --sparsity")
    preset = load_preset(opts.preset)
    if get_method(preset.method).layers == "plan":
        _preset_saved(opts, preset)
    if _spans_set(opts) and not get_method(preset.method).kind.global_spans:
        raise UserError(f"--global-head/--global-tail set local attention's spans; the {preset.name} preset is "
                        f"{preset.method}")
    return preset


def _spans_set(opts: GenerateOptions) -> bool:
    return opts.global_head is not None or opts.global_tail is not None


def _preset_saved(opts: GenerateOptions, preset: Preset, model_name: str | None = None) -> Plan:
    name = model_name or expected_model_name(opts.model)
    for level in (0.2, 0.1):
        try:
            return Plan.load(saved_plan_file(name, preset.method, level, opts.plans_dir, check=False))
        except UserError:
            continue
    raise UserError(f"the {preset.name} preset uses {preset.method}, and {name} has no saved {preset.method} plan; "
                    f"run `orthorank calibrate --method {preset.method}` first")


def run(opts: GenerateOptions) -> int:
    check_writable(opts.json_out, opts.overwrite)
    preset = _preset(opts)
    if preset is None:
        check_plan_options(opts)
        if _spans_set(opts) and not opts.plan:
            raise UserError("--global-head/--global-tail set local attention's spans: use them with --preset "
                            "long-prompt or a local attention --plan FILE")
    prompts = read_prompts(opts)
    saved = saved_plan_path(opts) if preset is None else None
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError(f"{opts.model} is a random-weight shape; generation needs a real model with a tokenizer")
    rows = encode(lm.tokenizer, prompts, opts.chat)
    if preset is None:
        plan = plan_for(opts, lm, saved)
    else:  # built for the longest prompt: the schedule's compute is matched at that length
        base = _preset_saved(opts, preset, lm.name) if get_method(preset.method).layers == "plan" else None
        plan = preset_plan(preset, lm.name, lm.signature(), Arch.from_config(lm.config, lm.num_layers),
                           max(map(len, rows)), base, layer_types=getattr(lm.config, "layer_types", None))
        print(f"preset {preset.name}: {preset.method}" + (f" at {preset.level:g}" if preset.level else "")
              + (f", always updating the last {preset.tail} tokens" if preset.tail else "")
              + f" ({len(plan.layers)} layers changed"
              + (f"; {plan.provenance['why']}" if "why" in plan.provenance else "") + ")", file=sys.stderr)
    if _spans_set(opts) and (preset is None or not plan.kind.dense):  # a preset may run dense on short prompts
        plan = with_spans(plan, opts.global_head, opts.global_tail)
    if plan.attention is not None:
        a = plan.attention
        print(f"local attention spans: the first {a.global_keys} tokens read by every query, the last {a.tail} "
              "reading every key", file=sys.stderr)
    for r in rows:
        check_context(lm.model, len(r) + opts.max_new_tokens)
    check_memory(lm, min(opts.batch_size, len(rows)), max(map(len, rows)),
                 "generate", new_tokens=opts.max_new_tokens)
    apply_plan(lm.model, plan)
    results, timings = [], []
    try:
        for i in range(0, len(rows), opts.batch_size):
            batch = rows[i: i + opts.batch_size]
            echo = len(rows) == 1
            if opts.compile:  # compile outside the timed run: same batch, same cache length, two new tokens
                generate_rows(lm, batch, 2, compile=True, cache_len=max(map(len, batch)) + opts.max_new_tokens)
            new, timing = generate_rows(lm, batch, opts.max_new_tokens, echo=echo, compile=opts.compile)
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
    if opts.json_out:
        write_json(opts.json_out, {"command": "generate", "model": lm.name, "plan": plan.to_dict(),
                                   "max_new_tokens": opts.max_new_tokens, "chat": opts.chat,
                                   "results": results, "timings": timings})
    return 0
