"""Named phases of a selection layer's call (scoring, top-K, gather, attention kernel, scatter, ...), for the
harness's phase profile (harness/speed/phase_profile.py), which attributes each operator to the phase it ran in.

Off, the default, a mark is one global read and a shared no-op context, so the layer pays nothing measurable for
them; `marking()` turns them into profiler ranges for the duration of a profile.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

import torch

PREFIX = "orthorank::"
_NULL: ContextManager[None] = contextlib.nullcontext()
_enabled = False


def phase(name: str) -> ContextManager[object]:
    """A profiler range named PREFIX + name while marking, else a no-op."""
    return torch.profiler.record_function(PREFIX + name) if _enabled else _NULL


@contextlib.contextmanager
def marking() -> Iterator[None]:
    global _enabled
    previous, _enabled = _enabled, True
    try:
        yield
    finally:
        _enabled = previous
