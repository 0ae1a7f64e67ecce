"""Perplexity as GPTQ and SLEB measure it: tokenize once, non-overlapping windows, mean token NLL."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from orthorank.harness import distributed as dist
from orthorank.errors import UserError
from orthorank.models.loading import input_device
from orthorank.models.sliding_attention import kernel_key
from orthorank.harness.store import code_version, digest, fill, model_fingerprint


@dataclass
class PerplexityResult:
    perplexity: float
    mean_nll: float
    windows: int
    tokens: int  # predicted tokens
    seq_len: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts a BOS token in front of a text by default (Llama 2/3 do, SmolLM2 does not)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True).input_ids
    return bool(ids) and ids[0] == bos


def tokenize_text(tokenizer, text: str) -> torch.Tensor:
    """The whole text as one 1-D id tensor, as GPTQ and SLEB tokenize it: the tokenizer's defaults over the whole
    text, so a tokenizer that adds BOS puts exactly one at the start of the stream (windows get none of their own)."""
    if not text.strip():
        raise UserError("the text is empty")
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    if adds_bos(tokenizer):
        ids = torch.cat([torch.tensor([tokenizer.bos_token_id], dtype=ids.dtype), ids])
    return ids


# GPTQ and SLEB evaluate C4 on its first 256 x seq-len tokens.
C4_WINDOWS = 256


def eval_stream(tokenizer, dataset: str, text: str, seq_len: int) -> torch.Tensor:
    """The token stream a dataset's windows are cut from: the whole text, or for C4 its first 256 x seq_len tokens."""
    ids = tokenize_text(tokenizer, text)
    if dataset == "c4":
        ids = ids[: C4_WINDOWS * seq_len]
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
    device = input_device(model)
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


def perplexity_key(model: nn.Module, plan, dataset: str, stream: torch.Tensor, seq_len: int,
                    fingerprint: str | None = None) -> dict:
    """The result-store key of per-window NLLs: model weights, plan content, the exact token stream the windows are
    cut from (so data, tokenizer and BOS handling are covered), window length, dtype and code version."""
    return {
        "model": fingerprint or model_fingerprint(model),
        "plan": plan.content_hash(),
        "dataset": dataset,
        "stream": digest(stream.to(torch.int64).numpy().tobytes()),
        "stream_tokens": int(stream.numel()),
        "seq_len": int(seq_len),
        "dtype": str(next(model.parameters()).dtype),
        "device": input_device(model).type,
        "code": code_version("perplexity"),
        **kernel_key(model),
    }


def stored_window_nll(model: nn.Module, windows: torch.Tensor, namespace=None, batch_size: int = 1,
                      progress: bool = False, desc: str = "perplexity") -> torch.Tensor:
    """window_nll through the result store: finished windows are read back, the rest computed (split across the
    ranks of a torchrun run, in fixed batches of `batch_size` windows) and written as each batch finishes."""
    n = windows.shape[0]
    bar = tqdm(total=n, desc=desc, disable=not progress or not dist.is_main(), leave=False, unit="win")

    def compute(idx: list[int]) -> dict[int, dict]:
        nll = window_nll(model, windows[idx], batch_size=len(idx))
        bar.update(len(idx) * dist.world_size())
        return {i: {"nll": float(v)} for i, v in zip(idx, nll.tolist())}

    values = fill(namespace, range(n), compute, chunk=batch_size)
    bar.close()
    return torch.tensor([values[i]["nll"] for i in range(n)], dtype=torch.float64)


def perplexity(model: nn.Module, windows: torch.Tensor, batch_size: int = 1, progress: bool = False,
               desc: str = "perplexity") -> PerplexityResult:
    nll = window_nll(model, windows, batch_size, progress, desc)
    tokens = windows.shape[0] * (windows.shape[1] - 1)
    mean = float(nll.sum() / tokens)
    return PerplexityResult(math.exp(mean), mean, windows.shape[0], tokens, windows.shape[1])
