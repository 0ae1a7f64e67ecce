"""The decode router's evidence (issue 58), from committed files: per model and level, the causal router's quality
against SLEB (the worst-domain perplexity ratio of `compare`, with its interval and verdict), its decode speed against
SLEB's and dense's (paired per-round ratios of `bench --mode decode`, bootstrap intervals over rounds), the share of
decoded tokens its selection layers updated, and the answer to "does the decode router beat SLEB at SLEB's decode
speed here?", computed by the rule below.

    python -m orthorank.harness.reports.decode_router studies/decode-router --out studies/decode-router/summary.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orthorank.harness.evaluation.longctx import fmt_diff, grouped, summarize as score_summary
from orthorank.harness.reports.speed import paired_ratio
from orthorank.harness.results import atomic_write_text

CAUSAL = ("router-searched-causal", "router-causal")

# The answer's rule, fixed before the runs it judges. Yes only where both intervals say so: the causal plan's
# worst-domain perplexity ratio to SLEB lies wholly below 1 (better on every domain), and its batch-1 decode speed is
# not measured slower than SLEB's: faster, or level. No where either interval says the opposite (worse somewhere, or
# slower). Otherwise not decided.
# "Level" was first any interval reaching 1. The first noisy runs (SmolLM2-135M at 10%: 0.967 [0.716, 1.181]) showed
# that this calls a plan up to 28% slower "at SLEB's speed", so level now also needs the interval's lower bound at
# LEVEL_MARGIN or above (at most 5% slower); a wider interval is "unresolved", and more rounds decide it.
YES, NO, UNDECIDED = "yes", "no", "not decided"
LEVEL_MARGIN = 0.95
REPLICATE = "replicate"  # a second run of a bench, beside the first: studies/decode-router/<model>/replicate/


def answer(quality: str, speed: str | None) -> str:
    """quality: compare's worst-domain verdict against SLEB; speed: faster / level / unresolved / slower against SLEB
    at batch 1 (None: not measured)."""
    if quality == "higher somewhere" or speed == "slower":
        return NO
    if quality == "lower everywhere" and speed in ("faster", "level"):
        return YES
    return UNDECIDED


@dataclass(frozen=True)
class Speed:
    ratio: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        if self.low > 1:
            return "faster"
        if self.high < 1:
            return "slower"
        return "level" if self.low >= LEVEL_MARGIN else "unresolved"

    def to_json(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "ci95": [self.low, self.high], "verdict": self.verdict}

    def cell(self) -> str:
        return f"{_cell(self.ratio, self.low, self.high, 'x')} {self.verdict}"


def _cell(value: float, low: float, high: float, unit: str = "") -> str:
    return f"{value:.3f}{unit} [{low:.3f}, {high:.3f}]"


def speed(run: dict[str, Any], row: str, reference: str) -> Speed | None:
    """Throughput row / reference: reference's times over row's, paired by round."""
    by = {m["method"]: m for m in run["methods"]}
    if row not in by or reference not in by:
        return None
    return Speed(*paired_ratio(by[reference]["timing"]["times_s"], by[row]["timing"]["times_s"]))


def decode_runs(folder: Path, level: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(run, causal row) of every decode run of `bench-decode-<level>-b*-n*.json` in folder and in its `replicate/`
    folder (a second run of the same bench; the run is marked `replicate`), batch 1 first."""
    out = []
    for path in sorted(folder.glob(f"bench-decode-{level}-b*-n*.json")) + sorted(
            (folder / REPLICATE).glob(f"bench-decode-{level}-b*-n*.json")):
        for run in json.loads(path.read_text()).get("runs", []):
            row = next((m for m in run.get("methods", []) if m["method"] in CAUSAL), None)
            if run.get("mode") == "decode" and row is not None:
                out.append(({**run, "replicate": path.parent.name == REPLICATE}, row))
    return sorted(out, key=lambda pair: (pair[0]["batch"], pair[0]["new_tokens"], pair[0]["replicate"]))


def combined_speed(verdicts: list[str]) -> str | None:
    """One verdict for every run of a bench: slower where any run is slower; faster or level only where every run
    is; otherwise unresolved (so a replicate can take a win away, never give one)."""
    if not verdicts:
        return None
    if "slower" in verdicts:
        return "slower"
    if all(v == "faster" for v in verdicts):
        return "faster"
    return "level" if all(v in ("faster", "level") for v in verdicts) else "unresolved"


def _fmt(s: Speed | None) -> str:
    return "-" if s is None else s.cell()


