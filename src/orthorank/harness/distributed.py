"""Data-parallel runs under torchrun: windows, items and search candidates split across ranks.

`torchrun --nproc-per-node N orthorank compare|zeroshot|calibrate ...` sets RANK/WORLD_SIZE; `init()` joins the
process group (gloo on CPU, NCCL on GPUs). Work is split by a rule that does not depend on the world size
(fixed batches of windows, fixed chunks of items, single candidates), so N processes give the same numbers as one.
Only rank 0 prints and writes.
"""

from __future__ import annotations

import os
from typing import Any, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def init(device: torch.device | str | None = None) -> bool:
    """Join the process group torchrun describes (no-op for a single process). Returns True when distributed."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available():
        return False
    if dist.is_initialized():
        return True
    dev = torch.device(device) if device is not None else None
    backend = "nccl" if dev is not None and dev.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    return True


def local_device(device: torch.device | str | None) -> torch.device | None:
    """Under torchrun on GPUs each rank takes its own device (cuda:LOCAL_RANK)."""
    if device is None and torch.cuda.is_available():
        device = "cuda"
    if device is not None and torch.device(device).type == "cuda" and world_size() > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(device) if device is not None else None


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share: items r, r + N, r + 2N, ..."""
    return list(items[rank()::world_size()])


def all_gather(obj: Any) -> list[Any]:
    """Every rank's object, in rank order (one element for a single process)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def shutdown(wait: bool = True) -> None:
    """End the process group before the interpreter exits: gloo's threads torn down at exit can abort a rank
    ("terminate called without an active exception"). `wait`: meet the other ranks first (a finished run)."""
    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()
