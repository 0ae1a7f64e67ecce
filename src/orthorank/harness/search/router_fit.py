"""Fitting the router policy (method/router.py) on calibration windows, for a plan's selection layers.

What the router should predict is the question "which tokens' updates does the loss need?", and there are several
answers; each is a *target* here, measured per token i of a selection layer with update u_i = f(x)_i - x_i and
g_i = dL/dh_out_i (the loss's gradient at the layer's output, from one backward):

- update:   log ||u_i||                                   (the update-norm oracle's ranking; no labels)
- relative: log ||u_i|| / ||h_i||                         (how far the update turns the residual stream; with
            post-norms, as in Gemma, every update has about the same norm and only this ratio differs)
- loss:     -<g_i, u_i>, the first-order loss decrease of applying the update (reads the window's labels)
- loss-abs: log |<g_i, u_i>|                              (its magnitude)
- fisher:   log E_y <g_i(y), u_i>^2 over next tokens y sampled from the model's own prediction: a label-free
            estimate of how much the update moves the output distribution (u^T F u, F the Fisher information)

Targets are centred per window (selection ranks tokens within a sequence). Per layer and target a ridge regression
on standardised features is fitted on the training windows; its regularisation is chosen on the held-out
calibration windows (rank correlation with the target within windows). Which target wins is decided on the same
held-out windows by what counts, the calibration loss of the plan with that router; then the winner is refitted on
every window. Features and targets are recorded with the plan applied (method/recording.py), so each layer sees the
inputs that earlier selection layers really produce: the first pass selects by the paper's rule, later passes
(`iterations`) by the router fitted before, keeping a refit only where it lowers the held-out loss.

Deterministic for a seed (window split, sampled labels); nothing here reads evaluation text.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.method.apply import apply_plan, restore_dense, sequence_context
from orthorank.method.plan import Plan
from orthorank.method.recording import Recorder, next_token_loss, recording, update_effects
from orthorank.method.router import LayerRouter, RouterState, features
from orthorank.models.adapters import get_adapter
from orthorank.models.loading import input_device
from orthorank.harness.search.calibration import windows_digest
from orthorank.harness.store import code_version

TARGETS: dict[str, str] = {
    "update": "log ||f(x) - x||",
    "relative": "log ||f(x) - x|| / ||x||, the update relative to the residual stream",
    "loss": "-<dL/dh, f(x) - x>, the first-order loss decrease (labels)",
    "loss-abs": "log |<dL/dh, f(x) - x>| (labels)",
    "fisher": "log E_y <dL(y)/dh, f(x) - x>^2, y sampled from the model (no labels)",
}
DEFAULT_TARGETS = ("update", "relative", "loss", "loss-abs", "fisher")
DEFAULT_ALPHAS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)  # ridge penalty, per token of standardised features


@dataclass(frozen=True)
class FitSettings:
    targets: tuple[str, ...] = DEFAULT_TARGETS
    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    iterations: int = 2  # recording passes: the paper's rule selects in the first, the router fitted before later
    fisher_samples: int = 2  # sampled next-token sequences per window for the fisher target
    holdout: float = 0.25  # share of the calibration windows held out to choose regularisation and target
    batch_size: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [t for t in self.targets if t not in TARGETS]
        if bad or not self.targets:
            raise UserError(f"unknown router target(s) {', '.join(bad) or '(none)'}; choose from {', '.join(TARGETS)}")
        if not self.alphas or any(not (a > 0 and math.isfinite(a)) for a in self.alphas):
            raise UserError("router regularisation values must be positive numbers")
        if self.iterations < 1 or self.fisher_samples < 1 or self.batch_size < 1:
            raise UserError("router fit: iterations, fisher samples and batch size must be at least 1")
        if not 0.0 < self.holdout < 1.0:
            raise UserError(f"router fit: the held-out share must be in (0, 1), got {self.holdout}")


@dataclass
class Recorded:
    """What one recording pass gives, per selection layer: features [N, F] and targets [N] of every real token
    but the sink, and each token's window index [N]."""

    X: dict[int, torch.Tensor] = field(default_factory=dict)
    Y: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    window: torch.Tensor | None = None


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.clamp_min(1e-20))


@torch.no_grad()
def _sample_labels(logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """[B, T - 1] next tokens drawn from the model's own distribution at each position (on the CPU generator)."""
    probs = torch.softmax(logits[:, :-1].float(), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1]).cpu()
    return torch.multinomial(flat, 1, generator=gen).view(probs.shape[:2]).to(logits.device)


