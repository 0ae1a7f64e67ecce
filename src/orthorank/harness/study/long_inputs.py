"""Which selection policy, by the evidence: the long-input fix and the default, decided from committed results.

Reads an `orthorank compare` result with policy rows (`--policies`), and `orthorank longctx` and `longbench`
results with the same policy variants, all at one level and on the same plan, and decides, from the paired
intervals only:

- the **long-input fix**: a policy variant that, at the plan's compute, is *not worse than SLEB* on every length of
  the long-context suite and on the LongBench slice (the paired difference's interval does not lie below 0) and
  *not worse than the paper's rule* on WikiText-2 and C4 (the paired perplexity ratio's interval does not lie
  above 1);
- the **default**: the paper's rule stays the default unless a variant is better than it on every perplexity
  domain (every ratio's interval below 1) and not worse than it on every long-context row.

    python -m orthorank.harness.study.long_inputs --compare C/compare.json --longctx L/longctx.json \\
        --longbench B/longbench.json --out DIR      # DIR/policy-choice.md and .json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.method.policies import POLICIES
from orthorank.method.registry import is_paper
from orthorank.harness.results import atomic_write_text

PAPER = "orthogonal"
FIX_DOMAINS = ("wikitext2", "c4")


def _load(path: str | Path, command: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if data.get("command") != command:
        raise UserError(f"{path} is not an `orthorank {command}` result")
    return data


def _spec_of_compare(row: str) -> str | None:
    """The rule of a compare row on the paper's plan: PAPER for the plan's own row, SPEC for its `(policy SPEC)`
    row, None for any other row."""
    m = re.fullmatch(r"(.+?) \(policy (.+)\)", row)
    if m is None:
        return PAPER if is_paper(row) else None
    return m.group(2) if is_paper(m.group(1)) else None


def _spec_of_generation(name: str) -> str | None:
    if not name.startswith("orthorank "):
        return None
    m = re.search(r"\[(.+)\]", name)
    return m.group(1) if m else PAPER


def _interval(d: dict | None) -> dict | None:
    return None if d is None else {k: d[k] for k in ("value", "low", "high") if k in d}


def perplexity_evidence(compare: dict, level: float) -> dict[str, dict[str, dict]]:
    """spec -> {"vs_paper": {dataset: ratio}, "vs_sleb": {dataset: ratio}} at `level`."""
    out: dict[str, dict[str, dict]] = {}
    for c in compare.get("comparisons", []):
        if c.get("a_level") != level:
            continue
        spec = _spec_of_compare(c["a"])
        if spec is None:
            continue
        ratio = {"value": c["ratio"], "low": c["ci95"][0], "high": c["ci95"][1]}
        if c["b"] == "orthorank" and spec != PAPER:
            out.setdefault(spec, {}).setdefault("vs_paper", {})[c["dataset"]] = ratio
        elif c["b"] == "sleb":
            out.setdefault(spec, {}).setdefault("vs_sleb", {})[c["dataset"]] = ratio
    return out


def generation_evidence(summary: dict[str, Any], label: str) -> dict[str, dict[str, dict]]:
    """spec -> {"vs_sleb": {label: diff}, "vs_paper": {label: diff}} from a longctx/longbench summary's pairs."""
    out: dict[str, dict[str, dict]] = {}
    for pair, groups in (summary.get("paired") or {}).items():
        a, _, b = pair.partition(" vs ")
        spec = _spec_of_generation(a)
        if spec is None or "mean" not in groups:
            continue
        if b.startswith("sleb"):
            out.setdefault(spec, {}).setdefault("vs_sleb", {})[label] = _interval(groups["mean"])
        elif b.startswith("orthorank") and _spec_of_generation(b) == PAPER:
            out.setdefault(spec, {}).setdefault("vs_paper", {})[label] = _interval(groups["mean"])
    return out


def _speeds_up(spec: str) -> bool:
    """False for a variant of a policy that runs the layer densely to choose (the oracle: an upper bound)."""
    name = spec.split("+")[0] or PAPER
    return POLICIES[name].speedup if name in POLICIES else True


def _merge(into: dict, more: dict) -> None:
    for spec, parts in more.items():
        for key, values in parts.items():
            into.setdefault(spec, {}).setdefault(key, {}).update(values)


