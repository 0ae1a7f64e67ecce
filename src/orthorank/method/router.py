"""The router policy's model: a linear score per selection layer from what the layer already has.

Features of token i (no extra pass over the layer; F = D + len(EXTRA_FEATURES)):
    x_i                          [D]  the layer's score input (its input norm's output)
    <x_sink, x_i>, |<x_sink, x_i>|, cos(x_sink, x_i)   the sink terms the paper's rule reads
    log ||x_i||, log ||h_i||     the normed and the raw residual norms
    log(1 + position)
score_i = ((f_i - mean) / scale) . w + b, higher = update first. The standardisation is folded into one weight
vector and bias when the layer first scores (`LayerRouter.folded`), so a score costs one matrix-vector product over
the hidden size plus the sink terms and norms: `flops_per_token`.

`RouterState` is the fitted state of every selection layer, with its feature list, the fit's settings and the
calibration it came from, and a format version; it is saved inside the plan (`SelectionConfig.fitted`) and loads
bit for bit (weights are float32, written as the exact decimal of each float32).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from orthorank.errors import UserError
from orthorank.method.orthogonality import dot_float32, score_rows

ROUTER_FORMAT = "orthorank-router/1"
EXTRA_FEATURES = ("sink_dot", "sink_abs", "sink_cos", "log_norm_x", "log_norm_h", "log_position")


def flops_per_token(hidden: int) -> float:
    """A router score per token: the sink dot product and two norms (2D each), the linear score over D + 6
    features (2(D + 6)), and a few FLOPs for logs and the cosine."""
    return float(2 * hidden * 3 + 2 * (hidden + len(EXTRA_FEATURES)) + 16)


def extra_features(src: torch.Tensor, hidden: torch.Tensor, sink: torch.Tensor,
                   positions: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, 6] float32: the sink terms, log norms and log position of every token (EXTRA_FEATURES). positions:
    [B, T] each token's distance from its row's sink (default 0..T-1: unpadded, no cache); pads clamp to 0."""
    B, T, _ = src.shape
    dot = dot_float32(src, sink)  # [B, T]
    norm_x = torch.linalg.vector_norm(src, dim=-1, dtype=torch.float32)
    norm_h = torch.linalg.vector_norm(hidden, dim=-1, dtype=torch.float32)
    norm_s = torch.linalg.vector_norm(sink, dim=-1, dtype=torch.float32).view(-1, 1)
    cos = dot / (norm_x * norm_s).clamp_min(1e-12)
    if positions is None:
        positions = torch.arange(T, device=src.device).expand(B, T)
    pos = torch.log1p(positions.to(device=src.device, dtype=torch.float32).clamp_min(0.0))
    return torch.stack([dot, dot.abs(), cos, torch.log(norm_x.clamp_min(1e-12)),
                        torch.log(norm_h.clamp_min(1e-12)), pos], dim=-1)


