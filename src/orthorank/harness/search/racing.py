"""Racing: choose the candidate with the lowest calibration loss without scoring every candidate on every window.

Exhaustive greedy scores each of ~30 candidates on all calibration windows, so a step's cost grows with the
calibration size. Racing (Maron & Moore's Hoeffding races, here with a paired t-test) scores all candidates on a
first chunk of windows, drops those that are worse than the current leader beyond doubt, and doubles the chunk for
the rest until every window is seen. Candidates are compared *paired* per window (the same text under two
configurations), which removes the large window-to-window variance of the loss: a layer that is clearly worse is
dropped after 8 windows, and only the contenders pay for the whole set. The survivors are ranked on every window,
exactly as exhaustive greedy ranks them, so the choice differs from exhaustive greedy only if the true best was
dropped: a one-sided test at ALPHA per comparison, at most a few comparisons of the true best per step.
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, Sequence, TypeVar

import torch

K = TypeVar("K", bound=Hashable)

ALPHA = 0.001  # one-sided level at which a candidate is judged worse than the leader
# Student t quantiles at 1 - ALPHA for 1..30 degrees of freedom; beyond, the Cornish-Fisher expansion (error < 1e-3).
_T_999 = (318.309, 22.327, 10.215, 7.173, 5.893, 5.208, 4.785, 4.501, 4.297, 4.144, 4.025, 3.930, 3.852, 3.787,
          3.733, 3.686, 3.646, 3.610, 3.579, 3.552, 3.527, 3.505, 3.485, 3.467, 3.450, 3.435, 3.421, 3.408, 3.396,
          3.385)
_Z_999 = 3.090232


def t_quantile(df: int) -> float:
    """The 1 - ALPHA quantile of Student's t with `df` degrees of freedom."""
    if df < 1:
        return math.inf
    if df <= len(_T_999):
        return _T_999[df - 1]
    z = _Z_999
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df * df)


def clearly_worse(diff: torch.Tensor) -> bool:
    """diff: per-window loss of a candidate minus the leader's ([windows]). True when its mean is above 0 by more
    than the t quantile times its standard error (paired one-sided t-test at ALPHA)."""
    n = diff.numel()
    if n < 2:
        return False
    mean = float(diff.mean())
    se = float(diff.std(unbiased=True)) / math.sqrt(n)
    if se == 0.0:
        return mean > 0.0
    return mean > t_quantile(n - 1) * se


Scores = dict[K, dict[int, torch.Tensor]]  # candidate -> batch -> per-window summed NLL [windows]


class ScoreMemo:
    """Remembers what was scored, so two races over overlapping candidates (the hybrid search's rate race and its
    finishing race) never score a (candidate, batch) twice."""

    def __init__(self, score: Callable[[list[K], list[int]], Scores]) -> None:
        self._score = score
        self.known: Scores = {}

    def __call__(self, cands: list[K], batches: list[int]) -> Scores:
        need = [c for c in cands if any(b not in self.known.get(c, {}) for b in batches)]
        if need:
            todo = sorted({b for c in need for b in batches if b not in self.known.get(c, {})})
            for c, per_batch in self._score(need, todo).items():
                self.known.setdefault(c, {}).update(per_batch)
        return {c: {b: self.known[c][b] for b in batches} for c in cands}


def race(candidates: Sequence[K], score: Callable[[list[K], list[int]], Scores], n_batches: int, first: int,
         keep: int = 3, tie: Callable[[K], tuple] = lambda c: (c,),
         value: Callable[[K, torch.Tensor], torch.Tensor] | None = None,
         trace: list[tuple[int, int]] | None = None) -> dict[K, float]:
    """Race `candidates` over calibration batches 0..n_batches-1.

    score(cands, batches) -> {cand: {batch: per-window summed NLL [windows]}}. Batches are scored in chunks
    (first, then doubling); after each chunk every candidate clearly worse than the leader (lowest total so far,
    paired per window) is dropped, never leaving fewer than `keep` (the best by total so far). `value` maps a
    candidate's per-window NLL (windows of batches 0.. in order) to what is minimized (default: the NLL itself).
    Returns each survivor's value summed over every window (a lone winner's over the windows it was scored on):
    min(..., key=(value, tie)) is exhaustive greedy's choice unless the race dropped it. `trace` (if given) gets (batches seen, candidates scored on them) per chunk."""
    value = value or (lambda c, w: w)
    nll: dict[K, list[torch.Tensor]] = {c: [] for c in candidates}
    alive = list(candidates)
    seen = 0
    chunk_end = max(1, min(first, n_batches))
    while True:
        got = score(alive, list(range(seen, chunk_end)))
        if trace is not None:
            trace.append((chunk_end, len(alive)))
        for c in alive:
            nll[c] += [got[c][b].reshape(-1).double() for b in range(seen, chunk_end)]
        seen = chunk_end
        values = {c: value(c, torch.cat(nll[c])) for c in alive}
        if seen >= n_batches:
            return {c: float(values[c].sum()) for c in alive}
        ranked = sorted(alive, key=lambda c: (float(values[c].sum()), *tie(c)))
        leader = values[ranked[0]]
        alive = ranked[:keep] + [c for c in ranked[keep:] if not clearly_worse(values[c] - leader)]
        if len(alive) == 1:  # the winner: no other candidate needs more windows (its full loss is the caller's)
            return {alive[0]: float(values[alive[0]].sum())}
        chunk_end = min(n_batches, 2 * seen)
