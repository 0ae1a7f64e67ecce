"""The transfer stage: do plans hold on text they were not fitted to?

Every searched method (and the hybrid plan where the budget has one) is calibrated on each calibration setting
(source x size) into plans/<model>/transfer/<setting>/, evaluated on every domain into DIR/transfer/<setting>/
(`orthorank compare`, paired against SLEB calibrated on the same source), and the matrix is rendered into
DIR/transfer/: per method, level, setting and evaluation domain the paired perplexity ratio against SLEB, the
worst-domain ratio, and the gap between a method's in-domain and out-of-domain ratios; one heat map per level.
Everything resumes: searches from their checkpoints, evaluations from the result store, a setting whose plans exist
is not searched again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator

import numpy as np

from orthorank.harness.api.options import CalibrateOptions, CompareOptions, Options
from orthorank.harness.evaluation.stats import draw_ratio, worst_ratio, worst_ratio_scores
from orthorank.method.plan import Plan
from orthorank.method.plan_store import sparsity_label
from orthorank.method.registry import get_method, is_baseline
from orthorank.harness.results import atomic_save_figure, atomic_write_text
from orthorank.harness.search.registry import get_search
from orthorank.harness.study.budgets import DOMAINS, TransferSetting
from orthorank.harness.study.context import StudyContext, finished_json, hybrid_cost_table

METHODS = ("sleb", "shortgpt", "shortened-ppl", "orthorank", "hybrid")


def _measured_costs(method: str) -> bool:
    """Whether the method's search prices its moves with a measured cost table (the hybrid: searched after the
    greedy methods' evaluations, on its own cost table)."""
    return get_search(get_method(method).search).measured_costs


# In-domain: the evaluation domains a calibration source's text comes from (a mix: all of them).
IN_DOMAIN = {"c4": {"c4"}, "wikitext2": {"wikitext2"}, "code": {"code"}, "news": {"news"},
             "mix": set(DOMAINS)}


def setting_plans(ctx: StudyContext, setting: TransferSetting) -> Path:
    return ctx.plans_dir / "transfer" / setting.name


def _have(folder: Path, method: str, levels) -> bool:
    return all((folder / f"{method}-{sparsity_label(s)}.json").is_file() for s in levels)


def transfer_calls(ctx: StudyContext) -> Iterator[Options]:
    """The greedy and one-shot searches of every setting, each setting evaluated after them, from the cheapest
    setting to the dearest (fewest calibration tokens first), so the matrix that chooses the default calibration
    fills first; then the hybrid search (the dearest by far: 2.1 h on 2K tokens of SmolLM2-135M on 2 cores) on the
    chosen default setting only, and that setting's evaluation again with its rows. The commands are yielded one
    at a time because the hybrid's setting is known only once the greedy pass has been evaluated; an evaluation
    already in the store costs only its reading."""
    b, t = ctx.budget, ctx.budget.transfer
    table = ctx.out / "hybrid" / "cost-table.json"
    order = sorted(t.settings, key=lambda s: s.tokens)
    searched = [m for m in METHODS if not _measured_costs(m)]

    def calibrate(setting: TransferSetting, method: str) -> CalibrateOptions:
        extra = {"cost_table": str(table)} if get_search(get_method(method).search).measured_costs else {}
        return ctx.options(CalibrateOptions, method=method, sparsity=ctx.levels(b.levels), cost_seq_len=t.seq_len,
                           out=str(setting_plans(ctx, setting)),
                           **(setting.calibrate_options(t.calib_seq_len) | t.calibrate | extra))

    def compare(setting: TransferSetting, methods: list[str]) -> CompareOptions:
        return ctx.options(CompareOptions, methods=",".join(["dense", *methods]), sparsity=ctx.levels(t.levels),
                           datasets=",".join(DOMAINS), seq_len=t.seq_len, max_windows=t.windows,
                           plans_dir=str(setting_plans(ctx, setting)), out=str(ctx.out / "transfer" / setting.name),
                           overwrite=True)

    for setting in order:
        plans = setting_plans(ctx, setting)
        for method in searched:
            if not _have(plans, method, b.levels):
                yield calibrate(setting, method)
        methods = searched + (["hybrid"] if b.hybrid and _have(plans, "hybrid", b.levels) else [])
        if not evaluated(ctx, setting, methods):
            yield compare(setting, methods)
    chosen = chosen_setting(ctx) if b.hybrid else None
    if chosen is not None and not evaluated(ctx, chosen, [*searched, "hybrid"]):
        if not _have(setting_plans(ctx, chosen), "hybrid", b.levels):
            if not table.is_file():
                yield hybrid_cost_table(ctx, table)
            yield calibrate(chosen, "hybrid")
        yield compare(chosen, [*searched, "hybrid"])


