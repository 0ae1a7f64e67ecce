"""Options of the commands that search and fit plans: `calibrate`, `fit-router`, `fit-thresholds`, `match-speed`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orthorank.harness.api.options.base import Options, finite_float, flag, match_rules, positive_int, token_count
from orthorank.harness.api.options.groups import DataOptions, ModelOptions, OverwriteOptions, SelectionOptions, StoreOptions
from orthorank.method.cost import DEFAULT_COST_SEQ_LEN
from orthorank.method.registry import searched
from orthorank.harness.search.calibration import (
    DEFAULT_CALIB_BATCH,
    DEFAULT_CALIB_DATA,
    DEFAULT_CALIB_SEQ_LEN,
    DEFAULT_CALIB_TOKENS,
)
from orthorank.harness.search.router_fit import DEFAULT_ALPHAS, DEFAULT_TARGETS, TARGETS


@dataclass(kw_only=True)
class CalibrateOptions(ModelOptions, SelectionOptions, DataOptions, StoreOptions, OverwriteOptions):
    command: ClassVar[str] = "calibrate"
    about: ClassVar[str] = "search the layers for a method at a sparsity; write plan files"
    description: ClassVar[str] = ("Greedy (orthorank, sleb) or one-shot (shortened-ppl, shortgpt) layer search on "
                                  "calibration text disjoint from the evaluation text.")
    exclusive: ClassVar[dict[str, bool]] = {"output": True}

    method: str = flag("--method", choices=tuple(searched()),
                       help="orthorank-nominal is orthorank with --match nominal; hybrid needs --cost-table")
    sparsity: str | None = flag("--sparsity", default=None,
                                help="one value or a list, e.g. 0.1,0.2 (greedy runs once); for hybrid: the predicted "
                                     "speed-up of removing ceil(s L) layers on the cost table (default: none; every "
                                     "method needs it, hybrid needs it or --target-speedup)")
    target_speedup: str | None = flag("--target-speedup", default=None,
                                      help="hybrid: predicted prefill speed-up(s) to reach, e.g. 1.1,1.25 (one search, "
                                           "one plan each; default: none, --sparsity names the levels)")
    cost_table: str | None = flag("--cost-table", default=None, metavar="FILE",
                                  help="hybrid: this device's cost table, from `orthorank bench --cost-table FILE` "
                                       "(default: none; --method hybrid needs it)")
    ratios: str | None = flag("--ratios", default=None,
                              help="hybrid: selection ratios the search may use (default: every ratio on the cost "
                                   "table)")
    router: str | None = flag("--router", default=None, metavar="BANK",
                              help="with --policy router: a router bank (`orthorank fit-router --layers inner`) "
                                   "covering every candidate layer; the plans found keep it, refit them on their own "
                                   "layers with fit-router (default: none; --policy router needs it)")
    calib_data: str = flag("--calib-data", default=DEFAULT_CALIB_DATA,
                           help="calibration text: a domain's held-out part (c4, wikitext2, news, code), mix (equal "
                                "tokens of c4, wikitext2, news and code) or mix:A+B, wikitext2-train (hub), or a text "
                                "file (default %(default)s: the source whose plans lose least on their worst "
                                "evaluation domain, docs/transfer.md)")
    calib_samples: int | None = flag("--calib-samples", default=None, type=positive_int,
                                     help="calibration windows of --seq-len (default: --calib-tokens / --seq-len)")
    calib_tokens: int | None = flag("--calib-tokens", default=None, type=token_count,
                                    help="calibration size in tokens, e.g. 8K or 32768 (sets --calib-samples to this "
                                         f"/ --seq-len; default {DEFAULT_CALIB_TOKENS // 1024}K)")
    seq_len: int = flag("--seq-len", default=DEFAULT_CALIB_SEQ_LEN, type=positive_int,
                        help="calibration window length (default %(default)s)")
    batch_size: int = flag("--batch-size", default=DEFAULT_CALIB_BATCH, type=positive_int,
                           help="calibration windows per forward (default %(default)s)")
    match: list[str] = flag("--match", factory=lambda: ["compute"], kind="list", type=match_rules,
                            help="OrthoRank plans for a sparsity: compute (default: the fewest selection layers that "
                                 "reach pruning's compute sparsity at --cost-seq-len, with the keep ratio raised "
                                 "until the two are equal), speed (the same layers, keep ratio set so the measured "
                                 "prefill speed-up equals pruning's on this machine) or nominal (the paper's "
                                 "round(s L / (1 - r)) layers); several comma-separated")
    cost_seq_len: int = flag("--cost-seq-len", default=DEFAULT_COST_SEQ_LEN, type=positive_int,
                             help="sequence length at which compute sparsity is counted (the evaluation length; "
                                  "default %(default)s)")
    screen_fraction: float | None = flag("--screen-fraction", default=None, type=finite_float,
                                         help="greedy searches race: every candidate is scored on this share of the "
                                              "calibration batches first, those clearly worse than the leader (paired "
                                              "t-test per window) are dropped and the rest see twice as many batches, "
                                              "until all are seen (default: the batches of the first 2K tokens; 1 = "
                                              "exhaustive)")
    exhaustive: bool = flag("--exhaustive", default=False, kind="switch",
                            help="score every candidate on every calibration batch")
    recheck: int = flag("--recheck", default=1, type=positive_int,
                        help="a race never drops the best N so far: they are always scored on every batch (default 1: "
                             "only the paired test drops candidates; each kept one costs a pass over every batch)")
    measure_speed: int = flag("--measure-speed", default=5, type=int, metavar="N",
                              help="time one prefill of --cost-seq-len tokens under each plan and dense, N "
                                   "interleaved repeats, and record the measured speed-up in the plan (0: do not "
                                   "time; --match speed needs N >= 3; default %(default)s)")
    out: str | None = flag("--out", default=None, metavar="DIR", deprecated=("--out-dir",), exclusive="output",
                           group="output",
                           help="folder for <method>-<sparsity>.json, one per sparsity (required: --out or --json)")
    json_out: str | None = flag("--json", default=None, metavar="FILE", deprecated=("-o", "--output"),
                                exclusive="output", group="output",
                                help="one plan file, for one sparsity (required: --out or --json)")
    overwrite: bool = flag("--overwrite", default=False, kind="switch", group="output",
                           help="replace existing plan files")


@dataclass(kw_only=True)
class WindowCalibrationOptions(Options):
    """Calibration windows a fit reads (fit-router, fit-thresholds): a quarter of them held out."""

    calib_data: str = flag("--calib-data", default=DEFAULT_CALIB_DATA,
                           help="calibration text: a domain's held-out part (c4, wikitext2, news, code), mix, mix:A+B, "
                                "or a text file (default %(default)s)")
    calib_samples: int = flag("--calib-samples", default=32, type=positive_int,
                              help="calibration windows (default %(default)s; a quarter is held out)")
    seq_len: int = flag("--seq-len", default=512, type=positive_int,
                        help="calibration window length (default %(default)s)")
    batch_size: int = flag("--batch-size", default=4, type=positive_int,
                           help="windows per forward (default %(default)s)")


@dataclass(kw_only=True)
class FitRouterOptions(WindowCalibrationOptions, ModelOptions, DataOptions, StoreOptions, OverwriteOptions):
    command: ClassVar[str] = "fit-router"
    about: ClassVar[str] = "fit the router policy for a plan's selection layers; write a router plan"
    description: ClassVar[str] = (
        "Fit a linear router per selection layer of PLAN on calibration text (never evaluation text), choose its "
        "target and regularisation on held-out calibration windows, and write PLAN's layers with policy router and "
        "the fitted state. An OrthoRank plan's keep ratio is re-matched so that its compute, router included, equals "
        "what the plan was matched to.")
    exclusive: ClassVar[dict[str, bool]] = {"output": True}  # a group, so that the old --out satisfies it too

    plan: str = flag("--plan", help="the plan whose selection layers get a router (orthorank or hybrid)")
    json_out: str | None = flag("--json", default=None, metavar="FILE", deprecated=("--out",), exclusive="output",
                                group="output", help="the router plan file to write (required)")
    targets: str = flag("--targets", default=",".join(DEFAULT_TARGETS),
                        help="candidate targets, the best on held-out windows kept: "
                             + "; ".join(f"{k}: {v}" for k, v in TARGETS.items()) + " (default %(default)s)")
    alphas: str = flag("--alphas", default=",".join(f"{a:g}" for a in DEFAULT_ALPHAS),
                       help="ridge penalties to choose from on held-out windows (default %(default)s)")
    iterations: int = flag("--iterations", default=2, type=positive_int,
                           help="recording passes (the paper's rule selects in the first, the router after; default "
                                "%(default)s)")
    fisher_samples: int = flag("--fisher-samples", default=2, type=positive_int,
                               help="sampled next-token sequences per window for the fisher target (default "
                                    "%(default)s)")
    # a switch, so not named like --ratio (a number everywhere else); --keep-ratio still works for a release
    keep_ratio: bool = flag("--no-rematch", default=False, kind="switch", deprecated=("--keep-ratio",),
                            help="keep the plan's keep ratios as they are (default: re-match an OrthoRank plan's "
                                 "compute with the router's cost)")
    match_compute_of: str | None = flag("--match-compute-of", default=None, metavar="PLAN",
                                        help="set the keep ratios so that the router plan skips exactly this plan's "
                                             "compute (e.g. SLEB's at the same level; default: the compute the plan "
                                             "itself skipped)")
    cost_seq_len: int | None = flag("--cost-seq-len", default=None, type=positive_int,
                                    help="sequence length of the compute match (default: the plan's own cost length)")
    layers: str | None = flag("--layers", default=None, metavar="LIST|inner",
                              help="fit a router bank for these layers instead of the plan's (inner: every layer but "
                                   "the first and last), recorded on the dense model (ratio 1.0), for `calibrate "
                                   "--policy router --router BANK` to search layers under the router; give one "
                                   "--targets (default: the plan's own selection layers)")
    always_route: bool = flag("--always-route", default=False, kind="switch",
                              help="write the router plan even when no router beat the paper's rule on the held-out "
                                   "calibration windows (default: the plan then keeps the paper's rule, re-matched to "
                                   "the same compute)")
    overwrite: bool = flag("--overwrite", default=False, kind="switch", group="output",
                           help="replace --json FILE if it exists")


@dataclass(kw_only=True)
class FitThresholdsOptions(WindowCalibrationOptions, ModelOptions, DataOptions, OverwriteOptions):
    command: ClassVar[str] = "fit-thresholds"
    about: ClassVar[str] = "fit a router plan's thresholds for causal decoding; write a causal plan"
    description: ClassVar[str] = (
        "Make a router plan decide each token from its own score, in prefill and decoding alike: a threshold per "
        "selection layer, set on calibration text (never evaluation text) so that the layer updates the share of "
        "tokens its keep ratio names, the layers fitted in order. The plan written decides causally (its selection's "
        "decode is causal), so a teacher-forced forward (ppl) makes the decisions generation makes (exactly in float32; "
        "in bfloat16 up to the model's own rounding, docs/decode-router.md). The last "
        "quarter of the calibration windows is held out and the shares measured there are recorded.")
    plan: str = flag("--plan", help="the router plan (from `orthorank fit-router`) whose layers get thresholds")
    out: str = flag("--out", metavar="FILE", group="output", help="the causal plan file to write (required)")
    keep: float | None = flag("--keep", default=None, type=finite_float, metavar="SHARE",
                              help="the share of tokens every selection layer updates, in (0, 1] (default: each "
                                   "layer's keep ratio); the plan's keep ratio becomes it, so its compute is counted "
                                   "at it (e.g. to match another plan's measured decode speed)")
    overwrite: bool = flag("--overwrite", default=False, kind="switch", group="output",
                           help="replace --out FILE if it exists")


@dataclass(kw_only=True)
class MatchSpeedOptions(ModelOptions, OverwriteOptions):
    command: ClassVar[str] = "match-speed"
    about: ClassVar[str] = "set a selection plan's keep ratio to another plan's measured prefill speed; write a plan"
    description: ClassVar[str] = (
        "Equal cost as this machine measures it, not as FLOPs count it: the keep ratio of every selection layer of "
        "PLAN (its policy and any fitted router unchanged) is bisected so that PLAN's prefill speed-up over dense "
        "equals REFERENCE's (e.g. SLEB's at the same level), each probe timing dense, the reference and PLAN side by "
        "side on one window of random tokens. Selection layers that run above their FLOP ideal (scoring, gathers, the "
        "selected queries' attention) then pay for it in kept tokens. Time it on a quiet machine: the ratio found is "
        "this machine's.")
    plan: str = flag("--plan", help="the selection plan (orthorank, router or hybrid) whose keep ratio is set")
    to: str = flag("--to", metavar="REFERENCE", help="the plan whose measured speed-up PLAN is matched to")
    seq_len: int = flag("--seq-len", default=1024, type=positive_int,
                        help="tokens of the timed window (default %(default)s)")
    repeats: int = flag("--repeats", default=5, type=positive_int,
                        help="interleaved timing rounds per probe (default %(default)s)")
    max_probes: int = flag("--max-probes", default=8, type=positive_int,
                           help="keep ratios tried at most (default %(default)s)")
    min_ratio: float = flag("--min-ratio", default=0.05, type=finite_float,
                            help="the lowest keep ratio tried (default %(default)s)")
    tolerance: float = flag("--tolerance", default=0.01, type=finite_float,
                            help="stop when the two measured speed-ups differ by no more than this (default "
                                 "%(default)s; the per-round noise is recorded beside it)")
    out: str = flag("--out", metavar="FILE", group="output", help="the plan file to write (required)")
