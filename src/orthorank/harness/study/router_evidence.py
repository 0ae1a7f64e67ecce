"""The router's evidence in one table per model: `python -m orthorank.harness.study.router_evidence DIR [DIR ...] --out
FILE.md` reads what studies/router/evidence.sh leaves in each DIR (compare/compare.json, fit-*.json, bench-*.json)
and writes, per model and level, each row's worst-domain ratio against SLEB with its interval and the verdict
computed from it, the router's share of the oracle's headroom, what fitting cost, and the prefill speed against
SLEB's measured side by side. Nothing here is typed by hand: every figure is read from a result file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from orthorank.method.registry import baseline, is_baseline, is_reference
from orthorank.harness.reports.speed import speed_ratio
from orthorank.harness.results import atomic_write_text
from orthorank.harness.study.router_headline import _ci, _kept_paper_rule, headline

ROWS = ("orthorank", "router", "router-hybrid", "hybrid", "orthorank (policy random)", "orthorank (policy oracle)",
        "orthorank (policy loss-oracle)", "shortgpt", "shortened-ppl")


def model_section(folder: Path) -> str:
    cmp_path = folder / "compare" / "compare.json"
    if not cmp_path.is_file():
        return f"## {folder.name}\n\nNo comparison yet ({cmp_path} is missing).\n" + _fits_and_speed(folder)
    data = json.loads(cmp_path.read_text())
    windows = data["windows"]
    skip = data.get("skip_windows", 0)
    n = max(windows.values())
    lines = [f"## {data['model']}", "",
             f"Perplexity on windows {skip + 1}-{skip + n} of {data['seq_len']} tokens of "
             f"{', '.join(data['datasets'])} (a slice; no fit, search or choice saw them), {data.get('dtype', '')}. "
             "Worst-domain ratio against SLEB at the same level: the largest paired ratio over the domains with the "
             "bootstrap interval of that maximum; ** = the interval excludes 1. Compute sparsity at "
             f"{data['seq_len']} tokens, router FLOPs counted; the oracles run their layers densely to choose "
             "(references, never a speed-up).", "",
             "| level | row | compute sparsity | worst domain | worst-domain ratio vs SLEB [95% CI] | verdict |",
             "|---|---|---|---|---|---|"]
    compute = {(r["method"], r["level"]): (r.get("sparsity") or {}).get("compute") for r in data["rows"]}
    worst = {(w["method"], w["level"]): w for w in data.get("worst_domain", [])}
    headroom = list(data.get("headroom", []))
    # comparisons run after the first one (the hybrid plans and their router, another level, more baselines), on
    # the same windows; rows already read win, so a repeated SLEB row is the first run's (the same numbers)
    for extra in sorted(folder.glob("compare-*/compare.json")):
        more = json.loads(extra.read_text())
        if more["windows"] == data["windows"] and more.get("skip_windows") == data.get("skip_windows"):
            for r in more["rows"]:
                compute.setdefault((r["method"], r["level"]), (r.get("sparsity") or {}).get("compute"))
            for w in more.get("worst_domain", []):
                worst.setdefault((w["method"], w["level"]), w)
            seen = {(h["method"], h["level"]) for h in headroom}
            headroom += [h for h in more.get("headroom", []) if (h["method"], h["level"]) not in seen]
    for level in sorted({w["level"] for w in worst.values()}):
        sleb_c = compute.get(("sleb", level))
        if sleb_c is not None:
            lines.append(f"| {level:g} | sleb | {sleb_c:.4f} | - | 1 (reference) | - |")
        kept_paper = _kept_paper_rule(data["model"], level)
        for row in ROWS:
            w = worst.get((row, level))
            if w is None:
                continue
            c = compute.get((row, level))
            label = row
            if row == "router" and kept_paper:
                label = "router (fitted, declined: the committed plan keeps the paper's rule, the orthorank row)"
            lines.append(f"| {level:g} | {label} | {'-' if c is None else f'{c:.4f}'} | {w['worst_dataset']} | "
                         f"{_ci(w['ratio'], *w['ci95'])} | {w['verdict']} |")
    shares = [h for h in headroom if h["method"] in ("router", "orthorank")]
    if shares:
        lines += ["", "Share of the update-norm oracle's headroom over random selection, (ppl_random - ppl_rule) / "
                  "(ppl_random - ppl_oracle), on the same windows, per domain [95% paired CI]:", "",
                  "| level | rule | " + " | ".join(data["datasets"]) + " |", "|---|---|" + "---|" * len(data["datasets"])]
        for level in sorted({h["level"] for h in shares}):
            for rule in ("orthorank", "router"):
                got = {h["dataset"]: h for h in shares if h["method"] == rule and h["level"] == level}
                if got:
                    cells = [f"{got[d]['share']:.2f} [{got[d]['ci95'][0]:.2f}, {got[d]['ci95'][1]:.2f}]"
                             if d in got and got[d]["share"] is not None else "-" for d in data["datasets"]]
                    lines.append(f"| {level:g} | {'paper' if rule == 'orthorank' else rule} | " + " | ".join(cells)
                                 + " |")
    return "\n".join(lines) + "\n" + _fits_and_speed(folder)


def _fits_and_speed(folder: Path) -> str:
    lines: list[str] = []
    fits = sorted(folder.glob("fit-router*.json"))
    if fits:
        lines += ["", "Fits (calibration text only; target and regularisation chosen on held-out calibration "
                  "windows; held-out calibration NLL of the router against the paper's rule on the same layers):", "",
                  "| plan | target chosen | held-out NLL router / paper | plan keeps | passes | recording + fitting seconds, all passes (2 cores) |",
                  "|---|---|---|---|---|---|"]
        for f in fits:
            text = f.read_text().strip()
            if not text:
                continue
            r = json.loads(text.splitlines()[-1])
            nll = r["held_out_nll"]
            passes, seconds = "-", r["seconds"]
            keeps = r.get("kept", "router")
            plan_file = Path(str(r["plan"]).removesuffix(".tmp"))
            if plan_file.is_file():  # a resumed fit's own seconds leave out the passes it took from the store
                fit = json.loads(plan_file.read_text())["provenance"].get("router_fit", {})
                runs = fit.get("passes", [])
                passes = str(len(runs))
                seconds = sum(p.get("record_seconds", 0) + p.get("fit_seconds", 0) for p in runs)
                keeps = fit.get("kept", keeps)
            lines.append(f"| {f.stem.replace('fit-', '')} | {r['target']} | {nll['router']:.4f} / "
                         f"{nll['orthogonal']:.4f} | {'the paper' + chr(39) + 's rule' if keeps == 'orthogonal' else keeps} | "
                          f"{passes} | {seconds:.0f} |")
    benches = sorted(folder.glob("bench-*.json"))
    if benches:
        lines += ["", "Prefill throughput against SLEB's, measured side by side (batch 1, interleaved repeats; "
                  "median of paired ratios, bootstrap 95% CI; above 1 = faster than SLEB):", "",
                  "| level | row | " + " | ".join(f"{s} tokens" for s in (1024, 4096, 8192)) + " |", "|---|---|---|---|---|"]
        for b in benches:
            bench = json.loads(b.read_text())
            level = bench.get("sparsity")
            for row in ("orthorank", "router", "hybrid", "router-hybrid"):
                sp = speed_ratio(bench, row, "sleb")
                if not sp:
                    continue
                cells = [(_ci(*sp[s]).replace("**", "") if s in sp else "-") for s in (1024, 4096, 8192)]
                lines.append(f"| {level} | {row} | " + " | ".join(cells) + " |")
    return ("\n".join(lines) + "\n" + _hybrid_speed(folder) + _searched(folder) + _seeds(folder)
            + _transfer(folder))


def _hybrid_speed(folder: Path) -> str:
    """Prefill speed of plans bench cannot time (per-layer keep ratios, removals), from `compare --measure-speed`
    runs on one window per length (studies/router/speed-hybrid.sh): each row's median speed-up over dense and the
    range of its per-round speed-ups, and its median against SLEB's."""
    runs = []
    for d in sorted(folder.glob("speed-*-*"), key=lambda d: int(d.name.rsplit("-", 1)[1])):
        path = d / "compare.json"
        if path.is_file():
            runs.append(json.loads(path.read_text()))
    if not runs:
        return ""
    lines = ["", "Prefill speed-up over dense of plans `bench` cannot time (per-layer keep ratios), timed by "
             "`compare --measure-speed`: dense and every plan interleaved in each round on one window (batch 1), "
             "the median over rounds [the range of the per-round speed-ups]; \"vs SLEB\" divides the two medians "
             "(no interval: the rounds are summarised per row):", "",
             "| tokens | level | row | speed-up over dense [range] | vs SLEB | timed rounds |", "|---|---|---|---|---|---|"]
    for data in runs:
        rows = {(r["method"], r["level"]): r for r in data["rows"]}
        command = (data.get("environment") or {}).get("command_line") or ""
        words = command.split()
        rounds = words[words.index("--measure-speed") + 1] if "--measure-speed" in words[:-1] else "-"
        for (method, level), r in rows.items():
            m = (r.get("sparsity") or {}).get("measured_speedup")
            if m is None or is_reference(method):
                continue
            rng = r.get("measured_range") or [None, None]
            sleb = (rows.get((baseline(), level), {}).get("sparsity") or {}).get("measured_speedup")
            vs = "-" if not sleb or is_baseline(method) else f"{m / sleb:.3f}"
            cells = f"{m:.3f}" + (f" [{rng[0]:.3f}, {rng[1]:.3f}]" if rng[0] is not None else "")
            lines.append(f"| {data['seq_len']} | {level:g} | {method} | {cells} | {vs} | {rounds} |")
    return "\n".join(lines) + "\n"