def evaluated(ctx: StudyContext, setting: TransferSetting, methods: list[str]) -> bool:
    """True when the setting's compare.json already holds these methods' current plans (same content hashes) on the
    budget's windows: its evaluation is not run again. Without this a resumed stage re-runs every finished
    evaluation, which reads the result store only while the model code is unchanged; a finished evaluation stays
    valid across changes that keep the model's outputs (the exactness tests guard those)."""
    t = ctx.budget.transfer
    path = ctx.out / "transfer" / setting.name / "compare.json"
    if not path.is_file():
        return False
    data = json.loads(path.read_text())
    if (data.get("seq_len") != t.seq_len or data.get("skip_windows", 0) or data.get("scoring", "window") != "window"
            or sorted(data.get("windows", {})) != sorted(DOMAINS)
            or any(n != t.windows for n in data["windows"].values())):
        return False
    have = {Plan.from_dict(p).content_hash() for p in data.get("plans", [])}
    folder = setting_plans(ctx, setting)
    for method in methods:
        for level in t.levels:
            f = folder / f"{method}-{sparsity_label(level)}.json"
            if not f.is_file() or Plan.from_dict(json.loads(f.read_text())).content_hash() not in have:
                return False
    return True


def chosen_setting(ctx: StudyContext) -> TransferSetting | None:
    """The default calibration the evaluated matrix chooses (None until two settings have every method)."""
    t = ctx.budget.transfer
    out = ctx.out / "transfer"
    done = [s for s in t.settings if (out / s.name / "compare.json").is_file()]
    if len(done) < len(t.settings):  # the whole matrix chooses, never an early leader
        return None
    choice = choose_calibration(out, done, [m for m in METHODS if not _measured_costs(m)], t.levels)
    return next((s for s in t.settings if choice and s.name == choice["chosen"]), None)


def transfer_output(ctx: StudyContext) -> Path:
    return ctx.out / "transfer" / "transfer.json"


def _ratio(c: dict) -> str:
    lo, hi = c["ci95"]
    mark = "**" if lo > 1 or hi < 1 else ""
    return f"{mark}{c['ratio']:.3f} [{lo:.3f}, {hi:.3f}]{mark}"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def render_matrix(ctx: StudyContext) -> dict:
    """Read every finished setting's compare.json and write DIR/transfer/transfer.{md,json} and one heat map per
    level; returns what transfer.json holds."""
    t = ctx.budget.transfer
    out = ctx.out / "transfer"
    cells, worst, meta = {}, {}, {}
    for setting in t.settings:
        path = out / setting.name / "compare.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        meta[setting.name] = {"source": setting.source, "tokens": setting.tokens, "windows": data["windows"],
                              "seq_len": data["seq_len"]}
        for c in data["comparisons"]:
            if c["b"] == "sleb" and c["a_level"] == c["b_level"] and "(" not in c["a"]:
                cells[(c["a"], c["a_level"], setting.name, c["dataset"])] = c
        for w in data.get("worst_domain", []):
            worst[(w["method"], w["level"], setting.name)] = w
    done = [s for s in t.settings if s.name in meta]
    methods = [m for m in METHODS if not is_baseline(m)]
    greedy = [m for m in methods if not _measured_costs(m)]
    choice = choose_calibration(out, done, ["sleb", *greedy], t.levels)
    lines = [f"# Transfer matrix: {ctx.model_name}, paired perplexity ratio against SLEB calibrated on the same "
             "source", "",
             f"{t.caption()}; 95% paired bootstrap intervals over windows; ** = the interval excludes 1. Below 1 = "
             "the method's perplexity is lower than SLEB's. Settings finished: "
             f"{', '.join(s.name for s in done) or 'none yet'} of {', '.join(s.name for s in t.settings)}.", ""]
    summary = []
    for level in t.levels:
        lines += [f"## {level:g} sparsity", "", "| method | calibration | " + " | ".join(DOMAINS)
                  + " | worst domain | in-domain mean | out-of-domain mean | gap (out / in) |",
                  "|---" * (len(DOMAINS) + 6) + "|"]
        for m in methods:
            for s in done:
                row = [cells.get((m, level, s.name, d)) for d in DOMAINS]
                if not any(row):
                    continue
                w = worst.get((m, level, s.name))
                ins = [c["ratio"] for c, d in zip(row, DOMAINS) if c and d in IN_DOMAIN[s.source]]
                outs = [c["ratio"] for c, d in zip(row, DOMAINS) if c and d not in IN_DOMAIN[s.source]]
                gin, gout = _geomean(ins), _geomean(outs)
                gap = f"{gout / gin:.3f}" if gin and gout else "-"
                lines.append(f"| {m} | {s.name} | " + " | ".join(_ratio(c) if c else "-" for c in row)
                             + f" | {(w['worst_dataset'] + ' ' + _ratio(w)) if w else '-'}"
                             + f" | {f'{gin:.3f}' if gin else '-'} | {f'{gout:.3f}' if gout else '-'} | {gap} |")
                summary.append({"method": m, "level": level, "calibration": s.name,
                                "ratios": {d: c for c, d in zip(row, DOMAINS) if c}, "worst": w,
                                "in_domain_geomean": gin, "out_of_domain_geomean": gout})
        lines.append("")
    lines += ["In-domain: the evaluation domains the calibration text comes from (mix: all four, so it has no "
              "out-of-domain column). Means are geometric means of the point ratios; the gap is out / in (above 1 = "
              "the method's advantage over SLEB shrinks off its calibration domain).", ""]
    lines += render_choice(choice)
    result = {"model": ctx.model_name, "settings": meta, "cells": summary, "windows": t.windows,
              "default_calibration": choice,
              "seq_len": t.seq_len, "domains": list(DOMAINS), "levels": list(t.levels),
              # complete: every method on every setting, and the hybrid rows on the chosen one (its search runs
              # only there); rendered after every evaluation
              "complete": all(any(k[0] == m and k[2] == s.name for k in cells) for s in t.settings for m in greedy)
              and (not ctx.budget.hybrid or (choice is not None and any(
                  k[0] == "hybrid" and k[2] == choice["chosen"] for k in cells)))}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "transfer.md", "\n".join(lines) + "\n")
    _heatmaps(ctx.model_name, cells, done, methods, t.levels, out)
    atomic_write_text(out / "transfer.json", json.dumps(result, indent=1) + "\n")
    return result


