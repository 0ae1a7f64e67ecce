"""Greedy decoding on a static KV cache, with its step compiled where torch.compile runs.

Eager decoding with transformers' dynamic cache concatenates each layer's cache at every new token and makes a few
dozen Python-level module calls per layer. A static cache is allocated once at its final length and written in
place; with it every decode step has the same shapes, so `torch.compile` traces the step once and replays fused
kernels (CUDA graphs on a GPU). Selection layers under the dense decode policy take their dense path before reading
the cache length (method/layer.py), so a step of a dense, pruned or OrthoRank model is one graph. Where compile
cannot run (no C++ compiler for the CPU backend), one warning line is printed and the static-cache loop runs eagerly.
Measured on the 2-core CPU of this project (docs/results.md): the static cache alone changes nothing, compiling
gains about 12% at batch 1 and nothing at batch 32. Generation allocates its static cache up front for memory's
sake (allocated_static_cache).

Greedy outputs equal the eager dynamic-cache path (tests/method/test_static_decode.py): the same kernels up to fusion,
whose float differences do not change an argmax in the tested cases.
"""

from __future__ import annotations

import inspect
import shutil
import sys
from typing import Any, Callable

import torch
from torch import nn
from transformers import StaticCache

from orthorank.models.adapters import get_adapter
from orthorank.models.arch import Arch

IMPLS = ("eager", "static", "compile")
_WARNED: set[str] = set()


def cache_kwarg(module: nn.Module) -> str:
    """transformers 5.17 calls the cache `past_key_values`, later releases `cache` (the old name is deprecated)."""
    params = inspect.signature(type(module).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The cache a forward returned, under either release's name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def compile_available(device: torch.device) -> str | None:
    """None when torch.compile's default backend can run here, else why not (one line)."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    if device.type == "cpu":
        if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            return "no C++ compiler on PATH for torch.compile's CPU backend"
    return None


def allocated_static_cache(model: nn.Module, batch: int, max_len: int) -> Any:
    """A StaticCache of `max_len` positions whose tensors are allocated now, before any activation.

    Allocated lazily (transformers' default), each layer's K/V blocks land between the prefill's transient
    activations; those holes then do not fit the next layer's activations, so the allocator's heap grows: the
    resident peak of a 4k-token generation of the embedded model varied from 417 to 475 MiB between identical runs
    (estimate 361), against 313-315 MiB with the cache allocated first (scripts/results/memory)."""
    config = getattr(model.config, "text_config", None) or model.config
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    arch = Arch.from_config(config)
    devices = set(getattr(model, "hf_device_map", {}).values())
    if len(devices) > 1:  # layers on several devices (or offloaded): each layer's cache goes where its keys are
        return cache
    p = next(model.parameters())
    cache.early_initialization(batch, arch.kv_heads, arch.head_dim, p.dtype, p.device)
    return cache


class StaticDecoder:
    """Prefill then greedy steps for one model as it is now (a plan applied or not), on a static cache.

    step(): [B, 1] next ids -> [B, vocab] logits of the new position. The compiled step is built per instance: make
    a new one after changing the model's layers (applying or removing a plan), since its graph holds them."""

    def __init__(self, model: nn.Module, batch: int, max_len: int, impl: str = "compile") -> None:
        if impl not in ("static", "compile"):
            raise ValueError(f"unknown static decode implementation {impl!r}")
        self.model = model
        self.adapter = get_adapter(model)
        self.decoder = self.adapter.decoder(model)
        self.cache_kw = cache_kwarg(self.decoder)
        self.cache = allocated_static_cache(model, batch, max_len)
        self.batch, self.max_len = batch, max_len
        self.pos = 0
        self.impl = impl
        self._step: Callable[..., torch.Tensor] = self._eager_step
        if impl == "compile":
            device = next(model.parameters()).device
            why = compile_available(device)
            if why is None:
                self._step = torch.compile(self._eager_step, dynamic=False, fullgraph=False)
            else:
                warn_once(f"{why}; decoding eagerly on the static cache")
                self.impl = "static"

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # ids [B, t]; positions [t]: cache slots written
        kwargs: dict[str, Any] = {self.cache_kw: self.cache, "cache_position": positions,
                                  "position_ids": positions[None].expand(ids.shape[0], -1), "use_cache": True}
        if mask is not None:
            kwargs["attention_mask"] = mask
        out = self.decoder(input_ids=ids, **kwargs)
        return self.adapter.head_logits(self.model, out.last_hidden_state[:, -1].contiguous())  # [B, vocab]

    def _eager_step(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._run(ids, positions, None)

    def reset(self) -> None:
        self.cache.reset()
        self.pos = 0

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Eager (prompt lengths vary; compiling them would recompile per length). Unpadded rows."""
        self.reset()
        T = ids.shape[1]
        if T >= self.max_len:
            raise ValueError(f"prompt of {T} tokens leaves no room in a cache of {self.max_len}")
        logits = self._run(ids, torch.arange(T, device=ids.device), None)
        self.pos = T
        return logits

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        if self.pos >= self.max_len:
            raise ValueError(f"the static cache of {self.max_len} positions is full")
        # A fresh position tensor each step (same shape and dtype): the compiled graph takes it as an input.
        logits = self._step(ids, torch.tensor([self.pos], device=ids.device))
        self.pos += 1
        return logits

    def greedy(self, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """[B, new_tokens] greedy continuation of unpadded `ids`."""
        nxt = self.prefill(ids).argmax(-1, keepdim=True)
        out = [nxt]
        for _ in range(new_tokens - 1):
            nxt = self.step(nxt).argmax(-1, keepdim=True)
            out.append(nxt)
        return torch.cat(out, dim=1)