def features(src: torch.Tensor, hidden: torch.Tensor, sink: torch.Tensor,
             positions: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, D + 6] float32: every feature of every token (the fit's design matrix)."""
    return torch.cat([src.float(), extra_features(src, hidden, sink, positions)], dim=-1)


def _floats(values: Any, n: int | None, what: str) -> tuple[float, ...]:
    if not isinstance(values, (list, tuple)) or (n is not None and len(values) != n):
        raise UserError(f"router state: {what} must be a list of {n if n is not None else 'some'} numbers")
    try:
        arr = np.asarray(values, dtype=np.float64).astype(np.float32)
    except (TypeError, ValueError):
        raise UserError(f"router state: {what} must be a list of numbers") from None
    out = tuple(arr.tolist())
    if not all(math.isfinite(v) for v in out):
        raise UserError(f"router state: {what} holds a non-finite number")
    return out


def _f32(t: torch.Tensor) -> tuple[float, ...]:
    return tuple(float(v) for v in t.detach().to("cpu", torch.float32).reshape(-1).tolist())


@dataclass(frozen=True)
class LayerRouter:
    """One selection layer's fitted score. Tuples of float32 values: hashable, comparable, exact in JSON."""

    layer: int
    weight: tuple[float, ...]  # [F] on standardised features
    bias: float
    mean: tuple[float, ...]  # [F]
    scale: tuple[float, ...]  # [F], > 0
    # the causal decision (SelectionConfig.decode == "causal"): a token is updated when its score reaches this;
    # None for a router that only ranks (top-K in prefill)
    threshold: float | None = None
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_tensors(cls, layer: int, weight: torch.Tensor, bias: float, mean: torch.Tensor,
                     scale: torch.Tensor) -> "LayerRouter":
        return cls(layer, _f32(weight), float(np.float32(bias)), _f32(mean), _f32(scale))

    def folded(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(w_x [D] float32, w_extra [6] float32, bias) with the standardisation folded in, cached per device."""
        got = self._cache.get(device)
        if got is None:
            w = torch.tensor(self.weight, dtype=torch.float64) / torch.tensor(self.scale, dtype=torch.float64)
            b = float(self.bias) - float((w * torch.tensor(self.mean, dtype=torch.float64)).sum())
            n = len(EXTRA_FEATURES)
            got = (w[:-n].to(device, torch.float32), w[-n:].to(device, torch.float32), b)
            self._cache[device] = got
        return got

    def score(self, src: torch.Tensor, hidden: torch.Tensor, sink: torch.Tensor,
              positions: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T] float32 scores (higher = update first); positions as in extra_features."""
        w_x, w_e, b = self.folded(src.device)
        if w_x.shape[0] != src.shape[-1]:
            raise UserError(f"the router of layer {self.layer} was fitted on hidden size {w_x.shape[0]}, not "
                            f"{src.shape[-1]}")
        B, T, D = src.shape
        if positions is None:
            positions = torch.arange(T, device=src.device).expand(B, T)
        # one float32 copy of each block of the score input serves the linear score, the sink terms and the norm; on
        # CPU from SCORE_BLOCKS_FROM tokens on a block of SCORE_ROWS tokens at a time, so that the copy stays in cache
        # (the same bits as one pass)
        rows = score_rows(T, src)
        if rows >= T:  # one pass (decode steps among them): no slices or output copy in the per-token hot path
            xf = src.float()
            return torch.mv(xf.reshape(B * T, D), w_x).view(B, T) + extra_features(xf, hidden, sink, positions) @ w_e + b
        out = torch.empty(B, T, dtype=torch.float32, device=src.device)
        for a in range(0, T, rows):
            e = min(T, a + rows)
            xf = src[:, a:e].float()
            main = torch.mv(xf.reshape(B * (e - a), D), w_x).view(B, e - a)
            out[:, a:e] = main + extra_features(xf, hidden[:, a:e], sink, positions[:, a:e]) @ w_e + b
        return out

    def step_scorer(self, sink: torch.Tensor) -> "StepScorer":
        """The score of one token at a time against this sink state [1, D] (a batch-1 decoding step)."""
        w_x, w_e, b = self.folded(sink.device)
        if w_x.shape[0] != sink.shape[-1]:
            raise UserError(f"the router of layer {self.layer} was fitted on hidden size {w_x.shape[0]}, not "
                            f"{sink.shape[-1]}")
        sink_f = sink.reshape(-1).float()
        norm_s = torch.linalg.vector_norm(sink.reshape(1, -1), dim=-1, dtype=torch.float32)
        return StepScorer(torch.stack([w_x, sink_f]), np.float32(norm_s.item()),
                          tuple(np.float32(v) for v in w_e.tolist()), np.float32(b))

    def to_dict(self) -> dict[str, Any]:
        out = {"weight": list(self.weight), "bias": self.bias, "mean": list(self.mean), "scale": list(self.scale)}
        if self.threshold is not None:  # absent otherwise: ranking routers keep their files and digests
            out["threshold"] = self.threshold
        return out


@dataclass(frozen=True)
class StepScorer:
    """LayerRouter.score for one token, in a few operator calls: at batch 1 a decoding step is dispatch-bound, and
    the general score's [B, T] feature tensors cost about a hundred small calls per layer (scripts/decode_skip_ops.py).

    The two length-D products (the linear score and the sink dot product) run as one matrix-vector product and the
    two norms as in the general score, in float32; the six features, their weights and the bias are then combined on
    the host in float32 (numpy), in the general score's order of operations. Equal to `LayerRouter.score` up to
    rounding in the logarithms and the order of the six-term sum (tests/method/test_causal_router.py): a token whose
    score lies within about 1e-6 of the threshold may decide differently when generated than teacher-forced.
    """

    rows: torch.Tensor  # [2, D] float32: the folded weight over x, and the sink state
    norm_s: np.float32  # ||x_sink||
    w_extra: tuple  # 6 x np.float32, in EXTRA_FEATURES order
    bias: np.float32

    def __call__(self, src: torch.Tensor, hidden: torch.Tensor, position: int) -> float:
        """src, hidden: [1, 1, D] the token's score input and layer input; position: its distance from the sink."""
        xf = src.reshape(-1).float()
        lin_dot = torch.mv(self.rows, xf)  # [2]
        norm_x = torch.linalg.vector_norm(xf, dtype=torch.float32)
        norm_h = torch.linalg.vector_norm(hidden.reshape(-1), dtype=torch.float32)
        main, dot, nx, nh = (np.float32(v) for v in torch.cat([lin_dot, norm_x.view(1), norm_h.view(1)]).tolist())
        f32, tiny = np.float32, np.float32(1e-12)
        with np.errstate(all="ignore"):  # a non-finite score is the caller's error to report
            cos = dot / max(nx * self.norm_s, tiny)
            extra = (dot, abs(dot), cos, np.log(max(nx, tiny)), np.log(max(nh, tiny)),
                     np.log1p(f32(max(position, 0))))
            total = f32(0.0)
            for value, weight in zip(extra, self.w_extra):
                total = f32(total + f32(value * weight))
            return float(f32(main + total) + self.bias)


@dataclass(frozen=True)
class RouterState:
    """Every selection layer's router, with what the fit was (target, regularisation, features) and the calibration
    it came from."""

    layers: tuple[LayerRouter, ...]
    target: str
    hidden: int
    settings: dict = field(default_factory=dict, compare=False, hash=False)  # alpha per layer, seed, timings, ...
    calibration: dict = field(default_factory=dict, compare=False, hash=False)
    format: str = ROUTER_FORMAT

    def layer(self, index: int) -> LayerRouter:
        for r in self.layers:
            if r.layer == index:
                return r
        raise UserError(f"the router has no fitted score for layer {index} (it was fitted for layers "
                        f"{[r.layer for r in self.layers]}): fit it for this plan's layers with `orthorank fit-router`")

    @property
    def layer_indices(self) -> list[int]:
        return [r.layer for r in self.layers]

    @property
    def causal(self) -> bool:
        """Every layer has a threshold: the router can decide per token (SelectionConfig.decode == "causal")."""
        return bool(self.layers) and all(r.threshold is not None for r in self.layers)

    def with_thresholds(self, thresholds: dict[int, float], settings: dict | None = None) -> "RouterState":
        """The same router with a float32 threshold per layer (every layer of the state needs one)."""
        missing = sorted(set(self.layer_indices) - set(thresholds))
        if missing:
            raise UserError(f"no threshold for the router's layer(s) {missing}")
        layers = tuple(dataclasses.replace(r, threshold=float(np.float32(thresholds[r.layer])), _cache={})
                       for r in self.layers)
        return dataclasses.replace(self, layers=layers, settings={**self.settings, **(settings or {})})

    def digest(self) -> str:
        """What the router computes (weights, scaling, target), not how long its fit took: a short hash."""
        body = {"format": self.format, "target": self.target, "hidden": self.hidden,
                "layers": {str(r.layer): r.to_dict() for r in self.layers}}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "kind": "router", "target": self.target, "hidden": self.hidden,
                "features": ["x[0:D]", *EXTRA_FEATURES], "settings": self.settings,
                "calibration": self.calibration,
                "layers": {str(r.layer): r.to_dict() for r in self.layers}}

    @classmethod
    def from_dict(cls, data: Any) -> "RouterState":
        if not isinstance(data, dict) or data.get("format") != ROUTER_FORMAT:
            raise UserError(f"the plan's fitted policy state is not a router of format {ROUTER_FORMAT!r}")
        try:
            hidden = int(data["hidden"])
            n = hidden + len(EXTRA_FEATURES)
            layers = []
            for key, item in sorted(dict(data["layers"]).items(), key=lambda kv: int(kv[0])):
                threshold = item.get("threshold")
                layers.append(LayerRouter(int(key), _floats(item["weight"], n, f"layer {key} weight"),
                                          _floats([item["bias"]], 1, f"layer {key} bias")[0],
                                          _floats(item["mean"], n, f"layer {key} mean"),
                                          _floats(item["scale"], n, f"layer {key} scale"),
                                          None if threshold is None
                                          else _floats([threshold], 1, f"layer {key} threshold")[0]))
            if any(s <= 0 for r in layers for s in r.scale):
                raise UserError("router state: feature scales must be positive")
            return cls(tuple(layers), str(data["target"]), hidden, dict(data.get("settings") or {}),
                       dict(data.get("calibration") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"the plan's router state is malformed: {type(exc).__name__}: {exc}") from None


def constant_router(layers: list[int], hidden: int, bias: float = 0.0) -> RouterState:
    """All-zero weights and a bias: every token scores the same, so selection falls to the tie rule (the earliest
    tokens first), as a constant policy would."""
    n = hidden + len(EXTRA_FEATURES)
    zeros, ones = torch.zeros(n), torch.ones(n)
    return RouterState(tuple(LayerRouter.from_tensors(i, zeros, bias, zeros, ones) for i in sorted(layers)),
                       "constant", hidden, {"kind": "constant"})


def random_router(layers: list[int], hidden: int, seed: int = 0) -> RouterState:
    """Random weights (tests and shapes): a router with no meaning, for code paths that need one."""
    gen = torch.Generator().manual_seed(seed)
    n = hidden + len(EXTRA_FEATURES)
    out = []
    for i in sorted(layers):
        w, mean = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 0.1
        scale = torch.rand(n, generator=gen) + 0.5
        out.append(LayerRouter.from_tensors(i, w, float(torch.randn(1, generator=gen)), mean, scale))
    return RouterState(tuple(out), "random", hidden, {"kind": "random", "seed": seed})
