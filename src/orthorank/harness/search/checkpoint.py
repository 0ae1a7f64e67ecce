"""Search checkpoints: each finished step of a layer search, kept in the result store.

A greedy search step costs minutes on a CPU; a search killed at step 9 of 10 should not start again from step 1.
Every step is written (atomically, as one store entry) as soon as it is chosen, under a key that holds everything
that decides the search's result: the model's weights, the calibration token ids and their batching, the search,
its selection settings and screening, dtype, device type and the code version of the search modules. A rerun of the
same command reads the finished steps, replays them (one forward pass to rebuild the cached layer inputs) and goes
on; since every step is deterministic, the resumed search writes the same plan as an uninterrupted one
(tests/harness/test_resume.py). A search asked for fewer steps than are stored takes the prefix: greedy orders are nested.

Entries: index 0 holds the dense calibration loss; index k >= 1 the k-th step (its layer, loss, evaluations and the
search's seconds up to it, summed over every run that took part, so a plan written by a resumed search states the
whole search's time, not only its last run's). One-shot searches store one entry per candidate layer (its score)."""

from __future__ import annotations

import time
from typing import Any

import torch

from orthorank.harness import distributed as dist
from orthorank.harness.store import Namespace, ResultStore, code_version, digest, model_fingerprint


def search_key(runner, search: str, settings: dict[str, Any], fingerprint: str | None = None,
               code: str = "search") -> dict[str, Any]:
    """Everything that decides a search's steps. `settings`: the search's own options (selection config,
    candidates, screening, ...)."""
    ids = torch.cat([b.reshape(-1) for b in runner.batches]).to(torch.int64).cpu()
    return {
        "model": fingerprint or model_fingerprint(runner.model),
        "search": search,
        "settings": settings,
        "calibration": digest(ids.numpy().tobytes()),
        "batches": [list(b.shape) for b in runner.batches],
        "dtype": str(next(runner.model.parameters()).dtype),
        "device": runner.batches[0].device.type,
        "code": code_version(code),
    }


class Checkpoint:
    """The finished steps of one search: read once at its start, each new step written as it is chosen (by rank 0;
    every rank sees the same steps)."""

    def __init__(self, namespace: Namespace | None) -> None:
        self.namespace = namespace
        self.written = 0
        self.resumed = 0
        self._started = time.perf_counter()
        # The search's seconds before this run (from the last stored step); None where stored steps predate
        # per-step timing, so that a plan never states one run's time as the whole search's.
        self.earlier_seconds: float | None = 0.0
        self._seconds: dict[int, float | None] = {}

    @classmethod
    def open(cls, store: ResultStore | None, runner, search: str, settings: dict[str, Any],
             fingerprint: str | None = None, code: str = "search") -> "Checkpoint":
        if store is None:
            return cls(None)
        return cls(store.namespace("search", search_key(runner, search, settings, fingerprint, code)))

    @property
    def folder(self):
        return None if self.namespace is None else self.namespace.folder

    def load(self) -> dict[int, Any]:
        self._started = time.perf_counter()
        if self.namespace is None:
            return {}
        done = dist.broadcast(self.namespace.load() if dist.is_main() else None)
        steps = stored_steps(done)
        self.earlier_seconds = _seconds(steps[-1]) if steps else 0.0
        self._seconds = {i: _seconds(v) for i, v in done.items()}
        return done

    def put(self, index: int, value: Any) -> None:
        if isinstance(value, dict) and "seconds" not in value and self.earlier_seconds is not None:
            value = {**value, "seconds": round(self.earlier_seconds + time.perf_counter() - self._started, 2)}
        self._seconds[index] = _seconds(value)
        if self.namespace is not None and dist.is_main():
            self.namespace.put({index: value})
            self.written += 1

    def seconds_at(self, index: int) -> float | None:
        """The search's seconds up to step `index`, over all its runs; None where unknown (a step stored before
        per-step timing, or a search without a store whose step was never put)."""
        return self._seconds.get(index)


def _seconds(entry: Any) -> float | None:
    return float(entry["seconds"]) if isinstance(entry, dict) and entry.get("seconds") is not None else None


def stored_steps(done: dict[int, Any]) -> list[Any]:
    """Steps 1, 2, ... as far as they are contiguous."""
    out = []
    while len(out) + 1 in done:
        out.append(done[len(out) + 1])
    return out
