"""What every selection layer of one forward shares: the padding of past and current tokens, the sink's position,
how many tokens each row keeps, the rows' hashes for the random ablation, and the hooks a policy's inputs need at the
start of a forward (method/policy_inputs.py). `SequenceContext.capture` is a pre-hook on the decoder stack: layers
only get the 4-D mask, which may be None.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from orthorank.method.selection import keep_count, token_hash, tokens_to_keep


class Facts:
    """What every selection layer of one forward shares: padding, sink positions, tokens to keep."""

    __slots__ = ("key", "padded", "valid", "sink_pos", "in_chunk", "all_in_chunk", "k", "kmax", "uniform")



def padding_from_4d(mask: Any, config: Any) -> torch.Tensor | None:
    """[B, S] bool: the keys that some query of this forward may attend under a full-attention 4-D mask ([B, 1, q,
    S], boolean or additive): the real tokens of past + current positions, False for padding and for static-cache
    slots not yet written. None where no such mask exists: sliding-window masks also hide old keys, so a model whose
    layers are all sliding is read as unpadded, as without any mask."""
    if isinstance(mask, dict):
        mask = mask.get("full_attention")
    elif isinstance(mask, torch.Tensor) and config is not None:
        types = getattr(config, "layer_types", None)
        if getattr(config, "sliding_window", None) and (types is None or "full_attention" not in types):
            return None
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 4):
        return None
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed.any(dim=2)[:, 0]


class SequenceContext:
    """Per-forward facts shared by all selection layers of one model: the 2-D padding mask of past + current
    tokens, captured by a pre-hook on the decoder stack (layers only get the 4-D mask, which may be None)."""

    def __init__(self) -> None:
        self.attention_mask: torch.Tensor | None = None
        self.input_ids: torch.Tensor | None = None
        self.decoder: nn.Module | None = None
        self.record_states = True  # whether this forward keeps layer outputs (hidden states): no in-place writes
        self._facts: Facts | None = None
        self._row_hashes: tuple[Any, list[int]] | None = None
        # A recorder (method/recording.py) while one is active: selection layers run densely for it and report
        # what they computed (the loss-oracle's dense pass, the router's fit).
        self.recorder: Any = None
        # Hooks run at the start of every forward this context captures (the loss-oracle's dense pass); each gets
        # (context, decoder kwargs) and may fill `given`, layer index -> [B, T], for the layers' policies.
        self.before_forward: list[Callable[["SequenceContext", dict], None]] = []
        self.given: dict[int, torch.Tensor] = {}
        # Progressive pruning: [B, T] bool, the tokens the latest progressive selection layer of this forward kept
        # (the others stay out of every later one); None before the first.
        self.alive: torch.Tensor | None = None

    def capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        config = getattr(module, "config", None)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            self.attention_mask = mask
        else:  # generation on a static cache hands the decoder 4-D masks, built by `generate` from the 2-D one
            self.attention_mask = padding_from_4d(mask, config)
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.input_ids = ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
        self.decoder = module
        self.alive = None
        self.record_states = bool(kwargs.get("output_hidden_states") or getattr(config, "output_hidden_states", False))
        self._facts = None
        self._row_hashes = None
        if self.recorder is None:  # a recorder's own forward is the dense pass the hooks would start
            self.given = {}
            for hook in self.before_forward:
                hook(self, kwargs)

    def row_hashes(self, B: int, T: int, past: int, valid: torch.Tensor | None) -> list[int]:
        """One hash per row of its real token ids in this chunk (and the cache length): the random ablation's
        per-sequence seed. Without input ids (inputs_embeds, calibration runner) rows are told apart by index."""
        key = (B, T, past)
        if self._row_hashes is not None and self._row_hashes[0] == key:
            return self._row_hashes[1]
        ids = self.input_ids
        if ids is None or ids.shape != (B, T):
            hashes = list(range(B))
        else:
            hashes = [token_hash(ids[b] if valid is None else ids[b][valid[b]], past) for b in range(B)]
        self._row_hashes = (key, hashes)
        return hashes

    def inplace_ok(self) -> bool:
        """May a selection layer write its rows into its input? Only inside a decoder forward this context saw
        begin (the decoder loop drops its reference to a layer's input), with autograd off, no hidden states
        recorded and no hooks on the layers (either could hold the previous layer's output)."""
        if self.record_states or self.decoder is None or torch.is_grad_enabled():
            return False
        layers = getattr(self.decoder, "layers", None)
        return layers is not None and not any(l._forward_hooks or l._forward_pre_hooks for l in layers)

    def facts(self, B: int, T: int, past: int, device: torch.device, ratio: float) -> Facts:
        mask2d = self.attention_mask
        key = (B, T, past, ratio, device, id(mask2d))
        f = self._facts
        if f is not None and f.key == key:
            return f
        f = Facts()
        f.key = key
        full_valid = None
        if mask2d is not None and mask2d.shape[1] >= past + T:
            # generation on a static cache may hand over the mask of every cache slot: the first past + T are ours
            full_valid = mask2d[:, :past + T].bool()
            if bool(full_valid.all()):  # one sync per forward, not per layer
                full_valid = None
        f.padded = full_valid is not None
        if not f.padded:
            f.valid = None
            f.sink_pos = torch.full((B,), -past, dtype=torch.long, device=device)
            f.in_chunk = None
            f.all_in_chunk = past == 0
            f.kmax = keep_count(T, ratio)
            f.k = torch.full((B,), f.kmax, dtype=torch.long, device=device)
            f.uniform = True
        else:
            f.valid = full_valid[:, past:]
            sink_abs = full_valid.to(torch.int8).argmax(dim=1)  # first real token of each row
            f.sink_pos = sink_abs - past  # < 0: the sink sits in the cache
            f.in_chunk = f.sink_pos >= 0
            f.k = tokens_to_keep(f.valid.sum(1), ratio)
            kmin, kmax, n_in = torch.stack([f.k.min(), f.k.max(), f.in_chunk.sum()]).tolist()
            f.kmax, f.uniform, f.all_in_chunk = int(kmax), kmin == kmax, n_in == B
        self._facts = f
        return f
