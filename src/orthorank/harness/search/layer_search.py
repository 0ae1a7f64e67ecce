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

from orthorank.harness import distributed as dist
from orthorank.method.layer import SelectiveLayer, SequenceContext
from orthorank.method.selection import SelectionConfig
from orthorank.models.adapters import get_adapter
from orthorank.models.loading import input_device
from orthorank.harness.search.checkpoint import Checkpoint, stored_steps
from orthorank.harness.search.racing import race

Config = dict[int, "nn.Module | SelectiveLayer | None"]


class _Captured(Exception):
    """Stops the capture forward once the last layer's inputs are known."""


@dataclass
class SearchResult:
    order: list[int]  # layers in the order they were chosen (best first)
    losses: list[float]  # calibration loss after each choice (greedy) or of each single change (one-shot)
    dense_loss: float
    seconds: float
    evaluations: int
    scores: dict[int, float] = field(default_factory=dict)  # one-shot criteria: layer -> score


class StackRunner:
    """Runs a model's decoder layers one by one on fixed calibration windows.

    Each layer's inputs besides the hidden states (the mask the model builds for its attention implementation,
    RoPE per layer type, position ids) and the first layer's input (embedding with any family scaling) are
    captured once from a dense forward, so the runner calls every layer exactly as the model would.
    """

    def __init__(self, model: nn.Module, windows: torch.Tensor, batch_size: int = 4) -> None:
        self.model = model
        adapter = get_adapter(model)
        self.adapter = adapter
        self.decoder = adapter.decoder(model)
        self.layers = list(adapter.layers(model))
        device = input_device(model)
        self.batches = [windows[i : i + batch_size].to(device) for i in range(0, windows.shape[0], batch_size)]
        self.tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in self.batches)
        self.states: list[list[torch.Tensor]] = []  # states[i][batch]: input of layer i; states[L]: final
        self.evaluations = 0
        self.layer_kwargs: list[list[dict]] = [[{} for _ in self.batches] for _ in self.layers]
        self.embeddings: list[torch.Tensor] = []
        self._capture_layer_inputs()

    @torch.no_grad()
    def _capture_layer_inputs(self) -> None:
        handles = []
        for i, layer in enumerate(self.layers):
            def grab(module, args, kwargs, i=i):
                if i == 0:
                    self.embeddings.append(args[0] if args else kwargs["hidden_states"])
                self.layer_kwargs[i][self._b] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
                if i == len(self.layers) - 1:
                    raise _Captured
            handles.append(layer.register_forward_pre_hook(grab, with_kwargs=True))
        try:
            for self._b, ids in enumerate(self.batches):
                try:
                    self.decoder(input_ids=ids, use_cache=False)
                except _Captured:
                    pass
        finally:
            for h in handles:
                h.remove()

    def wrap(self, i: int, selection: SelectionConfig) -> SelectiveLayer:
        # A fresh context with no padding mask: calibration windows are unpadded.
        return SelectiveLayer(self.layers[i], self.adapter, selection, SequenceContext(), i)

    def _layer(self, config: Config, i: int):
        return config[i] if i in config else self.layers[i]

    @torch.no_grad()
    def _run(self, config: Config, start: int, b: int, h: torch.Tensor, keep_states: bool) -> torch.Tensor:
        for i in range(start, len(self.layers)):
            if keep_states:
                self.states[i][b] = h
            layer = self._layer(config, i)
            if layer is not None:
                out = layer(h, **self.layer_kwargs[i][b])
                h = out[0] if isinstance(out, tuple) else out
        if keep_states:
            self.states[len(self.layers)][b] = h
        return h

    @torch.no_grad()
    def _window_nll(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Summed next-token NLL of each window: [B] (float64)."""
        logits = self.adapter.logits(self.model, h)[:, :-1].float()  # [B, T-1, V]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
        return nll.view(ids.shape[0], -1).double().sum(dim=1)

    def _loss(self, h: torch.Tensor, ids: torch.Tensor) -> float:
        return float(self._window_nll(h, ids).sum())

    @torch.no_grad()
    def cache(self, config: Config, start: int = 0) -> float:
        """Recompute cached layer inputs from layer `start` on; returns the mean calibration NLL."""
        if not self.states:
            self.states = [[None] * len(self.batches) for _ in range(len(self.layers) + 1)]
        total = 0.0
        for b, ids in enumerate(self.batches):
            h = self.embeddings[b] if start == 0 else self.states[start][b]
            total += self._loss(self._run(config, start, b, h, keep_states=True), ids)
        return total / self.tokens

    @torch.no_grad()
    def loss_with(self, config: Config, start: int) -> float:
        """Mean calibration NLL of `config`, which must agree with the cached configuration before `start`."""
        self.evaluations += 1
        return sum(self.batch_losses(config, start, range(len(self.batches))).values()) / self.tokens

    @torch.no_grad()
    def batch_losses(self, config: Config, start: int, batches) -> dict[int, float]:
        """Summed calibration NLL of `config` on the given batches: {batch: NLL}."""
        out = {}
        for b in batches:
            out[b] = self._loss(self._run(config, start, b, self.states[start][b], keep_states=False),
                                self.batches[b])
        return out

    @torch.no_grad()
    def window_losses(self, config: Config, start: int, batches) -> dict[int, torch.Tensor]:
        """Summed calibration NLL of each window of the given batches under `config`: {batch: [windows]}."""
        return {b: self._window_nll(self._run(config, start, b, self.states[start][b], keep_states=False),
                                    self.batches[b]) for b in batches}

    def batch_tokens(self, batches) -> int:
        return sum(self.batches[b].shape[0] * (self.batches[b].shape[1] - 1) for b in batches)


def greedy_search(
    runner: StackRunner,
    steps: int,
    candidates: list[int],
    change: Callable[[int], nn.Module | None],
    progress: bool = True,
    desc: str = "search",
    screen_batches: int | None = None,
    recheck: int = 3,
    log: Callable[[str], None] | None = None,
    checkpoint: Checkpoint | None = None,
) -> SearchResult:
    """SLEB's loop: at each step try the change in every remaining candidate layer and keep the one whose
    calibration loss is lowest (ties: the lower layer index).

    Fast variant (screen_batches < all batches): a race (harness/search/racing.py): every candidate is scored on the first
    `screen_batches` calibration batches, those clearly worse than the leader (paired per window) are dropped, the
    rest see twice as many batches, and so on; the `recheck` best so far always go on, and the survivors are ranked
    on every batch. With screen_batches None (or all batches) every candidate sees every batch: exhaustive greedy.
    Under torchrun the candidates of a step are split across ranks; every rank ends with the same choice.
    With a `checkpoint`, each step is stored as it is chosen and the stored steps of an earlier run are replayed
    first (harness/search/checkpoint.py)."""
    start_t = time.perf_counter()
    checkpoint = checkpoint or Checkpoint(None)
    config, order, losses, remaining, earlier, dense_loss = _replay_greedy(runner, checkpoint, steps, candidates,
                                                                           change)
    # Search time across runs: each stored step carries the seconds spent up to it, so a resumed search reports
    # the whole search's time (the replay's one forward pass aside), not only its last run's.
    start_t -= earlier
    if order and log is not None and dist.is_main():
        log(f"  resumed {len(order)} finished step(s) from {checkpoint.folder}: layers {order}")
    n_batches = len(runner.batches)
    screen = n_batches if screen_batches is None else max(1, min(screen_batches, n_batches))
    steps = min(steps, len(order) + len(remaining))
    bar = tqdm(total=steps, initial=len(order), desc=desc, disable=not progress or not dist.is_main(), leave=True,
               unit="step")
    score = _candidate_scorer(runner, config, change)
    while len(order) < steps:
        trace: list[tuple[int, int]] = []
        totals = race(remaining, score, n_batches, screen, keep=recheck, trace=trace)
        best = min(totals, key=lambda c: (totals[c], c))
        config[best] = change(best)
        loss = runner.cache(config, best)  # the chosen configuration's mean NLL on every window
        order.append(best)
        losses.append(loss)
        remaining.remove(best)
        checkpoint.put(len(order), {"layer": best, "loss": loss, "evaluations": runner.evaluations,
                                    "seconds": round(time.perf_counter() - start_t, 2)})
        bar.update(1)
        bar.set_postfix(layer=best, loss=f"{loss:.4f}")
        if log is not None and dist.is_main():
            raced = "" if len(trace) < 2 else " (race: " + ", ".join(f"{n} on {b}" for b, n in trace) + " batches)"
            log(f"  step {len(order)}: layer {best}, calibration loss {loss:.4f}{raced} "
                f"({time.perf_counter() - start_t:.0f}s)")
    bar.close()
    return SearchResult(order, losses, dense_loss, time.perf_counter() - start_t, runner.evaluations)


def _replay_greedy(runner: StackRunner, checkpoint: Checkpoint, steps: int, candidates: list[int],
                   change: Callable[[int], nn.Module | None]
                   ) -> tuple[Config, list[int], list[float], list[int], float, float]:
    """Replay the steps an interrupted run stored (at most `steps`) and cache the layer inputs of the configuration
    they reach, so the search goes on from there: (config, order, losses, remaining candidates, seconds the stored
    steps took, dense loss). A fresh search stores the dense loss as entry 0."""
    done = checkpoint.load()
    config: Config = {}
    order, losses = [], []
    remaining = list(candidates)
    replay = stored_steps(done)[:steps]
    for s in replay:
        config[s["layer"]] = change(s["layer"])
        order.append(s["layer"])
        losses.append(s["loss"])
        remaining.remove(s["layer"])
        runner.evaluations = s["evaluations"]
    checkpoint.resumed = len(replay)
    earlier = float(replay[-1].get("seconds", 0.0)) if replay else 0.0
    if 0 in done and replay:
        dense_loss = done[0]["dense_loss"]
        runner.cache(config)  # the cached layer inputs of the replayed configuration
    else:
        dense_loss = runner.cache(config)
        if 0 not in done:
            checkpoint.put(0, {"dense_loss": dense_loss})
    return config, order, losses, remaining, earlier, dense_loss


def _candidate_scorer(runner: StackRunner, config: Config, change: Callable[[int], nn.Module | None]
                      ) -> Callable[[list[int], list[int]], dict[int, dict[int, torch.Tensor]]]:
    """The race's scoring: per-window losses of each candidate's change on top of `config` (read at call time, so
    it follows the search's choices), the candidates split across ranks and gathered on every rank."""

    def score(cands: list[int], batches: list[int]) -> dict[int, dict[int, torch.Tensor]]:
        mine = {c: runner.window_losses({**config, c: change(c)}, c, batches) for c in dist.shard(cands)}
        runner.evaluations += len(cands)
        merged: dict[int, dict[int, torch.Tensor]] = {}
        for part in dist.all_gather(mine):
            merged.update(part)
        return merged

    return score


def one_shot_ppl(runner: StackRunner, candidates: list[int], progress: bool = True,
                 checkpoint: Checkpoint | None = None) -> SearchResult:
    """Shortened LLaMA's PPL criterion: remove each layer alone; the least harmful come first. With a `checkpoint`,
    each layer's score is stored as it is known (entry layer + 1) and stored scores are not recomputed."""
    start_t = time.perf_counter()
    checkpoint = checkpoint or Checkpoint(None)
    done = checkpoint.load()
    dense_loss = runner.cache({})
    scores = {c: done[c + 1]["loss"] for c in candidates if c + 1 in done}
    checkpoint.resumed = len(scores)
    runner.evaluations += len(scores)  # stored scores count as evaluated, as in the run that made them
    if 0 not in done:
        checkpoint.put(0, {"dense_loss": dense_loss})
    todo = [c for c in candidates if c not in scores]
    n = dist.world_size()
    bar = tqdm(total=len(todo), desc="shortened-ppl", disable=not progress or not dist.is_main(), leave=False)
    for group in (todo[i:i + n] for i in range(0, len(todo), n)):
        mine = {c: runner.loss_with({c: None}, c) for c in dist.shard(group)}
        bar.update(len(group))
        for part in dist.all_gather(mine):
            for c, loss in part.items():
                scores[c] = loss
                checkpoint.put(c + 1, {"layer": c, "loss": loss})
    bar.close()
    scores = {c: scores[c] for c in candidates}
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