def decide(compare: dict, longctx: dict | list[dict] | None, longbench: dict | None, level: float) -> dict[str, Any]:
    evidence = perplexity_evidence(compare, level)
    for one in ([longctx] if isinstance(longctx, dict) else longctx or []):
        for length, summary in one.get("summary", {}).items():
            _merge(evidence, generation_evidence(summary, f"suite {length}"))
    if longbench is not None:
        _merge(evidence, generation_evidence(longbench.get("summary", {}).get("tasks", {}), "longbench"))
    measured = {k for k in evidence.get(PAPER, {}).get("vs_sleb", {}) if k.startswith(("suite", "longbench"))}
    rows = []
    for spec in sorted(evidence, key=lambda s: (s != PAPER, s)):
        e = evidence[spec]
        gen_sleb = e.get("vs_sleb", {})
        gen_sleb = {k: v for k, v in gen_sleb.items() if k.startswith(("suite", "longbench"))}
        ppl_paper = {d: r for d, r in e.get("vs_paper", {}).items() if not d.startswith(("suite", "longbench"))}
        gen_paper = {k: v for k, v in e.get("vs_paper", {}).items() if k.startswith(("suite", "longbench"))}
        reasons = []
        if spec == PAPER:
            reasons.append("the rule being fixed")
        elif not _speeds_up(spec):
            reasons.append("runs the layers densely: no speed-up")
        if not gen_sleb:
            reasons.append("no long-context rows")
        reasons += [f"not measured on {k}" for k in sorted(measured - set(gen_sleb))]
        reasons += [f"worse than SLEB on {k}" for k, v in gen_sleb.items() if v["high"] < 0]
        if spec != PAPER:
            missing = [d for d in FIX_DOMAINS if d not in ppl_paper]
            reasons += [f"no {d} perplexity" for d in missing]
            reasons += [f"worse than the paper's rule on {d}" for d in FIX_DOMAINS
                        if d in ppl_paper and ppl_paper[d]["low"] > 1.0]
        fix = not reasons
        better_everywhere = (spec != PAPER and _speeds_up(spec) and bool(ppl_paper)
                             and all(r["high"] < 1.0 for r in ppl_paper.values()))
        default_ok = better_everywhere and all(v["high"] >= 0 for v in gen_paper.values())
        rows.append({"policy": spec, "fix": fix, "why_not": reasons, "default_candidate": default_ok,
                     "perplexity_vs_paper": ppl_paper,
                     "perplexity_vs_sleb": {d: r for d, r in e.get("vs_sleb", {}).items()
                                            if not d.startswith(("suite", "longbench"))},
                     "long_context_vs_sleb": gen_sleb, "long_context_vs_paper": gen_paper})
    fixes = [r["policy"] for r in rows if r["fix"]]
    defaults = [r["policy"] for r in rows if r["default_candidate"]]
    # Whether there is anything to fix: the paper's rule against SLEB on the same long-context rows
    paper = next((r for r in rows if r["policy"] == PAPER), None)
    paper_worse = None if paper is None or not paper["long_context_vs_sleb"] else sorted(
        k for k, v in paper["long_context_vs_sleb"].items() if v["high"] < 0)
    return {"level": level, "rows": rows, "fixes": fixes, "paper_worse_than_sleb_on": paper_worse,
            "default": defaults[0] if len(defaults) == 1 else PAPER,
            "default_reason": (f"{defaults[0]} is better than the paper's rule on every perplexity domain and not "
                               "worse on any long-context row" if len(defaults) == 1 else
                               "no variant is better than the paper's rule on every perplexity domain without "
                               "being worse on a long-context row" if not defaults else
                               f"several variants qualify ({', '.join(defaults)}); the paper's rule stays")}


def _fmt(r: dict | None, digits: str = ".3f", signed: bool = False) -> str:
    if r is None:
        return "-"
    f = ("+" if signed else "") + digits
    text = f"{format(r['value'], f)} [{format(r['low'], f)}, {format(r['high'], f)}]"
    excl = (r["low"] > 0 or r["high"] < 0) if signed else (r["low"] > 1 or r["high"] < 1)
    return f"**{text}**" if excl else text


def markdown(result: dict, caption: str) -> str:
    rows = result["rows"]
    domains = sorted({d for r in rows for d in r["perplexity_vs_paper"]} | {d for r in rows
                                                                           for d in r["perplexity_vs_sleb"]})
    gens = sorted({k for r in rows for k in r["long_context_vs_sleb"]})
    head = ["policy", *[f"{d} ppl / paper" for d in domains], *[f"{g} vs SLEB (points)" for g in gens],
            "long-input fix", "default candidate"]
    lines = [caption, "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [r["policy"] + (" (the paper)" if r["policy"] == PAPER else "")]
        cells += [_fmt(r["perplexity_vs_paper"].get(d)) if r["policy"] != PAPER else "1" for d in domains]
        cells += [_fmt(r["long_context_vs_sleb"].get(g), ".1f", signed=True) for g in gens]
        cells.append("yes" if r["fix"] else ("-" if r["policy"] == PAPER else "no: " + "; ".join(r["why_not"])))
        cells.append("yes" if r["default_candidate"] else "no")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Long-input fixes (not worse than SLEB on every long-context row, not worse than the paper's rule "
                  f"on {' and '.join(FIX_DOMAINS)}): {', '.join(result['fixes']) or 'none'}. Default: "
                  f"{result['default']} ({result['default_reason']})."]
    worse = result.get("paper_worse_than_sleb_on")
    if worse is not None:
        lines.append("The paper's rule itself is " + (f"worse than SLEB on {', '.join(worse)}." if worse else
                     "not worse than SLEB on any long-context row measured here: at this level and on these plans "
                     "there is no long-input loss to fix."))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", required=True)
    p.add_argument("--longctx", action="append", default=[], help="longctx.json (repeatable: one per length)")
    p.add_argument("--longbench", default=None)
    p.add_argument("--level", type=float, default=0.2)
    p.add_argument("--caption", default="")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        compare = _load(args.compare, "compare")
        longctx = [_load(path, "longctx") for path in args.longctx]
        longbench = _load(args.longbench, "longbench") if args.longbench else None
        result = decide(compare, longctx, longbench, args.level)
        text = markdown(result, args.caption or f"Selection policies at {args.level:g}, paired 95% intervals.")
        out = Path(args.out)
        atomic_write_text(out / "policy-choice.md", text + "\n")
        atomic_write_text(out / "policy-choice.json", json.dumps(result, indent=1) + "\n")
    except UserError as exc:
        print(f"long_inputs: error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