def record(model: nn.Module, plan: Plan, windows: torch.Tensor, settings: FitSettings,
           progress: Callable[[str], None] | None = None) -> Recorded:
    """One recording pass of `plan` (its own policy selects) over `windows` [N, T]: every target of
    settings.targets for every selection layer."""
    adapter = get_adapter(model)
    device = input_device(model)
    need_grad = any(t in ("loss", "loss-abs", "fisher") for t in settings.targets)
    gen = torch.Generator().manual_seed(settings.seed)
    out = Recorded()
    parts: dict[int, list[torch.Tensor]] = {}
    targets: dict[int, dict[str, list[torch.Tensor]]] = {}
    window_ids = []
    apply_plan(model, plan)
    try:
        context = sequence_context(model)
        if context is None:
            raise UserError("the plan selects tokens in no layer: there is no router to fit")
        for start in range(0, windows.shape[0], settings.batch_size):
            ids = windows[start:start + settings.batch_size].to(device)
            B, T = ids.shape
            rec = Recorder(select=True)
            with recording(context, rec), torch.set_grad_enabled(need_grad):
                hidden = adapter.decoder(model)(input_ids=ids, use_cache=False).last_hidden_state
                effects: dict[str, dict[int, torch.Tensor]] = {}
                if need_grad:
                    logits = adapter.head_logits(model, hidden)  # the decoder's output is final-normed
                    if "loss" in settings.targets or "loss-abs" in settings.targets:
                        effects["loss"] = update_effects(rec, next_token_loss(logits, ids), retain_graph=True)
                    if "fisher" in settings.targets:
                        acc: dict[int, torch.Tensor] = {}
                        for s in range(settings.fisher_samples):
                            labels = _sample_labels(logits, gen)
                            e = update_effects(rec, next_token_loss(logits, ids, labels=labels), retain_graph=True)
                            for i, v in e.items():
                                acc[i] = acc.get(i, 0) + v.pow(2) / settings.fisher_samples
                        effects["fisher"] = acc
            for i, item in sorted(rec.layers.items()):
                src, h = item["src"].detach(), item["hidden"].detach()
                parts.setdefault(i, []).append(features(src, h, src[:, 0])[:, 1:].reshape(B * (T - 1), -1).cpu())
                ys = targets.setdefault(i, {})
                u = (item["dense_out"].detach() - h).float()
                per_token = {}
                norm_u = torch.linalg.vector_norm(u, dim=-1)
                per_token["update"] = _log(norm_u)
                per_token["relative"] = _log(norm_u) - _log(torch.linalg.vector_norm(h.float(), dim=-1))
                if "loss" in effects:
                    per_token["loss"] = -effects["loss"][i]
                    per_token["loss-abs"] = _log(effects["loss"][i].abs())
                if "fisher" in effects:
                    per_token["fisher"] = _log(effects["fisher"][i])
                for name in settings.targets:
                    y = per_token[name][:, 1:].float()
                    y = y - y.mean(dim=1, keepdim=True)  # selection ranks within a window: centre per window
                    ys.setdefault(name, []).append(y.reshape(-1).cpu())
            window_ids.append(torch.arange(start, start + B).repeat_interleave(T - 1))
            del rec, hidden
            if progress:
                progress(f"recorded {min(start + B, windows.shape[0])}/{windows.shape[0]} windows")
    finally:
        restore_dense(model)
    for i in parts:
        out.X[i] = torch.cat(parts[i])
        out.Y[i] = {name: torch.cat(v) for name, v in targets[i].items()}
    out.window = torch.cat(window_ids)
    return out


def _within_window_rank_corr(pred: torch.Tensor, y: torch.Tensor, window: torch.Tensor) -> float:
    """Mean over windows of the Spearman correlation between prediction and target."""
    out = []
    for w in torch.unique(window).tolist():
        m = window == w
        a, b = pred[m], y[m]
        if a.numel() < 3:
            continue
        ra = torch.argsort(torch.argsort(a)).double()
        rb = torch.argsort(torch.argsort(b)).double()
        ra, rb = ra - ra.mean(), rb - rb.mean()
        den = float(ra.norm() * rb.norm())
        out.append(float((ra * rb).sum()) / den if den > 0 else 0.0)
    return float(np.mean(out)) if out else 0.0


def ridge_paths(X: torch.Tensor, y: torch.Tensor, alphas: tuple[float, ...]):
    """Standardise X, then the ridge solution for every alpha from one eigendecomposition (float64).
    Returns (mean [F], scale [F], [(alpha, weight [F], bias)])."""
    X = X.double()
    mean = X.mean(0)
    scale = X.std(0).clamp_min(1e-6)
    Z = (X - mean) / scale
    yd = y.double()
    bias = float(yd.mean())
    evals, evecs = torch.linalg.eigh(Z.T @ Z)
    proj = evecs.T @ (Z.T @ (yd - bias))
    n = Z.shape[0]
    return mean, scale, [(a, evecs @ (proj / (evals + a * n)), bias) for a in alphas]


