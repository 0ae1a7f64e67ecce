"""Memory: the peak a run reaches above the loaded model, measured; and an estimate made before the run, so that a
batch or prompt that will not fit stops with a message instead of being killed by the system.

Measured: on CPU the resident set's high-water mark (VmHWM), reset after the model is loaded by writing 5 to
/proc/self/clear_refs (Linux >= 4.0), so it covers this run and not the loading (which, for a GGUF file, peaks far
above the model: ru_maxrss never goes down, which is why the long-context table once reported 0 MB); elsewhere the
process's ru_maxrss minus the resident set after loading (a lower bound, said so). On CUDA the allocator's peak.

Estimated (bytes above the loaded model) for a forward over B x T tokens of a decoder: the largest of
- inside a layer: the residual stream and its normed copy, Q/K/V, the attention output, and the MLP's gate, up and
  product, B T (4 D + q + 2 kv + 3 F) values; eager attention adds its B H T S scores and probabilities;
- at the head: the logits, B T V values (generation: B V, the last position only), and for perplexity the cross-entropy's float32 log-probabilities (a second
  B T V) and, for B > 1, the contiguous copy of the shifted logits (a third);
plus the KV cache when one is kept (2 L B kv (T + new) values). Values are the model dtype's size, logits float32.
Generation allocates its static cache before the prefill (models/static_decode.py): allocated lazily, the cache's
blocks fell between the prefill's activations and the heap grew by up to a third above this estimate, differently
from run to run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from orthorank.errors import UserError
from orthorank.models.arch import Arch
from orthorank.models.loading import _bytes
from orthorank.harness.peak_memory import MIB

# Memory kept free beside the estimate: the allocator's slack, Python, tokenizers and libraries' buffers.
HEADROOM = 0.9


# -- estimate ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """What a memory estimate needs from a model config: the FLOP count's numbers, and how values are held."""

    arch: Arch
    eager: bool  # eager attention materializes B H T S scores
    value_bytes: int

    @classmethod
    def of(cls, model) -> "Shape":
        a = Arch.from_config(getattr(model.config, "text_config", None) or model.config)
        attn = getattr(model.config, "_attn_implementation", None) or "eager"
        return cls(a, attn == "eager", next(model.parameters()).element_size())


def estimate_bytes(shape: Shape, batch: int, tokens: int, *, loss: bool = False, cache_tokens: int = 0,
                   all_logits: bool = True) -> int:
    """Peak bytes above the loaded model of one forward over batch x tokens (see the module docstring);
    cache_tokens > 0 keeps a KV cache of that many positions per row; all_logits=False: the head runs on each
    row's last position only (generation)."""
    s, a = shape, shape.arch
    bt = batch * tokens
    head_rows = bt if all_logits else batch
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    layer = bt * (4 * a.hidden + q + 2 * kv + 3 * a.ffn) * s.value_bytes
    if s.eager:
        keys = tokens + cache_tokens
        layer += 2 * batch * a.heads * tokens * keys * s.value_bytes
    head = head_rows * a.vocab * 4 * (1 + (1 if loss else 0) + (1 if loss and batch > 1 else 0))
    cache = 2 * a.num_layers * batch * kv * cache_tokens * s.value_bytes
    return int(max(layer, head) + cache + bt * a.hidden * s.value_bytes)


def available_bytes(device) -> int | None:
    """Memory this process may still use: the GPU's free memory, or on CPU MemAvailable (bounded by a cgroup
    limit where one is set). None where it cannot be read."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        return None
    for limit_file, used_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                   "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = open(limit_file).read().strip()
            used = int(open(used_file).read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            avail = min(avail, int(limit) - used) if avail is not None else int(limit) - used
        break
    return avail


def check_fits(model, batch: int, tokens: int, *, what: str, loss: bool = False, new_tokens: int = 0,
               device=None, available: int | None = None, all_logits: bool | None = None) -> int:
    """Stop with a one-line error when a forward of batch x tokens (plus new_tokens generated with a cache) would
    not fit in the memory available, naming the largest batch and the longest prompt that fit. Returns the
    estimate in bytes. all_logits: whether the forward computes logits at every position (default: unless it
    generates; bench's prefill computes the last position's only)."""
    shape = Shape.of(model)
    cache = tokens + new_tokens if new_tokens else 0
    all_logits = not new_tokens if all_logits is None else all_logits
    need = estimate_bytes(shape, batch, tokens, loss=loss, cache_tokens=cache, all_logits=all_logits)
    free = available if available is not None else limit_bytes(device)
    if free is None or need <= HEADROOM * free:
        return need
    budget = HEADROOM * free

    def fits(b: int, t: int) -> bool:
        return estimate_bytes(shape, b, t, loss=loss, cache_tokens=(t + new_tokens) if new_tokens else 0,
                              all_logits=all_logits) <= budget

    best_batch = max((b for b in range(1, batch) if fits(b, tokens)), default=0)
    lo, hi = 0, tokens  # the longest prompt at batch 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(1, mid) else (lo, mid)
    hint = (f"batch {best_batch} fits at {tokens} tokens" if best_batch else f"at batch 1 at most {lo} tokens fit"
            if lo else "not even a short prompt fits")
    raise UserError(f"{what}: batch {batch} x {tokens} tokens{f' + {new_tokens} new' if new_tokens else ''} needs "
                    f"about {need / 2**30:.1f} GiB above the loaded model, but only {free / 2**30:.1f} GiB is "
                    f"available; {hint}")


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / MIB:.0f} MiB"


def _env_override() -> int | None:
    """ORTHORANK_MEMORY_LIMIT (e.g. 2GiB) caps the memory the guard believes is available (tests, shared hosts)."""
    text = os.environ.get("ORTHORANK_MEMORY_LIMIT")
    if not text:
        return None

    return int(_bytes(text))


def limit_bytes(device) -> int | None:
    override = _env_override()
    found = available_bytes(device)
    if override is None:
        return found
    return override if found is None else min(override, found)