def _window_nll(path: Path) -> dict[tuple[str, float], dict]:
    data = json.loads(path.read_text())
    return {(r["method"], r["level"]): r for r in data["rows"]}


def choose_calibration(out: Path, done: list[TransferSetting], methods: list[str], levels) -> dict | None:
    """The default calibration setting: the one whose plans lose the least on the domain each hurts most.

    Per method and level, the worst-domain ratio against the dense model (largest paired perplexity ratio over the
    evaluation domains, same windows for every setting); a setting's score is the geometric mean of these over every
    searched method and level, because `calibrate --calib-data` is one default for every method. The ratio against
    SLEB (the matrix above) cannot choose: it is relative to SLEB's own plan on the same text, which improves or
    degrades with the setting too. Only settings where every method has been evaluated take part. The chosen
    setting's score over the runner-up's has a paired bootstrap interval (every setting shares the windows)."""
    rows = {s.name: _window_nll(out / s.name / "compare.json") for s in done}
    complete = [s.name for s in done if all((m, lv) in rows[s.name] for m in methods for lv in levels)]
    if len(complete) < 2:
        return None
    dense = rows[complete[0]][("dense", 0.0)] if ("dense", 0.0) in rows[complete[0]] else None
    if dense is None:
        return None
    for name in complete[1:]:  # one set of windows for every setting, else nothing here is paired
        other = rows[name].get(("dense", 0.0))
        if other is None or any(abs(x - y) > 1e-3 * abs(y) for d in DOMAINS
                                for x, y in zip(other[d]["window_nll"], dense[d]["window_nll"])):
            raise ValueError(f"transfer setting {name} was evaluated on other windows than {complete[0]}")

    def group(row: dict) -> list[tuple]:
        return [(row[d]["window_nll"], dense[d]["window_nll"], row[d]["tokens_per_window"]) for d in DOMAINS]

    candidates = {name: [group(rows[name][(m, lv)]) for m in methods for lv in levels] for name in complete}
    points, draws = worst_ratio_scores(candidates)
    n = min(len(dense[d]["window_nll"]) for d in DOMAINS)
    ranked = sorted(complete, key=points.get)
    best, second = ranked[0], ranked[1]
    vs = draw_ratio(points[best] / points[second], draws[best], draws[second], n)
    cells = {}
    for name in complete:
        for m in methods:
            for lv in levels:
                iv, k = worst_ratio(group(rows[name][(m, lv)]))
                cells[f"{m}@{lv:g}|{name}"] = {"worst_dataset": DOMAINS[k], **iv.to_dict()}
    per_method = {m: min(complete, key=lambda name: sum(math.log(cells[f"{m}@{lv:g}|{name}"]["value"])
                                                         for lv in levels)) for m in methods}
    return {"chosen": best, "runner_up": second, "scores": {k: round(points[k], 6) for k in ranked},
            "vs_runner_up": vs.to_dict(), "separated": vs.excludes(1.0), "settings": complete,
            "methods": methods, "levels": list(levels), "worst_vs_dense": cells, "best_per_method": per_method}


