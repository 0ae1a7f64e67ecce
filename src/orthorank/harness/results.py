"""Result files: every JSON result records settings, versions, device, seed and git commit."""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from orthorank.harness.cpu_info import cpu_flags, cpu_model_name
from orthorank.harness.distributed import world_size
from orthorank.errors import UserError
from orthorank.files import atomic_save_figure, atomic_write_bytes, atomic_write_text  # noqa: F401  (re-exported: the harness writes through results)
from orthorank.harness.peak_memory import measured


# What decides a result: the package, its dependencies' pins, the build and the evidence scripts (pathspecs from the
# repository root)
CODE_PATHS = (":/src", ":/pyproject.toml", ":/Makefile", ":/scripts/*.py", ":/scripts/*.sh", ":/tools/*.py", ":/studies/*.sh",
              ":/studies/**/*.sh")


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        commit = out.stdout.strip() or None
        # dirty = the code differs from the commit; results, plans and docs written by the run itself (a study
        # rewrites its report as it goes) do not make the code that produced them uncommitted
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS], capture_output=True,
            text=True, timeout=5, cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
        return f"{commit}-dirty" if commit and dirty else commit
    except (OSError, subprocess.SubprocessError):
        return None


_COMMAND: list[str] | None = None
_KERNELS: dict[str, str] = {}  # kernels a command chose that change speed, never answers (environment() lists them)


def record_kernel(what: str, name: str | None) -> None:
    """name None: nothing of that kind ran (one process may load several models, as the tests do)."""
    if name is None:
        _KERNELS.pop(what, None)
    else:
        _KERNELS[what] = name


def record_command(argv: list[str] | None) -> list[str] | None:
    """The command a result comes from (set by the CLI before it runs one), so every result file can say how to
    reproduce it; returns the one it replaces (a study restores its own after each stage's command)."""
    global _COMMAND
    previous, _COMMAND = _COMMAND, None if argv is None else [str(a) for a in argv]
    return previous


def command_line() -> str | None:
    return "orthorank " + shlex.join(_COMMAND) if _COMMAND is not None else None


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    dev = torch.device(device) if device is not None else torch.device("cpu")
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model_name(),
        "cpu_threads": torch.get_num_threads(),
        # processes that made the result together (torchrun shards windows, items and candidates across them)
        "processes": world_size(),
        # CPU timings, and bfloat16's against float32's, depend on these (emulated bfloat16 without the last two)
        "cpu_isa": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in cpu_flags()],
        "git_commit": git_commit(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command_line": command_line(),
    }
    if _KERNELS:
        env["kernels"] = dict(_KERNELS)
    try:
        import lm_eval  # lazily: optional dependency

        env["lm_eval"] = lm_eval.__version__
    except Exception:  # optional dependency
        pass
    return env


def check_writable(path: str | Path | None, overwrite: bool = False) -> None:
    """Fail before any work if a result would overwrite a user's file, or could not be written at all because a
    folder on its path is a file."""
    if path is None:
        return
    path = Path(path)
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"cannot write {path}: {parent} is a file, not a folder")
            break
    if path.exists() and not overwrite:
        raise UserError(f"{path} exists; pass --overwrite to replace it")


def write_json(path: str | Path, payload: dict[str, Any], *, device=None, overwrite: bool = False) -> Path:
    path = Path(path)
    check_writable(path, overwrite)
    body = {**payload, "environment": environment(device)}
    memory = measured()
    if memory and "memory" not in body:
        body["memory"] = memory
    return atomic_write_text(path, json.dumps(body, indent=2, default=str) + "\n")