def fit_layer(X: torch.Tensor, y: torch.Tensor, window: torch.Tensor, train: torch.Tensor, alphas: tuple[float, ...]):
    """Choose alpha by held-out within-window rank correlation; returns (alpha, held-out correlation, fitted on the
    training windows (mean, scale, weight, bias))."""
    mean, scale, path = ridge_paths(X[train], y[train], alphas)
    held = ~train
    Zh = (X[held].double() - mean) / scale
    best = None
    for a, w, b in path:
        corr = _within_window_rank_corr((Zh @ w + b).float(), y[held], window[held])
        if best is None or corr > best[1] + 1e-9:
            best = (a, corr, (mean, scale, w, b))
    return best


def refit(X: torch.Tensor, y: torch.Tensor, alpha: float):
    mean, scale, path = ridge_paths(X, y, (alpha,))
    _, w, b = path[0]
    return mean, scale, w, b


def router_state(fits: dict[int, tuple], target: str, hidden: int, settings: dict, calibration: dict) -> RouterState:
    layers = tuple(LayerRouter.from_tensors(i, w.float(), float(b), mean.float(), scale.float())
                   for i, (mean, scale, w, b) in sorted(fits.items()))
    return RouterState(layers, target, hidden, settings, calibration)


@torch.no_grad()
def calibration_nll(model: nn.Module, plan: Plan, windows: torch.Tensor, batch_size: int) -> float:
    """Mean next-token NLL of `plan` on windows (the held-out criterion)."""
    device = input_device(model)
    apply_plan(model, plan)
    try:
        total, count = 0.0, 0
        for start in range(0, windows.shape[0], batch_size):
            ids = windows[start:start + batch_size].to(device)
            logits = model(ids, use_cache=False).logits
            total += float(next_token_loss(logits, ids))
            count += ids.shape[0] * (ids.shape[1] - 1)
        return total / count
    finally:
        restore_dense(model)


def with_router(plan: Plan, state: RouterState) -> Plan:
    return dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, policy="router", fitted=state))