def render_choice(choice: dict | None) -> list[str]:
    if choice is None:
        return ["## Default calibration", "", "Not chosen yet: it needs at least two settings with every method "
                "evaluated.", ""]
    methods, levels = choice["methods"], choice["levels"]
    head = [f"{m}@{lv:g}" for m in methods for lv in levels]
    lines = ["## Default calibration, by the worst domain", "",
             "Worst-domain ratio against the dense model (the largest paired perplexity ratio over "
             f"{', '.join(DOMAINS)}, with the domain and the interval of that maximum); score = geometric mean over "
             "the row. Lower is better. The default is the setting with the lowest score, among the settings where "
             "every method has been evaluated.", "",
             "| calibration | " + " | ".join(head) + " | score |", "|---" * (len(head) + 2) + "|"]
    for name in sorted(choice["settings"], key=choice["scores"].get):
        vals = []
        for h in head:
            c = choice["worst_vs_dense"][f"{h}|{name}"]
            vals.append(f"{c['worst_dataset']} {c['value']:.3f} [{c['low']:.3f}, {c['high']:.3f}]")
        lines.append(f"| {name} | " + " | ".join(vals) + f" | {choice['scores'][name]:.3f} |")
    vs = choice["vs_runner_up"]
    verdict = ("its interval excludes 1: the choice is supported by this slice" if choice["separated"] else
               "its interval includes 1: on this slice the two cannot be told apart, the choice rests on the "
               "point estimate")
    per = ", ".join(f"{m} {s}" for m, s in choice["best_per_method"].items())
    lines += ["", f"Chosen: **{choice['chosen']}**; its score over the runner-up {choice['runner_up']}'s: "
              f"{vs['value']:.3f} [{vs['low']:.3f}, {vs['high']:.3f}] ({verdict}). Best setting per method alone: "
              f"{per}. The choice is made on the evaluation slice above; the claims that follow from it are "
              "checked on windows the choice did not see.", ""]
    return lines


def transfer_done(path: Path) -> bool:
    return finished_json(path)


def after_command(ctx: StudyContext, options: Options) -> None:
    """Each finished setting's evaluation renders the matrix so far, so partial matrices can be committed."""
    if options.command == "compare":
        render_matrix(ctx)


def _heatmaps(model: str, cells: dict, done: list[TransferSetting], methods: list[str], levels, out: Path) -> None:
    import matplotlib  # lazily: optional on the bench path (only figures need matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazily: optional on the bench path (only figures need matplotlib)

    for level in levels:
        rows = [(m, s.name) for m in methods for s in done if any((m, level, s.name, d) in cells for d in DOMAINS)]
        if not rows:
            continue
        grid = np.full((len(rows), len(DOMAINS)), np.nan)
        for i, (m, n) in enumerate(rows):
            for j, d in enumerate(DOMAINS):
                c = cells.get((m, level, n, d))
                if c:
                    grid[i, j] = math.log2(c["ratio"])
        fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.6))
        lim = max(0.05, float(np.nanmax(np.abs(grid))))
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        for i, (m, n) in enumerate(rows):
            for j, d in enumerate(DOMAINS):
                c = cells.get((m, level, n, d))
                if c:
                    sig = c["ci95"][0] > 1 or c["ci95"][1] < 1
                    ax.text(j, i, f"{c['ratio']:.2f}{'*' if sig else ''}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(DOMAINS)), [f"eval: {d}" for d in DOMAINS], fontsize=8)
        ax.set_yticks(range(len(rows)), [f"{m} | calib {n}" for m, n in rows], fontsize=7)
        ax.set_title(f"{model} at {level:g}: perplexity / SLEB's (same calibration); * = 95% CI excludes 1", fontsize=8)
        fig.colorbar(im, ax=ax, label="log2 ratio (blue: better than SLEB)")
        fig.tight_layout()
        atomic_save_figure(fig, out / f"transfer-{sparsity_label(level)}.png", dpi=120)
        plt.close(fig)
