"""The memory-bandwidth bound of decoding.

A decode step at batch B reads every weight of the layers that run once (shared by the B rows), the LM head once,
and each row's KV cache of every layer that runs; it computes little (2 FLOPs per weight per row), so on a CPU at
small batches its time is the bytes it reads over the memory bandwidth. The bound on decode throughput is

    tokens/s <= B * bandwidth / (weight bytes read + B * KV-cache bytes read)   per step,

with the bandwidth measured here as STREAM's Copy does it (a large tensor copied, bytes read + bytes written per
second, best of a few repeats, with the threads the run uses). A decode figure at 60% of this bound is limited by
memory, not by Python or kernel-launch overhead.

Bytes are counted for layers that run: a removed layer reads nothing; a selection layer at decode ("dense" decode
policy) runs whole. Under the threshold policy a bypassed step reads only the layer's norm and K/V weights, which
depends on the data, so those rows are bounded as if every layer ran (their bound is a lower bound).
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import torch
from torch import nn

from orthorank.method.cost import Arch
from orthorank.models.adapters import get_adapter

COPY_MIB = 256  # far above any last-level cache, so the copy measures DRAM


def copy_bandwidth(device: torch.device | str = "cpu", mib: int = COPY_MIB, repeats: int = 5) -> float:
    """Bytes per second of a large tensor copy (read + write, STREAM Copy's convention), best of `repeats`."""
    device = torch.device(device)
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of the destination pages is not bandwidth
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * src.element_size() / best


_MEASURED: dict[str, float] = {}


def process_bandwidth(device: torch.device | str = "cpu") -> float:
    """copy_bandwidth measured once per process and device, so every decode figure of one run shares one bound
    (single measurements of this 2-core machine varied from 33 to 47 GB/s between the runs of one command)."""
    key = str(torch.device(device))
    if key not in _MEASURED:
        _MEASURED[key] = copy_bandwidth(device)
    return _MEASURED[key]


def _bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _kv_row_bytes(config: Any, value_bytes: int) -> int:
    """K and V of one position in one layer."""
    a = Arch.from_config(config)
    return 2 * a.kv_heads * a.head_dim * value_bytes


def decode_step_bytes(model: nn.Module, removed: Iterable[int] = (), batch: int = 1, context: int = 0) -> dict[str, int]:
    """Bytes one decode step reads: the weights of every layer that runs and the LM head (once), and `batch` rows
    of KV cache over `context` positions in every layer that runs. Embedding rows and the final norm are noise."""
    config = getattr(model.config, "text_config", None) or model.config
    layers = list(get_adapter(model).layers(model))
    gone = set(removed)
    running = [layer for i, layer in enumerate(layers) if i not in gone]
    weights = sum(_bytes(layer) for layer in running)
    head = model.get_output_embeddings()
    weights += _bytes(head) if head is not None else 0
    value_bytes = next(model.parameters()).element_size()
    kv = batch * context * len(running) * _kv_row_bytes(config, value_bytes)
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


def decode_head_share(model: nn.Module) -> float:
    """The LM head's share of the weight bytes a dense decode step reads: the part of the step no plan changes."""
    head = model.get_output_embeddings()
    return _bytes(head) / decode_step_bytes(model)["weights"] if head is not None else 0.0


def decode_bound(step_bytes: dict[str, int], batch: int, bandwidth: float) -> float:
    """Tokens per second no decode at this batch can beat on this memory bandwidth."""
    return batch * bandwidth / step_bytes["total"]
