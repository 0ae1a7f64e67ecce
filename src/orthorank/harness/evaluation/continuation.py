"""Continuation perplexity: what a plan costs when it *decodes*, not when it scores a whole window at once.

Perplexity over whole windows (one forward pass, what the paper reports) never runs a decode policy: every token is
scored in the prefill, with token selection. A model serving requests prefills the prompt and then decodes one token
at a time through the KV cache, where the decode policy decides whether a selection layer updates the new token
(dense) or only when it is as orthogonal to the sink as the prefill's K-th token was (threshold). Here each window's
first half is the prompt (one prefill, with token selection) and its second half is fed one token at a time
(teacher forcing); the score is the summed NLL of the second half, comparable across plans and decode policies on
the same windows, with the share of decoded tokens the selection layers updated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from orthorank.harness import distributed as dist
from orthorank.harness.evaluation.perplexity import perplexity_key
from orthorank.method.apply import selective
from orthorank.models.adapters import get_adapter
from orthorank.models.loading import input_device
from orthorank.models.static_decode import cache_kwarg, output_cache
from orthorank.harness.store import code_version, fill


class UpdateCounter:
    """Share of decoded tokens that a model's selection layers updated: after each one-token step, each selection
    layer's last_keep says whether it updated the token of each row (None: it ran densely, every row updated).
    The threshold decode policy's saving depends on the text; this is what it actually skipped."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [s for s in (selective(layer) for layer in get_adapter(model).layers(model)) if s is not None]
        self.updated = 0
        self.seen = 0

    def step(self, rows: int) -> None:
        for s in self.layers:
            keep = s.last_keep
            self.seen += rows
            self.updated += rows if keep is None else int(keep.sum())

    @property
    def share(self) -> float | None:
        return self.updated / self.seen if self.seen else None


def scored_tokens(seq_len: int) -> int:
    """Tokens scored per window: its second half (the first of them predicted by the prefill)."""
    return seq_len - seq_len // 2


@torch.no_grad()
def continuation_nll(model: nn.Module, windows: torch.Tensor) -> tuple[torch.Tensor, float | None]:
    """[n, T] windows -> summed NLL of each window's second half [n] (float64), decoded one token at a time after a
    prefill of the first half; and the share of decoded tokens the selection layers updated (None without any)."""
    windows = windows.to(input_device(model))
    T = windows.shape[1]
    half = T // 2
    if half < 1:
        raise ValueError("continuation scoring needs windows of at least 2 tokens")
    out = model(windows[:, :half], use_cache=True, logits_to_keep=1)
    cache, kw = output_cache(out), cache_kwarg(model)
    steps = [out.logits[:, -1].float()]
    counter = UpdateCounter(model)
    for t in range(half, T - 1):
        out = model(windows[:, t:t + 1], use_cache=True, **{kw: cache})
        cache = output_cache(out)
        steps.append(out.logits[:, -1].float())
        counter.step(windows.shape[0])
    logits = torch.stack(steps, 1)  # [n, T - half, vocab]
    nll = F.cross_entropy(logits.transpose(1, 2), windows[:, half:], reduction="none").sum(1)
    return nll.double().cpu(), counter.share


def continuation_key(model: nn.Module, plan, dataset: str, stream: torch.Tensor, seq_len: int,
                     fingerprint: str | None = None) -> dict:
    """perplexity_key's fields (weights, plan, token stream, length, dtype), scored by continuation."""
    return {**perplexity_key(model, plan, dataset, stream, seq_len, fingerprint), "scoring": "continuation",
            "code": code_version("continuation")}


def stored_continuation(model: nn.Module, windows: torch.Tensor, namespace=None, batch_size: int = 1,
                        progress: bool = False, desc: str = "continuation") -> tuple[torch.Tensor, list[float | None]]:
    """continuation_nll through the result store (finished windows read back, the rest computed in fixed batches of
    `batch_size` windows, written as each batch finishes): (NLL per window [n], updated share per window)."""
    n = windows.shape[0]
    bar = tqdm(total=n, desc=desc, disable=not progress or not dist.is_main(), leave=False, unit="win")

    def compute(idx: list[int]) -> dict[int, dict]:
        nll, share = continuation_nll(model, windows[idx])
        bar.update(len(idx) * dist.world_size())
        return {i: {"nll": float(v), "updated_share": share} for i, v in zip(idx, nll.tolist())}

    values = fill(namespace, range(n), compute, chunk=batch_size)
    bar.close()
    return (torch.tensor([values[i]["nll"] for i in range(n)], dtype=torch.float64),
            [values[i]["updated_share"] for i in range(n)])
