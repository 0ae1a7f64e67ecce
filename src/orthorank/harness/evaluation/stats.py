"""Uncertainty of sampled numbers: bootstrap intervals over windows and items, paired comparisons.

Perplexity is exp(total NLL / total tokens) over a sample of windows; its uncertainty comes from which windows
were drawn, so windows are resampled with replacement (percentile bootstrap). Two methods scored on the same
windows are compared by resampling the same indices for both (paired), which removes the spread that the
windows' own difficulty adds to both. Zero-shot accuracies work the same way over items.

Every function is deterministic for a seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_ITERS = 10_000
DEFAULT_LEVEL = 0.95


MIN_SAMPLE = 2  # below this a bootstrap interval is a point, which claims a certainty the sample does not have


@dataclass(frozen=True)
class Interval:
    value: float
    low: float  # NaN where the sample is too small for an interval (n < MIN_SAMPLE)
    high: float
    level: float = DEFAULT_LEVEL
    n: int | None = None  # windows or items it comes from (the smallest domain's, for a worst-domain ratio)

    @property
    def known(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    def excludes(self, null: float) -> bool:
        """True when the interval lies entirely on one side of `null` (a difference the sample supports); never
        for an unknown interval."""
        return self.known and (self.low > null or self.high < null)

    def text(self, fmt: str = ".2f", scale: float = 1.0, unit: str = "window") -> str:
        """'36.63 [32.12, 42.32]', or '73.41 [n/a: 1 window]' where the sample is too small for an interval."""
        v = format(scale * self.value, fmt)
        if not self.known:
            if self.n is None:
                return f"{v} [n/a]"
            return f"{v} [n/a: {self.n} {unit}{'' if self.n == 1 else 's'}]"
        return f"{v} [{format(scale * self.low, fmt)}, {format(scale * self.high, fmt)}]"

    def to_dict(self) -> dict[str, float]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _interval(value: float, draws: np.ndarray, level: float, n: int) -> Interval:
    if n < MIN_SAMPLE:
        return Interval(value, math.nan, math.nan, level, n)
    return Interval(value, *_percentiles(draws, level), level, n)


def resample_indices(n: int, iters: int = DEFAULT_ITERS, seed: int = 0) -> np.ndarray:
    """[iters, n] indices drawn with replacement; the same seed gives the same draws for every method compared."""
    if n < 1:
        raise ValueError("cannot resample an empty sample")
    return np.random.default_rng(seed).integers(0, n, size=(iters, n))


def _percentiles(draws: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(draws, [alpha, 1.0 - alpha])
    return float(low), float(high)


def perplexity_interval(nll: np.ndarray | list[float], tokens: np.ndarray | list[int] | int, *,
                        iters: int = DEFAULT_ITERS, seed: int = 0, level: float = DEFAULT_LEVEL) -> Interval:
    """nll: summed NLL per window; tokens: predicted tokens per window (or one count for all)."""
    nll = np.asarray(nll, dtype=np.float64)
    tok = np.broadcast_to(np.asarray(tokens, dtype=np.float64), nll.shape)
    value = math.exp(nll.sum() / tok.sum())
    idx = resample_indices(nll.size, iters, seed)
    draws = np.exp(nll[idx].sum(1) / tok[idx].sum(1))
    return _interval(value, draws, level, nll.size)


def paired_perplexity_ratio(nll_a, nll_b, tokens, *, iters: int = DEFAULT_ITERS, seed: int = 0,
                            level: float = DEFAULT_LEVEL) -> Interval:
    """ppl(a) / ppl(b) on the same windows, with a paired bootstrap interval (same resampled windows for both)."""
    a = np.asarray(nll_a, dtype=np.float64)
    b = np.asarray(nll_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired comparison needs the same windows: {a.shape} vs {b.shape}")
    tok = np.broadcast_to(np.asarray(tokens, dtype=np.float64), a.shape)
    value = math.exp((a.sum() - b.sum()) / tok.sum())
    idx = resample_indices(a.size, iters, seed)
    draws = np.exp((a[idx].sum(1) - b[idx].sum(1)) / tok[idx].sum(1))
    return _interval(value, draws, level, a.size)


def mean_stderr(outcomes) -> float:
    """Standard error of a mean of per-item outcomes (sample standard deviation / sqrt(n), as the harness)."""
    x = np.asarray(outcomes, dtype=np.float64)
    if x.size < 2:
        return float("nan")
    return float(x.std(ddof=1) / math.sqrt(x.size))


def accuracy_interval(outcomes, *, iters: int = DEFAULT_ITERS, seed: int = 0,
                      level: float = DEFAULT_LEVEL) -> Interval:
    x = np.asarray(outcomes, dtype=np.float64)
    idx = resample_indices(x.size, iters, seed)
    return _interval(float(x.mean()), x[idx].mean(1), level, x.size)


def paired_difference(a, b, *, iters: int = DEFAULT_ITERS, seed: int = 0, level: float = DEFAULT_LEVEL) -> Interval:
    """mean(a) - mean(b) over the same items, with a paired bootstrap interval."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired comparison needs the same items: {a.shape} vs {b.shape}")
    d = a - b
    idx = resample_indices(d.size, iters, seed)
    return _interval(float(d.mean()), d[idx].mean(1), level, d.size)


def paired_time_ratio(times_ref, times_row, *, iters: int = DEFAULT_ITERS, seed: int = 0,
                      level: float = DEFAULT_LEVEL) -> Interval:
    """Speed-up of a row over a reference timed in the same interleaved rounds: the median over rounds of
    reference time / row time, with a bootstrap interval over rounds (above 1: the row is faster)."""
    a = np.asarray(times_ref, dtype=np.float64)
    b = np.asarray(times_row, dtype=np.float64)
    k = min(a.size, b.size)
    ratio = a[:k] / b[:k]
    idx = resample_indices(k, iters, seed)
    return _interval(float(np.median(ratio)), np.median(ratio[idx], axis=1), level, k)