def _searched(folder: Path) -> str:
    """Plans searched under the router (studies/router/searched.sh): the greedy layer search run with a router bank,
    the router refitted on the layers found; against SLEB and against the router on OrthoRank's own layers."""
    path = folder / "searched" / "compare" / "compare.json"
    if not path.is_file():
        return ""
    data = json.loads(path.read_text())
    worst = {(w["method"], w["level"]): w for w in data.get("worst_domain", [])}
    per = {}
    for c in data.get("comparisons", []):
        if c["a"] == "router-searched" and c["b"] == "router":
            per.setdefault(c["a_level"], {})[c["dataset"]] = c
    skip, n = data.get("skip_windows", 0), max(data["windows"].values())
    lines = ["", f"Plans searched under the router (windows {skip + 1}-{skip + n} of {data['seq_len']} tokens, "
             f"{data.get('dtype', '')}): the greedy layer search with a router bank fitted on the dense model, then "
             "the router refitted on the layers found, compute-matched to SLEB; worst-domain ratio against SLEB, and "
             "the paired ratio against the router on OrthoRank's layers per domain [95% CI]:", "",
             "| level | row | layers | worst domain | vs SLEB, worst domain | " + " | ".join(
                 f"vs router, {d}" for d in data["datasets"]) + " |",
             "|---|---|---|---|---|" + "---|" * len(data["datasets"])]
    layers = {(r["method"], r["level"]): r.get("layers") for r in data["rows"]}
    for level in sorted({lv for _, lv in worst}):
        for row in ("orthorank", "router", "router-searched"):
            w = worst.get((row, level))
            if w is None:
                continue
            cells = [(_ci(per[level][d]["ratio"], *per[level][d]["ci95"]) if row == "router-searched"
                      and d in per.get(level, {}) else "-") for d in data["datasets"]]
            lines.append(f"| {level:g} | {row} | {layers.get((row, level))} | {w['worst_dataset']} | "
                         f"{_ci(w['ratio'], *w['ci95'])} | " + " | ".join(cells) + " |")
    cost = []
    for name in ("bank", "refit-0.1", "refit-0.2"):
        out = folder / "searched" / f"{name}.out"
        if out.is_file() and out.read_text().strip():
            cost.append(f"{name} {json.loads(out.read_text().strip().splitlines()[-1])['seconds']:.0f} s")
    search = folder / "searched" / "search" / "orthorank-0.2.json"
    if search.is_file():
        seconds = json.loads(search.read_text())["provenance"].get("search_seconds")
        if seconds is not None:
            cost.append(f"search (both levels) {seconds:.0f} s")
    if cost:
        lines += ["", "Cost on 2 cores (shared with other work while it ran): " + ", ".join(cost) + "."]
    benches = sorted((folder / "searched").glob("bench-*.json"))
    if benches:
        lines += ["", "Their prefill throughput against SLEB's, measured side by side (batch 1, interleaved repeats; "
                  "median of paired ratios, bootstrap 95% CI; above 1 = faster than SLEB):", "",
                  "| level | row | 1024 tokens | 4096 tokens |", "|---|---|---|---|"]
        for b in benches:
            bench = json.loads(b.read_text())
            for row in ("orthorank", "router", "router-searched"):
                sp = speed_ratio(bench, row, "sleb")
                if sp:
                    cells = [(_ci(*sp[n]).replace("**", "") if n in sp else "-") for n in (1024, 4096)]
                    lines.append(f"| {bench.get('sparsity')} | {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


TRANSFER_RULES = ("orthorank", "router", "hybrid", "router-hybrid")


def _transfer(folder: Path) -> str:
    """The router calibrated on each source of the transfer matrix (on that source's OrthoRank plan), against SLEB
    calibrated on the same source, on every domain: does it overfit its calibration text?"""
    rows = []
    for d in sorted((folder / "transfer").glob("*")):
        path = d / "compare" / "compare.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        worst = {(w["method"], w["level"]): w for w in data.get("worst_domain", [])}
        per = {}
        for c in data.get("comparisons", []):
            if c["b"] == "sleb" and c["a"] in TRANSFER_RULES:
                per.setdefault(c["a"], {})[c["dataset"]] = c
        fit = d / "fit.json"
        declined = fit.is_file() and json.loads(fit.read_text()).get("kept") == "orthogonal"
        rows.append((d.name, data, worst, per, declined))
    if not rows:
        return ""
    datasets = rows[0][1]["datasets"]
    if any("router-hybrid" in r[3] for r in rows):
        caption = ("Transfer at 20%: the router refitted on each calibration source (16 windows of 512 tokens of that "
                   "source) on the committed hybrid plan's selection layers, its removals held fixed (a hybrid search "
                   "per source takes hours on 2 cores), against the committed SLEB (mix 8K); paired ratio against SLEB "
                   "per domain and the worst domain [95% CI]:")
    else:
        caption = ("Transfer at 20%: the router fitted on each calibration source (one recording pass, 32 windows of "
                   "512 tokens of that source) on that source's OrthoRank plan, against SLEB calibrated on the same "
                   "source; paired ratio against SLEB per domain and the worst domain [95% CI]:")
    lines = ["", caption, "",
             "| source | rule | " + " | ".join(datasets) + " | worst domain |", "|---|---|" + "---|" * (len(datasets) + 1)]
    for source, data, worst, per, declined in rows:
        for rule in TRANSFER_RULES:
            w = worst.get((rule, 0.2))
            if w is None:
                continue
            cells = [_ci(per[rule][ds]["ratio"], *per[rule][ds]["ci95"]) if ds in per.get(rule, {}) else "-"
                     for ds in datasets]
            name = "paper" if rule == "orthorank" else rule
            if declined and rule.startswith("router"):  # the fit kept the paper's rule on held-out calibration text
                name += " (fit declined: the paper's rule, compute re-matched)"
            lines.append(f"| {source} | {name} | " + " | ".join(cells)
                         + f" | {_ci(w['ratio'], *w['ci95'])} ({w['worst_dataset']}) |")
    return "\n".join(lines) + "\n"


def _seeds(folder: Path) -> str:
    """The router refitted with other seeds (other calibration windows and held-out split), on the same windows. The
    20% router the model's claims rest on: on OrthoRank's layers, or on the hybrid plan's where it was fitted there."""
    hybrid = (folder / "compare-hybrid" / "compare.json").is_file()
    method = "router-hybrid" if hybrid else "router"
    first = folder / ("compare-hybrid" if hybrid else "compare") / "compare.json"
    runs = []
    for seed, path in [(0, first)] + [(int(d.name.split("-")[1]), d / "compare" / "compare.json")
                                       for d in sorted(folder.glob("seed-*"))]:
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        for w in data.get("worst_domain", []):
            if w["method"] == method and w["level"] == 0.2:
                fit = folder / (f"fit-{method}-0.2.json" if seed == 0 else f"seed-{seed}/fit.json")
                target = "-"
                if fit.is_file() and fit.read_text().strip():
                    target = json.loads(fit.read_text().strip().splitlines()[-1]).get("target", "-")
                runs.append((seed, target, w))
    if len(runs) < 2:
        return ""
    lines = ["", f"Seed spread at 20%, {method} (the fit repeated with other seeds: other calibration windows, "
             "held-out split and sampled labels; the same evaluation windows):", "",
             "| seed | target chosen | worst domain | worst-domain ratio vs SLEB [95% CI] | verdict |", "|---|---|---|---|---|"]
    for seed, target, w in runs:
        lines.append(f"| {seed} | {target} | {w['worst_dataset']} | {_ci(w['ratio'], *w['ci95'])} | {w['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", help="studies/router/<model> folders")
    p.add_argument("--out", required=True, help="the Markdown file to write")
    p.add_argument("--headline", help="also write the README's one-table summary to this Markdown file")
    args = p.parse_args(argv)
    text = "\n".join(model_section(Path(f)) for f in args.folders)
    atomic_write_text(Path(args.out), text)
    if args.headline:
        atomic_write_text(Path(args.headline), headline([Path(f) for f in args.folders]))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