def fit_key(model_fingerprint: str, plan: Plan, windows: torch.Tensor, settings: FitSettings) -> dict[str, Any]:
    """What decides a router fit: the model's weights, the plan (its layers, ratios and rule), the calibration
    windows and the fit's settings (and the code version, which the store adds)."""
    return {"code": code_version("router-fit"), "model": model_fingerprint, "plan": plan.content_hash(),
            "windows": windows_digest(windows),
            # not the number of passes: a longer fit goes on from a shorter one's passes, as greedy searches do
            "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k != "iterations"}}


@dataclass
class FitResult:
    state: RouterState
    report: dict[str, Any]


def fit_router(model: nn.Module, plan: Plan, windows: torch.Tensor, settings: FitSettings, calibration: dict,
               log: Callable[[str], None] = lambda s: None, checkpoint: Any = None) -> FitResult:
    """Fit the router for `plan`'s selection layers on calibration `windows` [N, T] (see the module docstring).
    checkpoint: a result-store Namespace keyed by everything that decides the fit (`fit_key`); each finished pass
    is kept there, so a killed fit resumes after its last finished pass."""
    if plan.selection is None or not plan.selection_layers:
        raise UserError(f"a {plan.method} plan selects tokens in no layer: there is no router to fit")
    if windows.shape[0] < 4:
        raise UserError(f"a router fit needs at least 4 calibration windows (to hold some out), got {windows.shape[0]}")
    t0 = time.perf_counter()
    hidden = int(model.config.hidden_size)
    n = windows.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(settings.seed))
    n_held = max(1, int(round(settings.holdout * n)))
    held_windows = sorted(perm[:n_held].tolist())
    train_windows = sorted(perm[n_held:].tolist())
    held_set = windows[held_windows]
    base = dataclasses.replace(plan, selection=dataclasses.replace(plan.selection, policy="orthogonal", fitted=None))
    report: dict[str, Any] = {"held_out_windows": held_windows, "passes": []}
    paper_nll = calibration_nll(model, base, held_set, settings.batch_size)
    report["held_out_nll"] = {"orthogonal": paper_nll}
    log(f"held-out calibration NLL with the paper's rule: {paper_nll:.4f}")
    # best_state: the winner refitted on every window (what is saved); best_train: the same fit on the training
    # windows only, whose held-out NLL chose it and which selects in the next recording pass (so held-out windows
    # never shape the router that is judged on them)
    current, best_state, best_train, best_nll, best_choice = base, None, None, math.inf, None
    targets = settings.targets
    stored = checkpoint.load() if checkpoint is not None else {}
    report["resumed_passes"] = 0
    for it in range(settings.iterations):
        if it in stored:  # a finished pass of an earlier, killed run with the same key
            kept = stored[it]
            report["passes"].append(kept["report"])
            report["resumed_passes"] += 1
            if kept["best"] is None:
                break
            best_state, best_train, best_nll, best_choice = _stored_best(kept["best"])
            current, targets = with_router(plan, best_train), (best_choice["target"],)
            log(f"pass {it + 1}: resumed from the store (target {best_choice['target']}, held-out NLL {best_nll:.4f})")
            continue
        t_rec = time.perf_counter()
        # later passes refine the chosen target only (the others lost on held-out windows already)
        rec = record(model, current, windows, dataclasses.replace(settings, targets=targets), log if it == 0 else None)
        t_fit = time.perf_counter()
        train_mask = torch.isin(rec.window, torch.tensor(train_windows))
        pass_report: dict[str, Any] = {"selected_by": current.selection.policy,
                                       "record_seconds": round(t_fit - t_rec, 1), "targets": {}}
        for target in targets:
            state, nll, layer_info = _fit_target(model, plan, rec, target, train_mask, held_set, settings, hidden)
            pass_report["targets"][target] = {"held_out_nll": nll, "layers": layer_info}
            log(f"pass {it + 1}: target {target}: held-out NLL {nll:.4f} (paper's rule {paper_nll:.4f}); "
                f"rank correlation per layer " + ", ".join(f"{k}:{v['held_out_rank_corr']:.2f}"
                                                           for k, v in layer_info.items()))
            if nll < best_nll - 1e-9:
                # refit the winner on every window with the chosen regularisation per layer
                full = {i: refit(rec.X[i], rec.Y[i][target], layer_info[str(i)]["alpha"]) for i in rec.X}
                best_state = router_state(full, target, hidden, {}, {})
                best_train = state
                best_nll, best_choice = nll, {"pass": it + 1, "target": target,
                                              "alphas": {k: v["alpha"] for k, v in layer_info.items()}}
        pass_report["fit_seconds"] = round(time.perf_counter() - t_fit, 1)
        report["passes"].append(pass_report)
        if checkpoint is not None:
            best = None if best_state is None else {"state": best_state.to_dict(), "nll": best_nll,
                                                    "train_state": best_train.to_dict(), "choice": best_choice}
            checkpoint.put({it: {"report": pass_report, "best": best}}, tag=f"pass{it}")
        if best_state is None:
            break
        current, targets = with_router(plan, best_train), (best_choice["target"],)
    if best_state is None:
        raise UserError("the router fit found no target with a finite held-out calibration loss; check the model's "
                        "dtype and the calibration text")
    report["chosen"] = best_choice
    report["held_out_nll"]["router"] = best_nll
    report["seconds"] = round(time.perf_counter() - t0, 1)
    settings_out = {**dataclasses.asdict(settings), "chosen": best_choice, "held_out_nll": report["held_out_nll"],
                    "seconds": report["seconds"]}
    state = dataclasses.replace(best_state, settings=settings_out, calibration=calibration)
    return FitResult(state, report)


def _fit_target(model: nn.Module, plan: Plan, rec: Any, target: str, train_mask: torch.Tensor,
                held_set: torch.Tensor, settings: FitSettings, hidden: int) -> tuple[RouterState, float, dict]:
    """One target's router on the training windows (each layer's penalty chosen by held-out rank correlation),
    and the held-out calibration NLL of the plan routed by it."""
    fits, layer_info = {}, {}
    for i in sorted(rec.X):
        alpha, corr, fitted = fit_layer(rec.X[i], rec.Y[i][target], rec.window, train_mask, settings.alphas)
        fits[i] = fitted
        layer_info[str(i)] = {"alpha": alpha, "held_out_rank_corr": round(corr, 4)}
    state = router_state(fits, target, hidden, {}, {})
    return state, calibration_nll(model, with_router(plan, state), held_set, settings.batch_size), layer_info


def _stored_best(best: dict) -> tuple[RouterState, RouterState, float, dict]:
    """A stored pass's winner: (refitted on every window, fitted on the training windows, its NLL, its choice)."""
    return (RouterState.from_dict(best["state"]), RouterState.from_dict(best["train_state"]), best["nll"],
            best["choice"])
