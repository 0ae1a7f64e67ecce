"""Timing and memory helpers: CUDA events on GPU, perf_counter on CPU; median and spread of repeated runs."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import torch

from orthorank.harness import peak_memory as peak_memory_meter


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds one call of fn takes, measured on the device's clock (CUDA events) or the host's."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved_rounds(names: Sequence[str], time_one: Callable[[str], float], repeats: int, warmup: int = 1,
                       rotate: bool = True, on_round: Callable[[int, dict[str, list[float]]], None] | None = None,
                       ) -> dict[str, list[float]]:
    """Seconds of every name, `repeats` each, timed in interleaved rounds: one run of every name per round, so a
    change of load on the machine hits them alike and per-round ratios pair them. `warmup` untimed rounds come first
    (compiling, allocator growth). With `rotate` the order shifts by one each round, so no name always follows
    another (caches, thermal state). `time_one(name)` runs it once and returns its seconds; `on_round(r, times)`
    after each timed round (progress lines)."""
    names = list(names)
    for _ in range(warmup):
        for name in names:
            time_one(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names) if rotate and names else 0
        for name in names[k:] + names[:k]:
            times[name].append(time_one(name))
        if on_round is not None:
            on_round(r, times)
    return times


def iqr(xs: Sequence[float]) -> float:
    """Interquartile range (the whole range below 4 values)."""
    xs = sorted(xs)
    if len(xs) < 4:
        return max(xs) - min(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def summarize(times: list[float]) -> dict[str, Any]:
    """Median and spread of repeated timings (seconds)."""
    ts = sorted(times)
    med = statistics.median(ts)
    return {
        "median_s": med,
        "mean_s": statistics.fmean(ts),
        "min_s": ts[0],
        "max_s": ts[-1],
        "iqr_s": iqr(ts),
        "spread_pct": 100.0 * (ts[-1] - ts[0]) / med if med > 0 else 0.0,  # (max - min) / median
        "repeats": len(ts),
        "times_s": [round(t, 6) for t in times],
    }


_CPU_METER = None  # the CPU peak meter of the latest reset_peak_memory


def reset_peak_memory(device: torch.device) -> None:
    global _CPU_METER
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    _CPU_METER = peak_memory_meter.PeakMeter(device).start()


def peak_memory(device: torch.device) -> dict[str, Any]:
    """CUDA: peak allocated and reserved since the last reset. CPU: the peak resident set above the resident set at
    the last reset (the high-water mark, reset then: peak_memory.py), and the process's peak so far."""
    if device.type == "cuda":
        return {
            "peak_allocated_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
            "peak_reserved_mib": round(torch.cuda.max_memory_reserved(device) / 2**20, 1),
        }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {"process_peak_rss_mib": round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)}
    if _CPU_METER is not None:
        out["peak_above_start_mib"] = round(_CPU_METER.peak_above_bytes() / 2**20, 1)
        # Above the resident set at the reset alone, a run that reuses heap pages an earlier run (its warm-up, another
        # method) left resident shows 0 MB though it used them: Gemma's 1k-token prefill did. Against the command's
        # meter, started right after loading, the row holds the run's whole footprint above the model (pages kept
        # from earlier runs in the process count, so rows of one process are an upper bound each).
        if peak_memory_meter.METER is not None and peak_memory_meter.METER.device.type == "cpu":
            out["peak_above_model_mib"] = round(max(0, _CPU_METER.base + _CPU_METER.peak_above_bytes()
                                                    - peak_memory_meter.METER.base) / 2**20, 1)
    return out


def current_memory_mib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return round(torch.cuda.memory_allocated(device) / 2**20, 1)
    return None


def random_ids(vocab: int, batch: int, length: int, device: torch.device, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Skip the lowest ids (special tokens in most vocabularies); content does not change the cost.
    low = min(16, vocab - 1)
    return torch.randint(low, vocab, (batch, length), generator=gen).to(device)


def prefill_variants(forward: Callable[..., Any], ids: torch.Tensor, names: Sequence[str],
                     setup: Callable[[str], None], rounds: int, compared: Sequence[str] = ()
                     ) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """One prompt's prefill (batch 1, `forward(ids, use_cache=True)`, last position's logits) under each setup
    `setup(name)` makes, timed in interleaved rounds after a warm-up round: (seconds per name, the last-token logits
    [vocab] float32 of each name in `compared`)."""
    logits = {}
    for name in compared:
        setup(name)
        out = forward(ids, use_cache=True)[0]
        logits[name] = out.reshape(-1, out.shape[-1])[-1].float()

    def time_one(name: str) -> float:
        setup(name)
        return time_call(lambda: forward(ids, use_cache=True), ids.device)

    return interleaved_rounds(list(names), time_one, rounds, warmup=1), logits
