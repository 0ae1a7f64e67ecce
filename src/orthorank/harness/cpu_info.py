"""What this machine's CPU is, from /proc/cpuinfo (Linux); elsewhere what `platform` says."""

from __future__ import annotations

import platform
from pathlib import Path


def cpuinfo_field(name: str) -> str | None:
    """The value of the first `name : value` line of /proc/cpuinfo (case-insensitive name), None without one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip().lower() == name:
                return value.strip()
    except OSError:
        pass
    return None


def cpu_model_name() -> str:
    return cpuinfo_field("model name") or platform.processor() or platform.machine() or "cpu"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo does not list them)."""
    return set((cpuinfo_field("flags") or "").split())


def cpu_multiplies_bf16() -> bool:
    """True on a CPU whose matrix units take bfloat16 natively (AVX-512 BF16 or AMX; Linux flags): there bfloat16
    matmuls run about 2x float32's, elsewhere they are emulated and slower."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