def level_evidence(folder: Path, compare: Path) -> dict[str, Any] | None:
    """The evidence of one level: compare.json's worst-domain row of the causal plan against SLEB, the decode runs
    beside it, and the answer (None where the comparison holds no causal row)."""
    level = re.sub(r"^compare-", "", compare.parent.name)
    data = json.loads(compare.read_text())
    worst = next((w for w in data.get("worst_domain", []) if w["method"] in CAUSAL and w["vs"] == "sleb"), None)
    if worst is None:
        return None
    windows = data["windows"]
    sizes = sorted(set(windows.values())) if isinstance(windows, dict) else [windows]
    decode = []
    for run, row in decode_runs(folder, level):
        decode.append({"batch": run["batch"], "new_tokens": run["new_tokens"], "rounds": run.get("repeats"),
                       "replicate": run["replicate"],
                       "vs_sleb": speed(run, row["method"], "sleb"), "vs_dense": speed(run, row["method"], "dense"),
                       "sleb_vs_dense": speed(run, "sleb", "dense"), "share": row.get("decoded_tokens_updated")})
    batch1 = combined_speed([d["vs_sleb"].verdict for d in decode if d["batch"] == 1 and d["vs_sleb"] is not None])
    return {"level": level, "method": worst["method"], "worst": worst, "domains": len(worst["datasets"]),
            "windows": "/".join(map(str, sizes)), "seq_len": data["seq_len"], "decode": decode,
            "fit": fit_record(data.get("plans", [])),
            "answer": answer(worst["verdict"], batch1)}


def fit_record(plans: list[dict[str, Any]]) -> dict[str, Any] | None:
    """From the causal plan's provenance: the router's and the thresholds' fitting seconds, and whether the router
    was forced (`fit-router --always-route`: kept though the paper's rule had the lower held-out calibration NLL)."""
    plan = next((p for p in plans if "thresholds_fit" in p.get("provenance", {})), None)
    if plan is None:
        return None
    prov = plan["provenance"]
    router = prov.get("router_fit", {})
    nll = router.get("held_out_nll", {})
    forced = router.get("kept") == "router" and nll.get("router", 0.0) > nll.get("orthogonal", float("inf"))
    return {"search_seconds": prov.get("search_seconds"), "router_seconds": router.get("seconds"),
            "thresholds_seconds": prov["thresholds_fit"].get("seconds"), "forced": forced}


def _fit_text(fit: dict[str, Any] | None) -> str:
    if not fit:
        return ""
    parts = [f"{fit[k]:.0f} s" if fit.get(k) is not None else "-"
             for k in ("search_seconds", "router_seconds", "thresholds_seconds")]
    forced = (" The router was forced (`fit-router --always-route`): on held-out calibration windows the paper's "
              "rule was better, but it is not causal." if fit["forced"] else "")
    return f" Fitting on 2 cores: layer search {parts[0]}, router {parts[1]}, thresholds {parts[2]}.{forced}"


def _rounds(d: dict[str, Any]) -> str:
    return (f", {d['rounds']} rounds" if d.get("rounds") else "") + (", replicate" if d.get("replicate") else "")


def level_lines(name: str, ev: dict[str, Any]) -> list[str]:
    w = ev["worst"]
    lo, hi = w["ci95"]
    lines = [f"**{name} at {ev['level']}** ({ev['method']}, {ev['domains']} domains x {ev['windows']} windows of "
             f"{ev['seq_len']} tokens): worst-domain ratio to SLEB {_cell(w['ratio'], lo, hi)} on "
             f"{w['worst_dataset']}: {w['verdict']}. Better than SLEB at SLEB's batch-1 decode speed: "
             f"**{ev['answer']}**.{_fit_text(ev.get('fit'))}", ""]
    if ev["decode"]:
        lines += ["| decode | causal vs SLEB | causal vs dense | SLEB vs dense | share updated |",
                  "|---|---|---|---|---|"]
        lines += [f"| batch {d['batch']}, {d['new_tokens']} new tokens{_rounds(d)} | {_fmt(d['vs_sleb'])} | {_fmt(d['vs_dense'])} "
                  f"| {_fmt(d['sleb_vs_dense'])} | {'-' if d['share'] is None else format(d['share'], '.3f')} |"
                  for d in ev["decode"]]
        lines.append("")
    return lines


CAPTION = ("Causal router decoding against SLEB (issue 58). Quality: worst-domain perplexity ratio to SLEB over the "
           "domains compared (windows no fit or search saw; below 1 = better; a causal plan's teacher-forced "
           "perplexity is its generation's). Speed: decode throughput ratios, median of paired interleaved rounds "
           "with a bootstrap 95% interval (faster / slower: the whole interval above / below 1; level: it reaches 1 "
           f"and its lower bound is at least {LEVEL_MARGIN}; unresolved: wider), on prompts of "
           "calibration text; share: decoded tokens its selection layers updated; a replicate is a second run of the same "
           "bench. The answer is yes only where the worst-domain interval lies below 1 and batch 1 is faster than SLEB "
           "or level with it in every run; no where either interval says the opposite in any run; otherwise not "
           "decided.")


