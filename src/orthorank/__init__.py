"""OrthoRank: token selection via sink-token orthogonality (Shin, Oh, Oh, ICML 2025), with layer-pruning baselines.

The library is `orthorank.method` (plans, policies, the selective layer, the cost model) and `orthorank.models`
(loading and per-family adapters); this front door is what most users need:

    import orthorank
    lm = orthorank.load_model("smollm2-135m")
    plan = orthorank.load_plan("plans/smollm2-135m/router-searched-0.2.json")
    orthorank.apply_plan(lm.model, plan)          # in place; orthorank.restore_dense(lm.model) undoes it

`fit_router` fits the router policy for a plan's selection layers on calibration windows. Everything that measures
the method (evaluation, searches, speed, reports, the study and the `orthorank` command) is `orthorank.harness`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orthorank.method import Plan, SelectionConfig, apply_orthorank, apply_plan, prune_layers, restore_dense
from orthorank.models import load_model

__version__ = "0.1.0"
__all__ = ["Plan", "SelectionConfig", "apply_orthorank", "apply_plan", "fit_router", "load_model", "load_plan",
           "prune_layers", "restore_dense"]


def load_plan(path: str | Path) -> Plan:
    """A plan saved by `orthorank calibrate`, `fit-router` or `Plan.save` (checked on load)."""
    return Plan.load(path)


def fit_router(model: Any, plan: Plan, windows: Any, **settings: Any) -> Plan:
    """The plan with a router fitted for its selection layers on calibration `windows` [N, T] token ids (at least
    4; a quarter are held out to choose the target and regularisation). `settings` are those of
    `orthorank.harness.search.router_fit.FitSettings` (targets, alphas, iterations, holdout, batch_size, seed).
    The plan is returned unchanged (the paper's rule) where the router does not beat it on the held-out windows;
    the router's own scoring FLOPs are not re-matched here: compute matching against another plan, and resumable
    fits, are `orthorank fit-router`'s."""
    from orthorank.harness.search import router_fit  # the fit scores with the harness's recording code

    result = router_fit.fit_router(model, plan, windows, router_fit.FitSettings(**settings), calibration={})
    nll = result.report["held_out_nll"]
    return plan if nll["router"] >= nll["orthogonal"] else router_fit.with_router(plan, result.state)
