"""One registry of method names, read by every command (calibrate, compare, ppl, zeroshot, bench, frontier) and the
study.

A method says what kind of plan it makes (its plan kind, method/kinds/: dense, token selection, layer removal, hybrid
or local attention), how its layers are found (a calibration search whose saved plans it reads, a schedule of
method/schedules.py, or evenly spread for speed measurements), how many layers a sparsity takes, and which commands
run it by default. Adding a method is adding an entry here; adding a kind of plan is a module in method/kinds/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from orthorank.errors import UserError
from orthorank.method.cost import Arch
from orthorank.method.kinds import PlanKind, get_kind
from orthorank.method.plan import DEFAULT_COST_SEQ_LEN, layers_for_sparsity


@dataclass(frozen=True)
class Method:
    name: str
    plan_kind: str  # a kind of method/kinds/: "dense", "orthorank", "prune", "hybrid" or "local"
    reference: str
    search: str | None = None  # key in search.registry.SEARCHES: the calibration search that finds the layers
    match: str = "compute"  # rule against pruning: "compute" (FLOPs), "speed" (measured) or "nominal" (the paper's)
    # "plan" (saved plan from the search), "schedule" (method/schedules.py, from depth alone), "spread" (evenly
    # spread: speed only), "none"
    layers: str = "plan"
    # the paper's method as run here (compute-matched OrthoRank): the row the paper's claim pairs with every layer
    # pruning row, the rule the other selection policies are measured against, what takes the paper's ablations
    paper: bool = False
    baseline: bool = False  # the pruning method every other is paired with (compare's worst-domain ratios: "vs SLEB")
    # compare also pairs its rows with these methods' rows at its level: what one step of its making adds (the router
    # on the layers searched under it against the router on OrthoRank's layers)
    paired_with: tuple[str, ...] = ()
    # beyond the paper and compared, at its level, with every pruning method and the paper's rule (compare's pairs)
    against_all: bool = False

    @property
    def kind(self) -> PlanKind:
        return get_kind(self.plan_kind)

    @property
    def ablations(self) -> bool:
        """compare --ablations adds the paper's ablation rows (random, inverse, raw, no K/V) to it: the paper's
        method."""
        return self.paper

    @property
    def plan_label(self) -> str:
        """The file-name label of its saved plans: plans/<model>/<label>-<sparsity>.json."""
        return self.name

    def layer_count(self, sparsity: float, num_layers: int, ratio: float, arch: Arch | None = None,
                    seq_len: int = DEFAULT_COST_SEQ_LEN) -> int:
        if self.kind.dense:
            return 0
        if self.kind.removes and self.kind.selects:
            raise UserError("a hybrid plan's layers come from its search under a cost table, not from a count")
        return layers_for_sparsity(sparsity, num_layers, self.plan_kind, ratio, match=self.match, arch=arch,
                                   seq_len=seq_len)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("dense", "dense", "the unchanged model", layers="none"),
    Method("orthorank", "orthorank", "Shin et al. 2025 (SLEB-style greedy layer choice), compute-matched",
           search="orthorank", paper=True),
    Method("orthorank-nominal", "orthorank", "Shin et al. 2025, layer count by the paper's nominal sparsity",
           search="orthorank", match="nominal"),
    Method("orthorank-speed", "orthorank", "Shin et al. 2025, keep ratio matched to pruning's measured prefill "
           "speed-up on this machine", search="orthorank", match="speed"),
    Method("sleb", "prune", "Song et al. 2024 (greedy block removal)", search="sleb", baseline=True),
    Method("shortened-ppl", "prune", "Kim et al. 2024 (one-shot PPL criterion)", search="shortened-ppl"),
    Method("shortgpt", "prune", "Men et al. 2024 (Block Influence)", search="shortgpt"),
    # Hybrid: per layer remove / select at a ratio / keep, searched under a measured cost table
    # (`calibrate --method hybrid --cost-table FILE --target-speedup X`). Its saved plans hybrid-<s>.json target the
    # predicted speed-up of removing ceil(s L) layers; `bench` times them (removals, a keep ratio per layer).
    Method("hybrid", "hybrid", "this project: greedy remove / select / keep per layer at a measured speed-up target",
           search="hybrid", against_all=True),
    # Per-layer keep ratios: the hybrid search without removals, on the FLOP cost model, to pruning's compute at
    # each level, the last move's ratio then set so that the compute matches exactly (`calibrate --method
    # orthorank-ratios --sparsity S`; any --policy).
    Method("orthorank-ratios", "hybrid", "this project: OrthoRank with its own keep ratio per layer, greedy over "
           "(layer, ratio) at exactly pruning's compute", search="orthorank-ratios"),
    # The router policy on a plan's selection layers (`orthorank fit-router --plan plans/<model>/orthorank-<s>.json
    # --out plans/<model>/router-<s>.json`): OrthoRank's layers, a fitted score instead of the sink rule, the keep
    # ratio re-matched so that compute, the router's FLOPs included, equals pruning's.
    Method("router", "orthorank", "this project: a linear router fitted on calibration text chooses the tokens, "
           "compute-matched", against_all=True),
    # The router on a hybrid plan's selection layers (`fit-router --plan plans/<model>/hybrid-<s>.json
    # --match-compute-of plans/<model>/sleb-<s>.json --out plans/<model>/router-hybrid-<s>.json`): the hybrid
    # search's removals and selection layers, each selection layer's kept tokens shifted so that compute, the
    # router's FLOPs included, equals SLEB's exactly.
    # Plans searched under the router (`fit-router --layers inner` fits a bank on the dense model, `calibrate --method
    # orthorank --policy router --router BANK` runs the greedy layer search with it, `fit-router` on the plan found
    # refits the router on its own layers, compute-matched to SLEB): the layers that suit the router, not the sink rule.
    Method("router-searched", "orthorank", "this project: the greedy layer search run under a router bank, the router "
           "refitted on the layers found, compute-matched", paired_with=("router",), against_all=True),
    Method("router-hybrid", "hybrid", "this project: a hybrid plan's removals, with a fitted router choosing the "
           "tokens in its selection layers, compute-matched", against_all=True),
    # Causal routers (issue 58: `orthorank fit-thresholds --plan plans/<model>/router-searched-<s>.json --out
    # plans/<model>/router-searched-causal-<s>.json`): the router plan with a threshold per layer fitted on
    # calibration text to its keep ratio, deciding each token from its own score in prefill and decoding alike, so
    # decoding skips layers per generated token and a teacher-forced forward makes the decisions decoding makes.
    Method("router-causal", "orthorank", "this project: the router plan deciding each token by a fitted threshold, "
           "in prefill and decoding alike", paired_with=("router",), against_all=True),
    Method("router-searched-causal", "orthorank", "this project: the router on the layers searched under it, "
           "deciding each token by a fitted threshold in prefill and decoding alike", paired_with=("router-searched",),
           against_all=True),
    Method("spread-orthorank", "orthorank", "token selection in evenly spread layers (speed measurements)",
           layers="spread"),
    Method("spread-prune", "prune", "removal of evenly spread layers (speed measurements)", layers="spread"),
    Method("spread-hybrid", "hybrid", "half of removal's layers removed, selection in evenly spread others to match "
           "its compute (speed measurements)", layers="spread"),
    # Schedules (method/schedules.py): the plan follows from depth alone at a compute target, no search.
    Method("depth", "hybrid", "this project: OrthoRank in the later layers only, one keep ratio for the target",
           layers="schedule"),
    Method("progressive", "hybrid", "Fu et al. 2024 (LazyLLM-style): fewer tokens in every later layer, pruned keys",
           layers="schedule"),
    Method("local", "local", "this project: local prefill attention in the later full-attention layers, the prompt's "
           "head and tail global", layers="schedule"),
)}

# What each command runs when --methods is not given (the typed options' defaults read these).
DEFAULT_METHODS: dict[str, tuple[str, ...]] = {
    "compare": ("dense", "sleb", "shortened-ppl", "shortgpt", "orthorank"),
    "longctx": ("dense", "sleb", "orthorank"),
    "frontier": ("dense", "sleb", "shortgpt", "orthorank", "depth", "progressive", "local"),
    "bench": ("dense", "spread-prune", "spread-orthorank"),
}


def default_methods(command: str) -> str:
    """A command's default --methods, comma-separated as it is written on a command line."""
    return ",".join(DEFAULT_METHODS[command])