def worst_ratio(pairs: list[tuple], *, iters: int = DEFAULT_ITERS, seed: int = 0,
                level: float = DEFAULT_LEVEL) -> tuple[Interval, int]:
    """The largest of several paired perplexity ratios ppl(a) / ppl(b), one per domain, and which domain it is.

    pairs: [(nll_a, nll_b, tokens)] per domain, each paired over that domain's windows. The interval is of the
    maximum itself: every bootstrap draw resamples each domain's windows (independently across domains, as their
    windows are) and takes the largest ratio, so it accounts for picking the worst of several noisy ratios."""
    if not pairs:
        raise ValueError("no domains to take the worst of")
    values, draws, sizes = [], [], []
    for k, (a, b, tokens) in enumerate(pairs):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        tok = np.broadcast_to(np.asarray(tokens, dtype=np.float64), a.shape)
        values.append(math.exp((a.sum() - b.sum()) / tok.sum()))
        sizes.append(a.size)
        idx = resample_indices(a.size, iters, seed + k)
        draws.append(np.exp((a[idx].sum(1) - b[idx].sum(1)) / tok[idx].sum(1)))
    worst = int(np.argmax(values))
    return _interval(values[worst], np.max(np.stack(draws), axis=0), level, min(sizes)), worst


def headroom_share(nll_rule, nll_random, nll_oracle, tokens, *, iters: int = DEFAULT_ITERS, seed: int = 0,
                   level: float = DEFAULT_LEVEL) -> Interval:
    """The share of the oracle's headroom over random selection that a rule captures, on the same windows:
    (ppl_random - ppl_rule) / (ppl_random - ppl_oracle), with a paired bootstrap interval (the same resampled
    windows for all three). 1 = as good as the oracle, 0 = no better than random, < 0 = worse than random. A draw
    where the oracle is no better than random has no headroom to share and is left out (NaN when every draw is)."""
    r, a, o = (np.asarray(x, dtype=np.float64) for x in (nll_rule, nll_random, nll_oracle))
    if not (r.shape == a.shape == o.shape):
        raise ValueError(f"headroom needs the same windows: {r.shape}, {a.shape}, {o.shape}")
    tok = np.broadcast_to(np.asarray(tokens, dtype=np.float64), r.shape)

    def share(rs, as_, os_, ts):
        p_rule, p_rand, p_orc = np.exp(rs / ts), np.exp(as_ / ts), np.exp(os_ / ts)
        gap = p_rand - p_orc
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(gap > 0, (p_rand - p_rule) / gap, np.nan)

    value = float(share(r.sum(), a.sum(), o.sum(), tok.sum()))
    idx = resample_indices(r.size, iters, seed)
    draws = share(r[idx].sum(1), a[idx].sum(1), o[idx].sum(1), tok[idx].sum(1))
    draws = draws[~np.isnan(draws)]
    if draws.size == 0 or math.isnan(value):
        return Interval(value, math.nan, math.nan, level, r.size)
    return _interval(value, draws, level, r.size)


def worst_ratio_scores(candidates: dict[str, list[list[tuple]]], *, iters: int = DEFAULT_ITERS,
                       seed: int = 0) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Score candidates that are judged on the same windows: per candidate, the geometric mean over its groups of
    each group's worst-domain ratio (largest ppl(a) / ppl(reference) over domains), with bootstrap draws.

    candidates: {name: [group: [(nll_a, nll_ref, tokens) per domain, in the same domain order for every group and
    candidate]]}. Every draw resamples each domain's windows once and applies the same indices to every group of
    every candidate (they share the windows), so the draws of two candidates are paired: the ratio of their draws
    is the bootstrap distribution of the ratio of their scores. Returns (points, draws[iters])."""
    names = list(candidates)
    if not names or not all(candidates[n] for n in names):
        raise ValueError("every candidate needs at least one group")
    first = candidates[names[0]][0]
    idx = [resample_indices(np.asarray(a).size, iters, seed + k) for k, (a, _, _) in enumerate(first)]
    points, draws = {}, {}
    for name in names:
        logs, log_draws = [], []
        for group in candidates[name]:
            if len(group) != len(idx):
                raise ValueError(f"{name}: {len(group)} domains, expected {len(idx)}")
            values, per_domain = [], []
            for (a, b, tokens), ix in zip(group, idx):
                a = np.asarray(a, dtype=np.float64)
                b = np.asarray(b, dtype=np.float64)
                tok = np.broadcast_to(np.asarray(tokens, dtype=np.float64), a.shape)
                if a.shape != b.shape or a.size != ix.shape[1]:
                    raise ValueError(f"{name}: scored on other windows ({a.shape} vs {b.shape}, {ix.shape[1]})")
                values.append((a.sum() - b.sum()) / tok.sum())
                per_domain.append((a[ix].sum(1) - b[ix].sum(1)) / tok[ix].sum(1))
            logs.append(max(values))
            log_draws.append(np.max(np.stack(per_domain), axis=0))
        points[name] = math.exp(float(np.mean(logs)))
        draws[name] = np.exp(np.mean(np.stack(log_draws), axis=0))
    return points, draws


def draw_ratio(value: float, draws_a: np.ndarray, draws_b: np.ndarray, n: int,
               level: float = DEFAULT_LEVEL) -> Interval:
    """The interval of a ratio of two paired bootstrap quantities from their draws."""
    return _interval(value, draws_a / draws_b, level, n)
