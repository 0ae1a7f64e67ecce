"""Layer searches on calibration windows, reusing the unchanged prefix of the network between candidates.

A configuration maps layer index -> replacement module (an OrthoRank wrapper) or None (layer removed). The
inputs of every layer under the current configuration are cached, so a candidate change at layer c only
re-runs layers c..L-1 and the head: a greedy step costs about half a forward pass per candidate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from orthorank.method.layer import OrthoRankLayer, SequenceContext
from orthorank.method.selection import SelectionConfig
from orthorank.models.adapters import get_adapter

Config = dict[int, nn.Module | None]


@dataclass
class SearchResult:
    order: list[int]  # layers in the order they were chosen (best first)
    losses: list[float]  # calibration loss after each choice (greedy) or of each single change (one-shot)
    dense_loss: float
    seconds: float
    evaluations: int
    scores: dict[int, float] = field(default_factory=dict)  # one-shot criteria: layer -> score


class StackRunner:
    """Runs a dense model's decoder layers one by one on fixed calibration windows."""

    def __init__(self, model: nn.Module, windows: torch.Tensor, batch_size: int = 4) -> None:
        self.model = model
        adapter = get_adapter(model)
        self.adapter = adapter
        self.decoder = adapter.decoder(model)
        self.layers = list(adapter.layers(model))
        device = next(model.parameters()).device
        self.batches = [windows[i : i + batch_size].to(device) for i in range(0, windows.shape[0], batch_size)]
        self.position_ids = [torch.arange(b.shape[1], device=device).unsqueeze(0) for b in self.batches]
        self.tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in self.batches)
        self.states: list[list[torch.Tensor]] = []  # states[i][batch]: input of layer i; states[L]: final
        self.evaluations = 0

    def wrap(self, i: int, selection: SelectionConfig) -> OrthoRankLayer:
        # A fresh context with no padding mask: calibration windows are unpadded.
        return OrthoRankLayer(self.layers[i], self.adapter, selection, SequenceContext(), i)

    def _pos(self, b: int, h: torch.Tensor):
        return self.decoder.rotary_emb(h, position_ids=self.position_ids[b])

    def _layer(self, config: Config, i: int) -> nn.Module | None:
        return config[i] if i in config else self.layers[i]

    @torch.no_grad()
    def _run(self, config: Config, start: int, b: int, h: torch.Tensor, keep_states: bool) -> torch.Tensor:
        pos_emb = self._pos(b, h)
        for i in range(start, len(self.layers)):
            if keep_states:
                self.states[i][b] = h
            layer = self._layer(config, i)
            if layer is not None:
                h = layer(h, attention_mask=None, position_ids=self.position_ids[b], position_embeddings=pos_emb,
                          use_cache=False)
        if keep_states:
            self.states[len(self.layers)][b] = h
        return h

    @torch.no_grad()
    def _loss(self, h: torch.Tensor, ids: torch.Tensor) -> float:
        logits = self.model.lm_head(self.decoder.norm(h))[:, :-1].float()
        return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"))

    @torch.no_grad()
    def cache(self, config: Config, start: int = 0) -> float:
        """Recompute cached layer inputs from layer `start` on; returns the mean calibration NLL."""
        if not self.states:
            self.states = [[None] * len(self.batches) for _ in range(len(self.layers) + 1)]
        total = 0.0
        for b, ids in enumerate(self.batches):
            h = self.decoder.embed_tokens(ids) if start == 0 else self.states[start][b]
            total += self._loss(self._run(config, start, b, h, keep_states=True), ids)
        return total / self.tokens

    @torch.no_grad()
    def loss_with(self, config: Config, start: int) -> float:
        """Mean calibration NLL of `config`, which must agree with the cached configuration before `start`."""
        self.evaluations += 1
        total = 0.0
        for b, ids in enumerate(self.batches):
            total += self._loss(self._run(config, start, b, self.states[start][b], keep_states=False), ids)
        return total / self.tokens


def greedy_search(
    runner: StackRunner,
    steps: int,
    candidates: list[int],
    change: Callable[[int], nn.Module | None],
    progress: bool = True,
    desc: str = "search",
) -> SearchResult:
    """SLEB's loop: at each step try the change in every remaining candidate layer and keep the one whose
    calibration loss is lowest."""
    start_t = time.perf_counter()
    config: Config = {}
    dense_loss = runner.cache(config)
    order, losses = [], []
    remaining = list(candidates)
    bar = tqdm(total=sum(len(remaining) - s for s in range(steps)), desc=desc, disable=not progress, leave=False)
    for _ in range(min(steps, len(remaining))):
        trials = []
        for c in remaining:
            trials.append((runner.loss_with({**config, c: change(c)}, c), c))
            bar.update(1)
        loss, best = min(trials)  # ties: lower layer index
        config[best] = change(best)
        runner.cache(config, best)
        order.append(best)
        losses.append(loss)
        remaining.remove(best)
        bar.set_postfix(layer=best, loss=f"{loss:.4f}")
    bar.close()
    return SearchResult(order, losses, dense_loss, time.perf_counter() - start_t, runner.evaluations)


def one_shot_ppl(runner: StackRunner, candidates: list[int], progress: bool = True) -> SearchResult:
    """Shortened LLaMA's PPL criterion: remove each layer alone; the least harmful come first."""
    start_t = time.perf_counter()
    dense_loss = runner.cache({})
    scores = {}
    for c in tqdm(candidates, desc="shortened-ppl", disable=not progress, leave=False):
        scores[c] = runner.loss_with({c: None}, c)
    order = sorted(scores, key=lambda c: (scores[c], c))
    return SearchResult(order, [scores[c] for c in order], dense_loss, time.perf_counter() - start_t,
                        runner.evaluations, scores)


def block_influence(runner: StackRunner) -> SearchResult:
    """ShortGPT's Block Influence: BI_i = 1 - mean_t cos(input_i, output_i); the lowest come first."""
    start_t = time.perf_counter()
    dense_loss = runner.cache({})
    L = len(runner.layers)
    scores = {}
    for i in range(L):
        cos = [F.cosine_similarity(runner.states[i][b].float(), runner.states[i + 1][b].float(), dim=-1).mean()
               for b in range(len(runner.batches))]
        scores[i] = float(1.0 - torch.stack(cos).mean())
    order = sorted(scores, key=lambda c: (scores[c], c))
    return SearchResult(order, [scores[c] for c in order], dense_loss, time.perf_counter() - start_t, 0, scores)
