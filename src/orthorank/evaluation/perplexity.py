"""Perplexity as GPTQ and SLEB measure it: tokenize once, non-overlapping windows, mean token NLL."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from orthorank.errors import UserError


@dataclass
class PerplexityResult:
    perplexity: float
    mean_nll: float
    windows: int
    tokens: int  # predicted tokens
    seq_len: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def tokenize_text(tokenizer, text: str) -> torch.Tensor:
    """The whole text as one 1-D id tensor (no special tokens: SmolLM2 adds no BOS, and GPTQ re-inserts none)."""
    if not text.strip():
        raise UserError("the text is empty")
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    return ids


def make_windows(ids: torch.Tensor, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    if seq_len < 2:
        raise UserError(f"--seq-len must be at least 2, got {seq_len}")
    n = ids.numel() // seq_len
    if n == 0:
        raise UserError(f"the text has {ids.numel()} tokens, fewer than one window of --seq-len {seq_len}")
    if max_windows is not None:
        if max_windows < 1:
            raise UserError(f"--max-windows must be at least 1, got {max_windows}")
        n = min(n, max_windows)
    return ids[: n * seq_len].view(n, seq_len)


@torch.no_grad()
def window_nll(model: nn.Module, windows: torch.Tensor, batch_size: int = 1, progress: bool = False,
               desc: str = "perplexity") -> torch.Tensor:
    """Summed NLL per window: [n_windows] (float64). Each window predicts seq_len - 1 tokens."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    out = []
    bar = tqdm(total=windows.shape[0], desc=desc, disable=not progress, leave=False, unit="win")
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start : start + batch_size].to(device)
        logits = model(batch, use_cache=False).logits[:, :-1].float()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="none")
        out.append(nll.view(batch.shape[0], -1).sum(1).double().cpu())
        bar.update(batch.shape[0])
    bar.close()
    return torch.cat(out)


def perplexity(model: nn.Module, windows: torch.Tensor, batch_size: int = 1, progress: bool = False,
               desc: str = "perplexity") -> PerplexityResult:
    nll = window_nll(model, windows, batch_size, progress, desc)
    tokens = windows.shape[0] * (windows.shape[1] - 1)
    mean = float(nll.sum() / tokens)
    return PerplexityResult(math.exp(mean), mean, windows.shape[0], tokens, windows.shape[1])
