"""Per-layer sink statistics of a dense model, captured with forward hooks in one pass per sample.

For every decoder layer l (its input, i.e. what OrthoRank would score in layer l):

- cos(sink, token) of the normalized states x = input_layernorm(h): mean, mean |cos| and quantiles over all
  non-sink tokens of all samples; and the mean on the raw residual stream h, which leaves out the per-channel
  RMSNorm weights (they can shrink or amplify the sink's massive channels);
- the sink's stability: cos(x_sink^l, x_sink^{l+1}) (normalized states, which include each layer's RMSNorm
  weight) and cos(h_sink^l, h_sink^{l+1}) (the residual stream's direction, free of those weights); the other
  tokens' mean stability for reference;
- hidden-state norms |h| of the sink and of the other tokens (mean, median, max);
- the share of attention that goes to the sink, recomputed from the layer's own q/k projections and RoPE (so it
  works with any attention kernel), averaged over query positions 1..T-1 (the sink's own query can only attend
  to itself) and, for the headline number, over heads;
- for one sample (the first window's first `sample_tokens` tokens), which tokens OrthoRank would select in each
  layer, using the package's own selection code on the dense model's states.

The sink is the first token of each sample (SmolLM2 adds no BOS; with a BOS, the BOS is the sink).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from orthorank.errors import UserError
from orthorank.method.orthogonality import sink_scores
from orthorank.method.selection import CRITERIA, tokens_to_keep, topk_keep_mask
from orthorank.models.adapters import get_adapter
from orthorank.models.loading import input_device

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
SINK = 0  # position of the sink in every sample
_QUERY_BLOCK = 256


def quantile_key(q: float) -> str:
    return f"q{round(q * 100):02d}"


@dataclass
class SinkAnalysis:
    """Everything the plots and the report show; per-layer lists have one entry per decoder layer."""

    model: str
    num_layers: int
    num_heads: int
    samples: int
    tokens_per_sample: int
    ratio: float
    criterion: str
    source: str  # where the text came from, for the report
    cos_mean: list[float]
    cos_abs_mean: list[float]
    cos_quantiles: dict[str, list[float]]
    cos_residual_mean: list[float]  # the same on the raw residual stream h (no RMSNorm weights)
    sink_stability: list[float | None]  # l -> l+1, None for the last layer
    sink_stability_residual: list[float | None]
    token_stability: list[float | None]
    sink_norm: list[float]
    other_norm_mean: list[float]
    other_norm_median: list[float]
    other_norm_max: list[float]
    max_norm_is_sink: list[float]  # share of samples whose largest-norm token is the sink
    attn_sink_share: list[float]
    attn_sink_share_heads: list[list[float]]  # [layer][head]
    selection: dict[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> list[int]:
        return list(range(self.num_layers))

    @property
    def norm_ratio(self) -> list[float]:
        """Sink norm over the other tokens' median norm."""
        return [s / max(m, 1e-12) for s, m in zip(self.sink_norm, self.other_norm_median)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["norm_ratio"] = self.norm_ratio
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SinkAnalysis":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


class _Collector:
    """Forward hooks on each layer's input_layernorm (h in, x out) and self_attn (pre-hook: q/k for the sink's
    attention share). Layers run in order within a forward, so the previous layer's states are at hand for the
    layer-to-layer stability."""

    def __init__(self, model: nn.Module, sample_tokens: int) -> None:
        self.adapter = get_adapter(model)
        self.layers = list(self.adapter.layers(model))
        self.config = model.config
        self.sample_tokens = sample_tokens
        n = len(self.layers)
        self.cos: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.cos_h: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.sink_norm: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.other_norm: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.max_is_sink: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.stab_x: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.stab_h: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.stab_tok: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.attn: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.sample_x: list[torch.Tensor | None] = [None] * n  # first sample's normalized states
        self._prev: tuple[torch.Tensor, torch.Tensor] | None = None
        self.capture_sample = False
        self.handles: list[Any] = []

    def __enter__(self) -> "_Collector":
        for i, layer in enumerate(self.layers):
            self.handles.append(layer.input_layernorm.register_forward_hook(self._norm_hook(i)))
            self.handles.append(
                layer.self_attn.register_forward_pre_hook(self._attn_hook(i, layer), with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _norm_hook(self, i: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            h, x = args[0].detach().float(), output.detach().float()
            self.cos[i].append(F.cosine_similarity(x[:, SINK + 1:], x[:, SINK : SINK + 1], dim=-1).reshape(-1))
            self.cos_h[i].append(F.cosine_similarity(h[:, SINK + 1:], h[:, SINK : SINK + 1], dim=-1).reshape(-1))
            norms = h.norm(dim=-1)  # [B, T]
            self.sink_norm[i].append(norms[:, SINK])
            self.other_norm[i].append(norms[:, SINK + 1:].reshape(-1))
            self.max_is_sink[i].append((norms.argmax(dim=1) == SINK).float())
            if i > 0 and self._prev is not None:
                ph, px = self._prev
                self.stab_x[i - 1].append(F.cosine_similarity(px[:, SINK], x[:, SINK], dim=-1))
                self.stab_h[i - 1].append(F.cosine_similarity(ph[:, SINK], h[:, SINK], dim=-1))
                self.stab_tok[i - 1].append(
                    F.cosine_similarity(px[:, SINK + 1:], x[:, SINK + 1:], dim=-1).reshape(-1))
            self._prev = (h, x)
            if self.capture_sample:
                self.sample_x[i] = x[0, : self.sample_tokens].clone()

        return hook

    def _attn_hook(self, i: int, layer: nn.Module):
        rotate_half = self.adapter.rotate_half(layer)

        def hook(attn: nn.Module, args: tuple, kwargs: dict) -> None:
            x = kwargs.get("hidden_states", args[0] if args else None)
            pos = kwargs.get("position_embeddings")
            if x is None or pos is None:
                raise RuntimeError("self_attn was called without hidden_states/position_embeddings; "
                                   "this model family's attention is not supported by the analysis")
            B, T, _ = x.shape
            hd = attn.head_dim
            q = attn.q_proj(x).view(B, T, -1, hd).transpose(1, 2).float()
            k = attn.k_proj(x).view(B, T, -1, hd).transpose(1, 2).float()
            cos, sin = (p.float().unsqueeze(1) for p in pos)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if k.shape[1] != q.shape[1]:
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            mask, window = kwargs.get("attention_mask"), getattr(self.config, "sliding_window", None)
            total = torch.zeros(q.shape[:2], dtype=torch.float64, device=q.device)
            # Query blocks bound the memory of the [B, H, block, T] score matrix on long inputs.
            for start in range(SINK + 1, T, _QUERY_BLOCK):
                stop = min(T, start + _QUERY_BLOCK)
                scores = (q[:, :, start:stop] @ k.transpose(-1, -2)) * attn.scaling
                probs = _mask_scores(scores, mask, window, start).softmax(dim=-1)
                total += probs[..., SINK].double().sum(dim=-1)
            self.attn[i].append(total / (T - SINK - 1))  # [B, H]: mean over queries 1..T-1

        return hook


def _mask_scores(scores: torch.Tensor, mask: Any, sliding_window: int | None, q_start: int) -> torch.Tensor:
    """scores: [B, H, rows, S] for queries q_start..q_start+rows-1. Apply the model's own 4-D mask when it passed
    one, else a causal (and sliding-window) mask."""
    R, S = scores.shape[-2:]
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        mask = mask[..., q_start : q_start + R, :S]
        if mask.dtype == torch.bool:
            return scores.masked_fill(~mask, float("-inf"))
        return scores + mask.float()
    q = torch.arange(q_start, q_start + R, device=scores.device).unsqueeze(1)
    k = torch.arange(S, device=scores.device).unsqueeze(0)
    allowed = k <= q
    if sliding_window:
        allowed = allowed & (q - k < sliding_window)
    return scores.masked_fill(~allowed, float("-inf"))


def _mean(ts: Sequence[torch.Tensor]) -> float:
    return float(torch.cat([t.reshape(-1) for t in ts]).double().mean())


def _to_windows(ids: torch.Tensor | Sequence[Sequence[int]] | Sequence[int]) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.tensor(ids, dtype=torch.long)
        except (TypeError, ValueError):
            raise UserError("token ids must be a list of equal-length lists of integers") from None
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
        raise UserError("token ids must be a [samples, tokens] integer tensor")
    if ids.shape[0] < 1 or ids.shape[1] < 2:
        raise UserError(f"the analysis needs at least one sample of at least 2 tokens, got shape {tuple(ids.shape)}")
    return ids.long()


@torch.no_grad()
def analyze(
    model: nn.Module,
    ids: torch.Tensor | Sequence[Sequence[int]] | Sequence[int],
    *,
    ratio: float = 0.33,
    criterion: str = "dot",
    sample_tokens: int = 48,
    token_labels: Sequence[str] | None = None,
    name: str | None = None,
    source: str = "token ids",
) -> SinkAnalysis:
    """Analyze a dense model on token ids ([samples, tokens], or one 1-D sequence). The first token of each sample
    is the sink. `token_labels` name the first sample's tokens in the selection figure (default: the ids)."""
    _check_analysis_inputs(model, ratio, criterion, sample_tokens)
    windows = _to_windows(ids)
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and (int(windows.min()) < 0 or int(windows.max()) >= vocab):
        raise UserError(f"token ids must lie in [0, {vocab}) for this model")
    n_samples, n_tokens = windows.shape
    col = _collect(model, windows, sample_tokens)
    L = len(col.layers)
    allcos = [torch.cat(c).double() for c in col.cos]
    qs = torch.tensor(QUANTILES, dtype=torch.float64)
    cos_q = torch.stack([torch.quantile(c, qs) for c in allcos])  # [L, Q]
    other = [torch.cat(o).double() for o in col.other_norm]
    heads = [torch.cat(a).double().mean(dim=0) for a in col.attn]  # [H] per layer

    def per_transition(buf: list[list[torch.Tensor]]) -> list[float | None]:
        return [_mean(buf[i]) if i < L - 1 else None for i in range(L)]

    return SinkAnalysis(
        model=name or getattr(model.config, "name_or_path", "") or model.config.model_type,
        num_layers=L,
        num_heads=int(heads[0].numel()),
        samples=n_samples,
        tokens_per_sample=n_tokens,
        ratio=ratio,
        criterion=criterion,
        source=source,
        cos_mean=[float(c.mean()) for c in allcos],
        cos_abs_mean=[float(c.abs().mean()) for c in allcos],
        cos_quantiles={quantile_key(q): [float(v) for v in cos_q[:, j]] for j, q in enumerate(QUANTILES)},
        cos_residual_mean=[_mean(c) for c in col.cos_h],
        sink_stability=per_transition(col.stab_x),
        sink_stability_residual=per_transition(col.stab_h),
        token_stability=per_transition(col.stab_tok),
        sink_norm=[_mean(s) for s in col.sink_norm],
        other_norm_mean=[float(o.mean()) for o in other],
        other_norm_median=[float(o.median()) for o in other],
        other_norm_max=[float(o.max()) for o in other],
        max_norm_is_sink=[_mean(m) for m in col.max_is_sink],
        attn_sink_share=[float(h.mean()) for h in heads],
        attn_sink_share_heads=[[float(v) for v in h] for h in heads],
        selection=_selection_sample(col.sample_x, windows, sample_tokens, ratio, criterion, token_labels),
    )


def _collect(model: nn.Module, windows: torch.Tensor, sample_tokens: int) -> _Collector:
    """The hooks' statistics over one forward pass per sample; the first sample's states are kept for the selection
    figure."""
    device = input_device(model)
    col = _Collector(model, sample_tokens)
    with col:
        for s in range(windows.shape[0]):
            col._prev = None
            col.capture_sample = s == 0
            model(windows[s : s + 1].to(device), use_cache=False)
    return col


def _check_analysis_inputs(model: nn.Module, ratio: float, criterion: str, sample_tokens: int) -> None:
    if getattr(model, "_orthorank_state", None) is not None:
        raise UserError("the analysis runs on the dense model; call restore_dense(model) first")
    if not (0.0 < ratio <= 1.0):
        raise UserError(f"ratio must be in (0, 1], got {ratio}")
    if criterion not in CRITERIA:
        raise UserError(f"unknown criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    if sample_tokens < 2:
        raise UserError(f"the selection sample needs at least 2 tokens, got {sample_tokens}")


def _selection_sample(sample_x: list[torch.Tensor], windows: torch.Tensor, sample_tokens: int, ratio: float,
                      criterion: str, token_labels: Sequence[str] | None) -> dict[str, Any]:
    """Which tokens OrthoRank would select, per layer, in the first sample's first n tokens (dense states
    `sample_x`, one [n, D] per layer), with the tokens' ids and labels for the selection figure."""
    n = min(sample_tokens, windows.shape[1])
    sample_ids = windows[0, :n].tolist()
    keep_rows = []
    for x in sample_x:
        x = x.unsqueeze(0)  # [1, n, D]
        scores = sink_scores(x, x[:, SINK], criterion)
        keep = topk_keep_mask(scores, torch.ones_like(scores, dtype=torch.bool), torch.tensor([SINK]),
                              tokens_to_keep(torch.tensor([n]), ratio))
        keep_rows.append([int(v) for v in keep[0].tolist()])
    labels = list(token_labels)[:n] if token_labels is not None else [str(t) for t in sample_ids]
    if len(labels) < n:
        labels += [str(t) for t in sample_ids[len(labels):]]
    return {
        "ids": sample_ids,
        "labels": labels,
        "keep": keep_rows,  # [layer][token] 0/1
        "k": int(tokens_to_keep(torch.tensor([n]), ratio)[0]),
        "n": n,
    }


def observations(a: SinkAnalysis) -> dict[str, Any]:
    """Headline facts for the report and the CLI: where the sink's norm jumps, how the similarity evolves."""
    L = a.num_layers
    ratio = a.norm_ratio
    out: dict[str, Any] = {}
    if L >= 2:
        # jump[l]: growth of the sink/median norm ratio from layer l's input to layer l+1's input = layer l's doing.
        jumps = [ratio[l + 1] / max(ratio[l], 1e-12) for l in range(L - 1)]
        j = max(range(L - 1), key=lambda l: jumps[l])
        out["sink_layer"] = j
        out["norm_jump"] = {"layer": j, "ratio_before": ratio[j], "ratio_after": ratio[j + 1], "factor": jumps[j]}
        after = [v for v in a.sink_stability[j + 1 : L - 1] if v is not None]
        out["sink_stability_after"] = {"min": min(after), "mean": sum(after) / len(after)} if after else None
        first = min(j + 1, L - 1)
        out["cos_after_sink"] = {"first_layer": first, "first": a.cos_mean[first], "last_layer": L - 1,
                                 "last": a.cos_mean[L - 1], "max_layer": max(range(L), key=lambda l: a.cos_mean[l]),
                                 "max": max(a.cos_mean)}
        xs = list(range(first, L))
        if len(xs) >= 2:
            out["cos_trend_per_layer"] = _slope(xs, [a.cos_mean[l] for l in xs])
    out["attn_sink_share"] = {"mean": sum(a.attn_sink_share) / L,
                              "max_layer": max(range(L), key=lambda l: a.attn_sink_share[l]),
                              "max": max(a.attn_sink_share)}
    if "sink_layer" in out and out["sink_layer"] + 1 < L:
        tail = a.attn_sink_share[out["sink_layer"] + 1 :]
        out["attn_sink_share_after"] = sum(tail) / len(tail)
    return out


def _slope(xs: list[int], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0
