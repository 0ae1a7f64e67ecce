"""Thresholds for causal decoding (issue 58): a router plan whose selection layers decide each token from its own
score, in prefill and decoding alike, instead of keeping each prompt's top K.

A layer's threshold is set on calibration windows so that it updates the share of tokens its keep ratio names (the
plan's compute, router included, is then the same in expectation as the top-K plan's): the layers are fitted in
order, each on the scores it sees with the layers before it already deciding causally (a later layer's inputs
depend on the earlier layers' decisions), and each forward stops at the layer being fitted. The last quarter of the
windows is held out: the share each layer updated there is reported, as a check that the shares carry to text
the thresholds were not set on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.method.apply import apply_plan, restore_dense, selective
from orthorank.method.plan import Plan
from orthorank.models.adapters import get_adapter


class _Stop(Exception):
    """Raised by the fitted layer once it has scored a batch: nothing after it is needed."""


def causal_plan(plan: Plan, thresholds: dict[int, float], settings: dict | None = None) -> Plan:
    """The router plan deciding causally with these thresholds (a score at or above a layer's updates the token)."""
    sel = plan.selection
    if sel is None or sel.fitted is None:
        raise UserError("causal decoding needs a router plan (policy router, fitted): fit one with "
                        "`orthorank fit-router --plan PLAN` first")
    state = sel.fitted.with_thresholds(thresholds, settings)
    return dataclasses.replace(plan, selection=dataclasses.replace(sel, decode="causal", fitted=state))


def _batches(windows: torch.Tensor, batch_size: int):
    for a in range(0, windows.shape[0], batch_size):
        yield windows[a:a + batch_size]


def _scores_at(model: nn.Module, plan: Plan, layer: int, windows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Every real token's key (minus its router score) at `layer`, on the windows, under `plan`: [n] float32."""
    apply_plan(model, plan)
    sel = selective(get_adapter(model).layers(model)[layer])
    seen: list[torch.Tensor] = []

    def grab(keys: torch.Tensor, valid: torch.Tensor | None) -> None:
        seen.append((keys if valid is None else keys[valid]).float().reshape(-1).cpu())
        raise _Stop

    sel.on_keys = grab
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            for ids in _batches(windows, batch_size):
                try:
                    model(ids.to(device), use_cache=False)
                except _Stop:
                    pass
    finally:
        sel.on_keys = None
        restore_dense(model)
    return torch.cat(seen)


def held_out_shares(model: nn.Module, plan: Plan, windows: torch.Tensor, batch_size: int) -> dict[int, float]:
    """The share of the windows' tokens each selection layer of a causal plan updated."""
    apply_plan(model, plan)
    layers = get_adapter(model).layers(model)
    kept = {i: 0 for i in plan.selection_layers}
    total = 0
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            for ids in _batches(windows, batch_size):
                model(ids.to(device), use_cache=False)
                total += ids.numel()
                for i in kept:
                    keep = selective(layers[i]).last_keep
                    kept[i] += ids.numel() if keep is None else int(keep.sum())
    finally:
        restore_dense(model)
    return {i: k / max(1, total) for i, k in kept.items()}


def fit_thresholds(model: nn.Module, plan: Plan, windows: torch.Tensor, batch_size: int = 4,
                   log: Callable[[str], None] = lambda _: None) -> tuple[Plan, dict]:
    """(the causal plan, a report): thresholds fitted on the first three quarters of the windows, in layer order,
    each updating its layer's keep ratio of the tokens there; the shares measured on the last quarter."""
    shares = {i: float(cfg.ratio) for i, cfg in sorted(plan.selection_layers.items())}
    if not shares:
        raise UserError("the plan has no selection layer to fit a threshold for")
    n_fit = max(1, windows.shape[0] * 3 // 4)
    fit, held = windows[:n_fit], windows[n_fit:]
    thresholds = {i: -math.inf for i in shares}  # minus infinity: every token updated (the dense layer)
    for i, share in shares.items():
        keys = _scores_at(model, causal_plan(plan, thresholds), i, fit, batch_size)
        k = max(1, math.ceil(share * keys.numel() - 1e-9))
        cutoff = float(torch.kthvalue(keys, k).values)  # the k lowest keys are updated: score >= -cutoff
        thresholds[i] = -cutoff
        log(f"layer {i}: threshold {-cutoff:.4f} updates {k} of {keys.numel()} calibration tokens ({share:.3f})")
    settings = {"thresholds": {"share": "keep ratio", "fit_windows": int(fit.shape[0]),
                               "held_out_windows": int(held.shape[0])}}
    out = causal_plan(plan, thresholds, settings)
    report = {"shares": {str(i): round(s, 6) for i, s in shares.items()}}
    if held.shape[0]:
        measured = held_out_shares(model, out, held, batch_size)
        report["held_out_shares"] = {str(i): round(s, 6) for i, s in measured.items()}
    return out, report