def folder_lines(folder: Path, name: str) -> list[str]:
    """Every level compared in folder (compare-<level>/compare.json beside bench-decode-<level>-*.json)."""
    lines: list[str] = []
    for cmp in sorted(folder.glob("compare-*/compare.json")):
        ev = level_evidence(folder, cmp)
        if ev is not None:
            lines += level_lines(name, ev)
    return lines


COMPILE = "compile"  # eager and torch.compile decoding side by side: studies/decode-router/<model>/compile/
COMPILE_CAPTION = ("Decoding under torch.compile with a static cache, beside eager decoding (bench --decode-impl "
                   "eager,compile: the same prompts, each implementation's rounds interleaved across methods, eager's "
                   "first). Within an implementation: paired throughput ratios with bootstrap intervals, verdicts as "
                   "above. Compile's gain: a method's eager median time over its compiled one (the two run one after "
                   "the other, so not paired).")


def compile_lines(folder: Path, name: str) -> list[str]:
    """Per bench in folder/compile/: one row per decode implementation and causal plan, and compile's gain."""
    lines: list[str] = []
    for path in sorted((folder / COMPILE).glob("bench-decode-*-b*-n*.json")):
        data = json.loads(path.read_text())
        runs = [r for r in data.get("runs", []) if r.get("mode") == "decode"]
        medians = {r.get("decode_impl"): {m["method"]: m["timing"]["median_s"] for m in r["methods"]} for r in runs}
        if not runs:
            continue
        r0 = runs[0]
        lines += [f"**{name} at {data.get('sparsity')}**, batch {r0['batch']}, {r0['new_tokens']} new tokens after "
                  f"{r0['seq_len']}-token prompts, {r0.get('repeats')} rounds per implementation:", "",
                  "| implementation | method | vs dense | vs SLEB | compile's gain (eager / compiled) |",
                  "|---|---|---|---|---|"]
        for run in runs:
            impl = run.get("decode_impl")
            for m in run["methods"]:
                if m["method"] not in CAUSAL and m["method"] != "sleb":
                    continue
                gain = "-"
                if impl == "compile" and "eager" in medians and m["method"] in medians["eager"]:
                    gain = f"{medians['eager'][m['method']] / m['timing']['median_s']:.3f}x"
                vs_sleb = "-" if m["method"] == "sleb" else _fmt(speed(run, m["method"], "sleb"))
                lines.append(f"| {impl} | {m['method']} | {_fmt(speed(run, m['method'], 'dense'))} | {vs_sleb} | "
                             f"{gain} |")
            if impl == "compile" and "dense" in medians.get("eager", {}):
                lines.append(f"| {impl} | dense | - | - | {medians['eager']['dense'] / medians['compile']['dense']:.3f}x |")
        lines.append("")
    return lines


LONGCTX_CAPTION = ("Long-context answers under causal decoding (`studies/decode-router/longctx.sh`: the offline suite, "
                   "each plan under the decode policy it is deployed with). Mean score over every item (%), 95% "
                   "bootstrap interval; the causal plan minus each other row, paired item by item (percentage points; "
                   "** = the interval excludes 0). A slice: the items named in each heading.")


def longctx_lines(folder: Path, name: str) -> list[str]:
    """Per longctx-*/longctx.json in folder: every row's mean score, and the causal row paired with each other."""
    lines: list[str] = []
    for path in sorted(folder.glob("longctx-*/longctx.json")):
        data = json.loads(path.read_text())
        items = data["items"]
        causal = next((r["name"] for r in data["rows"] if r.get("decode") == "causal"), None)
        if causal is None:
            continue
        scores = {row: grouped(items[row], lambda key: "mean") for row in items}
        lines += [f"**{name} at {data['sparsity']}**, {len(scores[causal]['mean'])} items at "
                  f"{', '.join(map(str, data['lengths']))} tokens ({', '.join(data['tasks'])}):", "",
                  f"| row | mean score | {causal} minus it |", "|---|---|---|"]
        for row in items:
            mine = score_summary(scores[row])["mean"]
            diff = "-" if row == causal else fmt_diff(score_summary(scores[causal], scores[row])["mean"])
            lines.append(f"| {row} | {mine['mean']:.1f} [{mine['low']:.1f}, {mine['high']:.1f}] | {diff} |")
        lines.append("")
    return lines


def summarize(root: Path) -> str:
    """One section per model folder under root, then the compiled-decoding benches."""
    lines = [CAPTION, ""]
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    for folder in folders:
        lines += folder_lines(folder, folder.name)
    compiled = [line for folder in folders for line in compile_lines(folder, folder.name)]
    if compiled:
        lines += [COMPILE_CAPTION, "", *compiled]
    answers = [line for folder in folders for line in longctx_lines(folder, folder.name)]
    if answers:
        lines += [LONGCTX_CAPTION, "", *answers]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    atomic_write_text(args.out, summarize(args.root))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
