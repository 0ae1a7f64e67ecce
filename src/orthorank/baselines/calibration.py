"""Calibration windows: random fixed-length slices of calibration text, as SLEB samples them."""

from __future__ import annotations

import torch

from orthorank.errors import UserError
from orthorank.evaluation.perplexity import tokenize_text


def calibration_windows(tokenizer, text: str, samples: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """[samples, seq_len] token ids from random offsets (seeded, so the same seed gives the same windows)."""
    if samples < 1 or seq_len < 2:
        raise UserError(f"need at least 1 calibration sample of at least 2 tokens, got {samples} x {seq_len}")
    ids = tokenize_text(tokenizer, text)
    if ids.numel() <= seq_len:
        raise UserError(f"calibration text has {ids.numel()} tokens, fewer than one window of {seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len, (samples,), generator=gen)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])