def names(where: Callable[[Method], bool] = lambda m: True) -> list[str]:
    return [n for n, m in METHODS.items() if where(m)]


def searched() -> list[str]:
    """Methods whose layers come from a calibration search (they have saved plans)."""
    return names(lambda m: m.search is not None)


def saved() -> list[str]:
    """Methods with saved plans (plans/<model>/<name>-<sparsity>.json): the searched ones and the routers fitted on
    them; what commands that apply a plan by --method and --sparsity accept."""
    return names(lambda m: m.layers == "plan" and not m.kind.dense)


def compared() -> list[str]:
    """Methods `compare` evaluates by name: those with saved plans matched to pruning's compute (--match adds the
    nominal and speed-matched OrthoRank rows)."""
    return names(lambda m: m.layers == "plan" and not m.kind.dense and m.match == "compute")


def benched() -> list[str]:
    """Methods `bench` times: every one with layers of its own (a schedule's plan needs a model's text to choose)."""
    return names(lambda m: m.layers != "schedule")


def scheduled() -> list[str]:
    """Methods whose plans follow from a schedule (method/schedules.py) at each level."""
    return names(lambda m: m.layers == "schedule")


def is_reference(name: str) -> bool:
    """Whether a result row of this method is the dense reference the others are compared with."""
    return name in METHODS and METHODS[name].kind.dense


def is_paper(name: str) -> bool:
    """Whether a result row of this method is the paper's method as run here (its own rule, compute-matched)."""
    return name in METHODS and METHODS[name].paper


def is_baseline(name: str) -> bool:
    """Whether a result row of this method is the pruning baseline every other method is paired with."""
    return name in METHODS and METHODS[name].baseline


def baseline() -> str:
    """The pruning baseline's method name (SLEB): the row whose worst-domain ratios compare reads."""
    return next(n for n, m in METHODS.items() if m.baseline)


def get_method(name: str, allowed: list[str] | None = None) -> Method:
    choices = allowed if allowed is not None else list(METHODS)
    if name not in choices:
        raise UserError(f"unknown method {name!r}; choose one of {', '.join(choices)}")
    return METHODS[name]
