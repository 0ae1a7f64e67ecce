"""Hybrid search: one greedy search over three kinds of change per layer (remove it, select tokens in it at a
ratio from a small set, keep it) under a budget of *measured* cost (a cost table from `orthorank bench
--cost-table`).

From the dense model, each step considers every move that makes one layer cheaper on the cost table:
keep -> select at a ratio r, select at r -> select at a smaller r' (only where the table says r' is cheaper), and
keep or select -> remove. Each move is scored by SLEB's calibration loss (mean NLL on calibration windows, the
StackRunner reusing the unchanged prefix) and the rule is

    pick the move with the lowest loss increase per unit of predicted time saved,
        (loss after the move - loss now) / (predicted prefill time saved, as a share of the dense model's),

ties going to the larger saving, then the lower layer. Plain "lowest loss" would always prefer the smallest move
(keep -> the largest ratio saves little and costs little), so the search would crawl through small moves that buy
little speed; dividing by the saving compares moves at their exchange rate of loss for time, as a greedy knapsack
does. Near a target the rate stops being the question: when some moves would reach the next target, the one of them
with the lowest loss is taken if its loss is no higher than the best-rate move's (it then finishes at no more
loss than the step the rate would take, which need not finish; in particular, when the best-rate move itself
reaches the target, the lowest-loss move that reaches it replaces it, so the last step does not overshoot for a
marginally better rate). The search stops when the predicted speed-up (L d + rest) /
(sum of per-layer costs + rest) reaches the last target; the plan of each target is the configuration at the step
that first reached it (targets share one search path).

Racing (as SLEB's fast greedy_search, harness/search/racing.py): with screen_batches < all batches every move is scored on
the first batches, moves clearly worse than the leader by rate (and, on a finishing step, by loss) are dropped and
the rest see twice as many batches, until the survivors are ranked on every batch.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from tqdm.auto import tqdm

from orthorank.harness import distributed as dist
from orthorank.method.cost import closest_count
from orthorank.method.layer import SelectiveLayer
from orthorank.harness.search.checkpoint import Checkpoint, stored_steps
from orthorank.harness.search.layer_search import StackRunner
from orthorank.harness.search.racing import ScoreMemo, race
from orthorank.harness.runtime.cost_table import CostTable, ratio_key
from orthorank.errors import UserError
from orthorank.method.plan import REMOVE
from orthorank.method.selection import SelectionConfig, keep_count

Action = "str | float | None"  # None: kept (dense); a ratio: selection layer; "remove"
Move = tuple  # (layer, new action)
Scorer = Callable[[list[Move], list[int]], dict[Move, dict[int, torch.Tensor]]]  # moves, batches -> window NLLs


@dataclass
class HybridStep:
    layer: int
    before: str | float | None
    after: str | float
    loss: float  # calibration loss after the move
    delta_loss: float
    saved: float  # predicted time saved by the move, as a share of the dense model's
    rate: float  # delta_loss / saved
    speedup: float  # predicted speed-up after the move
    finishing: bool = False  # chosen by the finishing rule (lowest loss among moves that reach the target)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "before": "keep" if self.before is None else self.before,
                "after": self.after, "loss": round(self.loss, 6), "delta_loss": round(self.delta_loss, 6),
                "saved": round(self.saved, 6), "rate": round(self.rate, 6), "speedup": round(self.speedup, 6),
                **({"finishing": True} if self.finishing else {})}


@dataclass
class HybridResult:
    steps: list[HybridStep]
    dense_loss: float
    seconds: float
    evaluations: int
    plans: dict[float, dict[int, str | float]] = field(default_factory=dict)  # target -> actions
    reached: dict[float, int] = field(default_factory=dict)  # target -> steps taken when reached


def _fmt(action) -> str:
    return "keep" if action is None else action if action == REMOVE else f"select {ratio_key(action)}"


def _sort_key(move: Move) -> tuple:
    layer, action = move
    return (layer, 0.0 if action == REMOVE else 1.0 + float(action))


def moves_from(actions: dict[int, str | float], candidates: list[int], ratios: list[float],
               table: CostTable, remove: bool = True) -> list[Move]:
    """Every move that makes one candidate layer cheaper on the cost table (without removals when not `remove`:
    the per-layer-ratio search)."""
    out = []
    for i in candidates:
        now = actions.get(i)
        if now == REMOVE:
            continue
        cost = table.layer_cost(now)
        for r in ratios:
            if (now is None or r < float(now)) and table.layer_cost(r) < cost:
                out.append((i, r))
        if remove:
            out.append((i, REMOVE))
    return sorted(out, key=_sort_key)


def check_targets(targets: list[float], table: CostTable, candidates: list[int], ratios: list[float] | None = None,
                  remove: bool = True) -> list[float]:
    if not targets:
        raise UserError("give at least one --target-speedup")
    if remove:
        best, how = table.max_speedup(candidates), "removing every one"
    else:
        r = min(ratios)
        best, how = table.predicted_speedup({i: r for i in candidates}), f"selection at ratio {r:g} in every one"
    for t in targets:
        if not t > 1.0:
            raise UserError(f"--target-speedup must be above 1 (1 is the dense model), got {t:g}")
        if t > best + 1e-12:
            raise UserError(f"target {t:g} is out of reach: {how} of the {len(candidates)} layers the search may "
                            f"change gives {best:.3f}x on {table.source}")
    return sorted(set(targets))


def match_exactly(actions: dict[int, str | float], layer: int, target: float, table) -> dict[int, str | float]:
    """Raise the keep ratio of `layer` (the search's last move, which overshot `target`) until the plan's predicted
    speed-up on a FLOP table is as close to `target` as a whole number of kept tokens allows. Only the last move
    is changed: the layers and the other ratios stay the search's choice, and the layer keeps at least what the
    move gave it."""
    T = table.seq_len
    now = actions[layer]
    if now == REMOVE:
        return dict(actions)

    def speedup(k: int) -> float:
        return table.predicted_speedup({**actions, layer: k / T})

    lo = keep_count(T, float(now))
    if speedup(lo) <= target:
        return dict(actions)
    # speedup(T) < target: keeping every token costs more than the layer did before the move that reached it
    return {**actions, layer: closest_count(speedup, lo, T, target) / T}


def hybrid_search(runner: StackRunner, table: CostTable, targets: list[float], ratios: list[float],
                  candidates: list[int], selection: SelectionConfig | None = None, progress: bool = True,
                  screen_batches: int | None = None, recheck: int = 3,
                  log: Callable[[str], None] | None = None,
                  on_reached: Callable[[float, HybridResult], None] | None = None,
                  checkpoint=None, remove: bool = True) -> HybridResult:
    """The greedy search above; `on_reached(target, result)` is called as each target is reached. With a
    `checkpoint` (harness/search/checkpoint.py) every step is stored as it is taken and the stored steps of an earlier,
    interrupted run are replayed first (their targets reported again through `on_reached`)."""
    start_t = time.perf_counter()
    checkpoint = checkpoint or Checkpoint(None)
    base = selection or SelectionConfig()
    targets = _checked_targets(runner, table, targets, ratios, candidates, remove)
    dense_cost = table.model_cost({})
    result, actions, config, pending, loss = _start_or_resume(runner, base, targets, checkpoint, log, on_reached)
    steps = result.steps
    n_batches = len(runner.batches)
    screen = n_batches if screen_batches is None else max(1, min(screen_batches, n_batches))
    bar = tqdm(total=None, desc="hybrid search", disable=not progress or not dist.is_main(), leave=True,
               unit="step")
    score = _move_scorer(runner, base, config)
    while pending:
        moves = moves_from(actions, candidates, ratios, table, remove)
        if not moves:  # cannot happen after check_targets; kept as a guard
            raise UserError(f"no move left before reaching {pending[0]:g}x")
        saved, speed = _savings(table, actions, moves, dense_cost)
        pick, finishing = _pick_move(runner, config, score, moves, saved, speed, pending[0], screen, recheck)
        layer, after = pick
        before = actions.get(layer)
        actions[layer] = after
        config[layer] = _move_module(runner, base, pick)
        new_loss = runner.cache(config, layer)
        sp = table.predicted_speedup(actions)
        steps.append(HybridStep(layer, before, after, new_loss, new_loss - loss, saved[pick],
                                (new_loss - loss) / saved[pick], sp, finishing))
        checkpoint.put(len(steps), {**dataclasses.asdict(steps[-1]), "evaluations": runner.evaluations})
        loss = new_loss
        bar.update(1)
        bar.set_postfix(move=f"{layer}:{_fmt(before)}->{_fmt(after)}", loss=f"{loss:.4f}",
                        speedup=f"{sp:.3f}")
        if log is not None and dist.is_main():
            log(f"  step {len(steps)}: layer {layer} {_fmt(before)} -> {_fmt(after)}, calibration loss {loss:.4f} "
                f"(+{steps[-1].delta_loss:.4f} for {100 * saved[pick]:.2f}% of the time), predicted speed-up "
                f"{sp:.3f}x{' (finishing move)' if finishing else ''} ({time.perf_counter() - start_t:.0f}s)")
        while pending and sp >= pending[0] - 1e-12:
            t = pending.pop(0)
            result.plans[t] = dict(actions)
            result.reached[t] = len(steps)
            if on_reached is not None:
                result.seconds = time.perf_counter() - start_t
                result.evaluations = runner.evaluations
                on_reached(t, result)
    bar.close()
    result.seconds = time.perf_counter() - start_t
    result.evaluations = runner.evaluations
    return result


def _checked_targets(runner: StackRunner, table: CostTable, targets: list[float], ratios: list[float],
                     candidates: list[int], remove: bool) -> list[float]:
    """The targets, sorted, once the table is known to fit the model and to hold every ratio searched."""
    if table.num_layers != len(runner.layers):
        raise UserError(f"{table.source} is for {table.num_layers} layers, the model has {len(runner.layers)}")
    for r in ratios:
        table.fraction(r)  # every ratio searched must be on the table
    return check_targets(targets, table, candidates, ratios, remove)


def _move_module(runner: StackRunner, base: SelectionConfig, move: Move) -> SelectiveLayer | None:
    """The module a move puts in its layer: None for a removal, else the layer selecting at the move's ratio."""
    layer, action = move
    return None if action == REMOVE else runner.wrap(layer, replace(base, ratio=float(action)))


def _start_or_resume(runner: StackRunner, base: SelectionConfig, targets: list[float], checkpoint: Checkpoint,
                     log: Callable[[str], None] | None,
                     on_reached: Callable[[float, HybridResult], None] | None
                     ) -> tuple[HybridResult, dict[int, str | float], dict, list[float], float]:
    """The search's starting point: the dense model, or the configuration an interrupted run's stored steps reached
    (replayed as they were taken; the targets they reached reported again through `on_reached`). Returns the
    result so far, the actions and layer modules, the targets still pending and the current calibration loss; the
    layer inputs of the starting configuration are cached."""
    done = checkpoint.load()
    actions: dict[int, str | float] = {}
    config: dict = {}
    pending = list(targets)
    replay = stored_steps(done)
    checkpoint.resumed = len(replay)
    if not replay:
        loss = runner.cache(config)
        if 0 not in done:
            checkpoint.put(0, {"dense_loss": loss})
        return HybridResult([], loss, 0.0, 0), actions, config, pending, loss
    steps: list[HybridStep] = []
    reached_now: list[float] = []
    for st in replay:  # an interrupted run's steps, as they were taken
        fields = {k: st[k] for k in ("layer", "before", "after", "loss", "delta_loss", "saved", "rate", "speedup",
                                     "finishing")}
        steps.append(HybridStep(**fields))
        actions[st["layer"]] = st["after"]
        config[st["layer"]] = _move_module(runner, base, (st["layer"], st["after"]))
        runner.evaluations = st["evaluations"]
        while pending and st["speedup"] >= pending[0] - 1e-12:
            reached_now.append(pending.pop(0))
    result = HybridResult(steps, done[0]["dense_loss"], 0.0, 0)
    loss = runner.cache(config)  # the cached layer inputs of the replayed configuration
    if log is not None and dist.is_main():
        log(f"  resumed {len(replay)} finished step(s) from {checkpoint.folder}")
    snapshot: dict[int, str | float] = {}
    for k, st in enumerate(steps, 1):
        snapshot[st.layer] = st.after
        for t in [t for t in reached_now if t not in result.plans and st.speedup >= t - 1e-12]:
            result.plans[t] = dict(snapshot)
            result.reached[t] = k
            if on_reached is not None:
                result.evaluations = runner.evaluations
                on_reached(t, result)
    return result, actions, config, pending, loss


def _move_scorer(runner: StackRunner, base: SelectionConfig, config: dict) -> Scorer:
    """The race's scoring: per-window losses of each move on top of `config` (read at call time, so it follows the
    search's steps), the moves split across ranks and gathered on every rank."""

    def score(moves: list[Move], batches: list[int]) -> dict[Move, dict[int, torch.Tensor]]:
        mine = {m: runner.window_losses({**config, m[0]: _move_module(runner, base, m)}, m[0], batches)
                for m in dist.shard(moves)}
        runner.evaluations += len(moves)
        merged: dict[Move, dict[int, torch.Tensor]] = {}
        for part in dist.all_gather(mine):
            merged.update(part)
        return merged

    return score


def _savings(table: CostTable, actions: dict[int, str | float], moves: list[Move],
             dense_cost: float) -> tuple[dict[Move, float], dict[Move, float]]:
    """Each move's predicted time saved (a share of the dense model's) and the predicted speed-up after it."""
    now_cost = table.model_cost(actions)
    saved = {m: (table.layer_cost(actions.get(m[0])) - table.layer_cost(m[1])) / dense_cost for m in moves}
    speed = {m: dense_cost / (now_cost - saved[m] * dense_cost) for m in moves}
    return saved, speed


def _pick_move(runner: StackRunner, config: dict, score: Scorer, moves: list[Move], saved: dict[Move, float],
               speed: dict[Move, float], target: float, screen: int, recheck: int) -> tuple[Move, bool]:
    """One step's move and whether the finishing rule chose it: the best rate of loss for time saved (raced), unless
    a move that reaches `target` finishes at no more loss (see the module docstring)."""
    n_batches = len(runner.batches)
    # The current configuration's per-window NLL (the head on the cached final states: no layer re-runs).
    base_w = torch.cat([w.double() for w in runner.window_losses(config, len(runner.layers),
                                                                 range(n_batches)).values()])
    scored = ScoreMemo(score)

    def full_loss(m: Move) -> float:
        return float(sum(scored([m], list(range(n_batches)))[m].values()).sum()) / runner.tokens

    tie = lambda m: (-saved[m], *_sort_key(m))  # noqa: E731
    rates = race(moves, scored, n_batches, screen, recheck, tie,
                 value=lambda m, w: (w - base_w[:w.numel()]) / saved[m])
    pick = min(rates, key=lambda m: (rates[m], *tie(m)))
    reach = [m for m in moves if speed[m] >= target - 1e-12]
    if reach:
        losses = race(reach, scored, n_batches, screen, recheck, tie)
        fin = min(losses, key=lambda m: (losses[m], *tie(m)))
        if full_loss(fin) <= full_loss(pick) + 1e-12:
            return fin, True
    return pick, False
