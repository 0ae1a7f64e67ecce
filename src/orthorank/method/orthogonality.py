"""How orthogonal each token's state is to the attention sink's: the paper's score, |<x_sink, x_i>| (or |cos|),
with its products summed in float32 whatever the model's dtype. The lowest module of method/: policies, the router's
features and the analysis all score through it."""

from __future__ import annotations

import torch


def sink_scores(x: torch.Tensor, sink: torch.Tensor, criterion: str = "dot") -> torch.Tensor:
    """x: [B, T, D], sink: [B, D] -> [B, T] float32; smaller means more orthogonal to the sink, i.e. more important.

    Products are summed in float32 whatever the model dtype (one batched matrix-vector product; half-precision
    inputs are not copied to float32 where the device can accumulate into a float32 result directly).
    """
    dot = dot_float32(x, sink)
    if criterion == "cos":
        norms = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32)
        sink_norm = torch.linalg.vector_norm(sink, dim=-1, keepdim=True, dtype=torch.float32)
        dot = dot / (norms * sink_norm).clamp_min(1e-12)
    return dot.abs()


# Tokens per float32 pass on CPU, from SCORE_BLOCKS_FROM tokens on: a bfloat16 score input converted [SCORE_ROWS, D]
# at a time stays in cache, where one conversion of the whole [T, D] input goes out to memory and back. Alone, a
# router's score at 4k-8k tokens on SmolLM2's shape ran 1.2-2.4x faster this way (scripts/score_rows.py, 1 and 2
# threads); at 1k the gain was within noise, and the whole selection layer, timed with each in turn, was no faster at
# 4k-8k and slower at 1k (scripts/results/selection-speed/score-blocks/), so shorter inputs keep one pass. The same
# bits either way (tests/method/test_router.py).
SCORE_ROWS = 256
SCORE_BLOCKS_FROM = 4096


def score_rows(T: int, x: torch.Tensor) -> int:
    """Tokens per float32 pass for a [B, T, D] score input."""
    return SCORE_ROWS if T >= SCORE_BLOCKS_FROM and not x.is_cuda else T


# CUDA only: bmm(bf16/fp16, out_dtype=float32) sums in float32 without a float32 copy of x. None = not yet tried.
BMM_OUT_DTYPE_OK: bool | None = None


def dot_float32(x: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """<x[b, t], sink[b]> summed in float32: [B, T]."""
    global BMM_OUT_DTYPE_OK
    sink = sink.expand(x.shape[0], -1)
    if not x.is_cuda and x.shape[1] == 1 and x.shape[0] > 1:
        # a batch decode step: one product and one sum for all rows, not a loop of B one-row products (at batch 32
        # the loop was most of a selection layer's operator calls)
        return (x[:, 0].float() * sink.float()).sum(-1, keepdim=True)
    if not x.is_cuda:
        # CPU: one matrix-vector product per row; batched GEMM with a single output column is several times
        # slower in MKL/oneDNN, and B is small here.
        out = torch.empty(x.shape[:2], dtype=torch.float32, device=x.device)
        for b in range(x.shape[0]):
            s, rows = sink[b].float(), score_rows(x.shape[1], x)
            for a in range(0, x.shape[1], rows):
                torch.mv(x[b, a:a + rows].float(), s, out=out[b, a:a + rows])
        return out
    if x.dtype in (torch.float16, torch.bfloat16) and BMM_OUT_DTYPE_OK is not False:
        s = sink.to(x.dtype).unsqueeze(-1)
        try:
            out = torch.bmm(x, s, out_dtype=torch.float32).squeeze(-1)
        except (RuntimeError, TypeError, NotImplementedError):
            BMM_OUT_DTYPE_OK = False
        else:
            if BMM_OUT_DTYPE_OK is None:  # check it once against the float32 copy
                ref = torch.bmm(x.float(), s.float()).squeeze(-1)
                BMM_OUT_DTYPE_OK = bool(torch.allclose(out, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max())))
                if not BMM_OUT_DTYPE_OK:
                    return ref
            return out
    return torch.bmm(x.float(), sink.float().unsqueeze(-1)).squeeze(-1)
