"""The decoder stack, then the LM head on the last position only: the forward every generation and prefill
timing runs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from orthorank.models.adapters import get_adapter
from orthorank.models.static_decode import cache_kwarg, output_cache


class LastTokenForward:
    """The decoder stack, then the LM head on the last position only (what generation needs).

    Not `model(..., logits_to_keep=1)`: that applies the head to a strided [B, 1, D] view, for which matmul on CPU
    copies the whole transposed head weight on every call (1 GiB and seconds for Llama-3's 128k vocabulary), a
    constant that would dilute every method's speed-up. A contiguous [B, D] row avoids it on every device.
    """

    def __init__(self, model: nn.Module) -> None:
        self.decoder = get_adapter(model).decoder(model)
        self.head = model.get_output_embeddings()
        self.cache_kw = cache_kwarg(self.decoder)

    def __call__(self, ids: torch.Tensor, use_cache: bool = False, cache: Any = None) -> tuple[torch.Tensor, Any]:
        kwargs = {self.cache_kw: cache} if cache is not None else {}
        out = self.decoder(input_ids=ids, use_cache=use_cache, **kwargs)
        logits = self.head(out.last_hidden_state[:, -1].contiguous())  # [B, vocab]
        return logits, (output_cache(out) if use_cache else None)
