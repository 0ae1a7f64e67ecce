"""Greedy generation of left-padded batches under whatever plan the model carries, with time to first token
and decode speed (shared by `generate`, `longctx` and `longbench`)."""

from __future__ import annotations

import time

import torch
from transformers import CompileConfig, TextStreamer

from orthorank.harness.runtime.bandwidth import decode_bound, decode_step_bytes, process_bandwidth
from orthorank.models.loading import input_device
from orthorank.models.static_decode import allocated_static_cache, cache_kwarg, compile_available, warn_once


class Timer:
    """A streamer that stamps the first new token and the last one (and prints text for one prompt)."""

    def __init__(self, tokenizer, echo: bool) -> None:
        self.streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if echo else None
        self.start = time.perf_counter()
        self.calls = 0
        self.first: float | None = None
        self.last: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls >= 2:  # the first call carries the prompt
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now
        if self.streamer is not None:
            self.streamer.put(value)

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


@torch.no_grad()
def compile_kwargs(device: torch.device, compile: bool) -> dict:
    """transformers' generate compiles its decode step only on accelerators by default; `compile` asks for it on
    every device (its CPU backend needs a C++ compiler: without one, one warning line and eager decoding), and
    without it the step stays eager everywhere, so a measured speed says which path it timed."""
    if not compile:
        return {"disable_compile": True}

    why = compile_available(device)
    if why is not None:
        warn_once(f"{why}; decoding eagerly")
        return {"disable_compile": True}

    config = CompileConfig(fullgraph=False, dynamic=False)  # selection layers may graph-break (threshold decode)
    config._compile_all_devices = True
    return {"compile_config": config}


def generate_rows(lm, rows: list[list[int]], max_new_tokens: int, echo: bool = False,
                  stop_ids: list[int] | None = None, compile: bool = False,
                  cache_len: int | None = None) -> tuple[list[list[int]], dict]:
    """Greedy generation of one batch (left-padded); returns the new tokens per row and the timings. `compile`:
    the decode step compiled (see compile_kwargs); greedy outputs equal the eager path's. `cache_len`: the static
    cache's length (default prompt + new tokens); a warm-up run with the timed run's length compiles the same graph."""
    tok = lm.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids, mask = left_pad(rows, pad)
    device = input_device(lm.model)
    # A static cache allocated before the prefill: the memory guard's estimate is then what the process takes
    # (models/static_decode.py), and decode steps write in place instead of concatenating the cache.
    compiling = compile_kwargs(device, compile)
    cache = allocated_static_cache(lm.model, len(rows), max(cache_len or 0, ids.shape[1] + max_new_tokens))
    timer = Timer(tok, echo)
    out = lm.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                            do_sample=False, pad_token_id=pad, streamer=timer, **{cache_kwarg(lm.model): cache},
                            eos_token_id=stop_ids or tok.eos_token_id, **compiling)
    del cache
    end = time.perf_counter()
    new = out[:, ids.shape[1]:].tolist()
    stops = set(stop_ids or [tok.eos_token_id])
    trimmed = [r[: next((i for i, t in enumerate(r) if t in stops), len(r) - 1) + 1] for r in new]
    n_new = out.shape[1] - ids.shape[1]
    ttft = (timer.first or end) - timer.start
    decode_s = (timer.last or end) - (timer.first or end)
    timing = {"batch": len(rows), "prompt_tokens": int(mask.sum()), "new_tokens_per_row": n_new,
              "decode_impl": "compile" if "compile_config" in compiling else "eager",
              "time_to_first_token_s": ttft,
              "decode_tokens_per_s": (len(rows) * (n_new - 1) / decode_s) if n_new > 1 and decode_s > 0 else None}
    if timing["decode_tokens_per_s"] is not None:
        # what reading the weights and the cache once per step allows (the plan's removed layers read nothing)
        step = decode_step_bytes(lm.model, (), len(rows), ids.shape[1] + n_new // 2)
        timing["bandwidth_bound_tokens_per_s"] = decode_bound(step, len(rows), process_bandwidth(device))
    return trimmed, timing

