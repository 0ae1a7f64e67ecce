"""The peak memory a run reaches above its loaded model, measured (how: harness/runtime/memory.py's docstring). One meter
per process, started when a command has loaded its model; every result file records what it saw (results.py), so
this sits at the bottom, below everything that writes results."""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch

MIB = 2**20


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class PeakMeter:
    """The peak memory of what runs after `start()` above the memory in use at that moment (the loaded model)."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.base = 0
        self.how = ""
        self.started = False

    def start(self) -> "PeakMeter":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.how = "CUDA allocator peak above the allocation after loading"
        else:
            self.base = rss_bytes()
            exact = _reset_hwm() and _status_kib("VmHWM") is not None
            self.how = ("resident-set high-water mark (VmHWM, reset after loading) above the resident set after "
                        "loading" if exact else "ru_maxrss above the resident set after loading (a lower bound: "
                        "the loading's own peak is not reset)")
        self.started = True
        return self

    def peak_above_bytes(self) -> int:
        if self.device.type == "cuda":
            return max(0, torch.cuda.max_memory_allocated(self.device) - self.base)
        hwm = _status_kib("VmHWM")
        peak = hwm * 1024 if hwm is not None else rss_bytes()
        return max(0, peak - self.base)

    def to_dict(self) -> dict[str, Any]:
        if not self.started:
            return {}
        return {"peak_above_model_mib": round(self.peak_above_bytes() / MIB, 1),
                "model_resident_mib": round(self.base / MIB, 1), "how": self.how}


# One meter per process, started when a command has loaded its model; result files record what it saw.
METER: PeakMeter | None = None


def start_meter(device) -> PeakMeter:
    global METER
    METER = PeakMeter(device).start()
    return METER


def measured() -> dict[str, Any]:
    return METER.to_dict() if METER is not None else {}
