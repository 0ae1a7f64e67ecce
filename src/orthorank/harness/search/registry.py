"""Calibration searches by name (the `search` of a method in orthorank.method.registry): each turns a step count into
an ordered list of layers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from orthorank.harness.search.hybrid import hybrid_search
from orthorank.harness.search.racing import ALPHA
from orthorank.harness.search.layer_search import SearchResult, StackRunner, block_influence, greedy_search, one_shot_ppl
from orthorank.errors import UserError
from orthorank.method.cost import Arch
from orthorank.method.kinds import PlanKind, get_kind
from orthorank.method.plan import DEFAULT_COST_SEQ_LEN, layers_for_sparsity
from orthorank.method.selection import SelectionConfig


@dataclass(frozen=True)
class SearchMethod:
    name: str
    plan_method: str  # "orthorank" (token selection), "prune" (layer removal) or "hybrid" (an action per layer)
    reference: str
    # layer searches: (runner, steps, selection, progress, **search options) -> SearchResult; per-layer searches:
    # (runner, table, targets, ratios, candidates, selection, **options) -> HybridResult, under a cost table
    run: Callable[..., Any]
    greedy: bool = False  # one step per layer chosen (checkpointed per step); else one-shot scores
    per_layer: bool = False  # a remove / keep-ratio action per layer to predicted speed-ups (`calibrate_hybrid`)
    # per-layer searches: may remove layers (under a measured cost table), or only set keep ratios (on the FLOP count,
    # to pruning's compute exactly)
    removals: bool = True

    @property
    def kind(self) -> PlanKind:
        return get_kind(self.plan_method)

    @property
    def measured_costs(self) -> bool:
        """A measured cost table prices its moves (`calibrate --cost-table FILE`): the per-layer search that may
        remove layers (one that only sets keep ratios prices them on the FLOP count)."""
        return self.per_layer and self.removals

    def settings(self, selection: SelectionConfig, screen: int | None, recheck: int) -> dict:
        """What, besides the model and calibration windows, decides this search's result (its checkpoint key)."""
        out: dict = {}
        if self.kind.one_selection:
            out["selection"] = selection.key_dict()
        if self.greedy:
            out["screen_batches"] = screen
            out["recheck"] = None if screen is None else recheck
            if screen is not None:
                out["race_alpha"] = ALPHA
        return out

    def layer_count(self, sparsity: float, num_layers: int, ratio: float, match: str = "compute",
                    arch: Arch | None = None, seq_len: int = DEFAULT_COST_SEQ_LEN,
                    scoring: float | None = None) -> int:
        return layers_for_sparsity(sparsity, num_layers, self.plan_method, ratio, match=match, arch=arch,
                                   seq_len=seq_len, scoring=scoring)


def _inner(L: int) -> list[int]:
    return list(range(1, L - 1))  # first and last layer are never touched (as in SLEB)


def _orthorank(runner: StackRunner, n: int, sel: SelectionConfig, progress: bool, **opts) -> SearchResult:
    return greedy_search(runner, n, _inner(len(runner.layers)), lambda i: runner.wrap(i, sel), progress,
                         "orthorank search", **opts)


def _sleb(runner: StackRunner, n: int, sel: SelectionConfig, progress: bool, **opts) -> SearchResult:
    return greedy_search(runner, n, _inner(len(runner.layers)), lambda i: None, progress, "sleb search", **opts)


def _shortened(runner: StackRunner, n: int, sel: SelectionConfig, progress: bool, **opts) -> SearchResult:
    return one_shot_ppl(runner, list(range(len(runner.layers))), progress, checkpoint=opts.get("checkpoint"))


def _shortgpt(runner: StackRunner, n: int, sel: SelectionConfig, progress: bool, **opts) -> SearchResult:
    return block_influence(runner)


SEARCH_METHODS: dict[str, SearchMethod] = {
    m.name: m
    for m in (
        SearchMethod("orthorank", "orthorank", "Shin et al. 2025 (SLEB-style greedy layer choice)", _orthorank,
                     greedy=True),
        SearchMethod("sleb", "prune", "Song et al. 2024 (greedy block removal)", _sleb, greedy=True),
        SearchMethod("shortened-ppl", "prune", "Kim et al. 2024 (one-shot PPL criterion)", _shortened),
        SearchMethod("shortgpt", "prune", "Men et al. 2024 (Block Influence)", _shortgpt),
        SearchMethod("hybrid", "hybrid", "this project: greedy remove / select / keep per layer under a cost table",
                     partial(hybrid_search, remove=True), greedy=True, per_layer=True),
        SearchMethod("orthorank-ratios", "hybrid", "this project: OrthoRank's keep ratio per layer, greedy over "
                     "(layer, ratio) at pruning's compute", partial(hybrid_search, remove=False), greedy=True,
                     per_layer=True, removals=False),
    )
}


def get_search(name: str) -> SearchMethod:
    if name not in SEARCH_METHODS:
        raise UserError(f"unknown method {name!r}; choose one of {', '.join(SEARCH_METHODS)}")
    return SEARCH_METHODS[name]
