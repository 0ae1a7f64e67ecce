"""The policies stage: how good is the paper's rule, and which rule to use on long inputs?

At the budget's levels, on the study's own plans (OrthoRank's layers and keep ratio for every rule, so every
rule has OrthoRank's compute; the oracle runs its selection layers densely to choose and is never a speed-up):

- `compare --policies ... --zeroshot`: perplexity on every domain and zero-shot accuracy per rule, paired against
  the paper's rule and against SLEB, and the headroom table, the share of the oracle's gain over random selection a
  rule captures, (ppl_random - ppl_rule) / (ppl_random - ppl_oracle), with its interval;
- `longctx --policies ...` (the offline suite at the budget's lengths) and `longbench --policies ...` (the first
  examples of multi_news), paired against SLEB and the paper's rule;
- the decision of `study.long_inputs` from those intervals: which variant is a long-input fix (not worse than SLEB
  on every long-context row, not worse than the paper's rule on WikiText-2 and C4) and whether the default moves.

DIR/policies/<level>/ holds each command's output and policy-choice.{md,json}; DIR/policies/policies.{md,json}
gathers them (the stage is finished when policies.json exists), and DIR/policies/headroom.md puts the levels side by
side: the perplexity of SLEB, the paper's rule, random selection and the oracle, and each rule's share. It runs only
when named (`--stages policies`): hours per model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orthorank.harness.api.options import CompareOptions, LongbenchOptions, LongctxOptions, Options
from orthorank.method.plan_store import sparsity_label
from orthorank.method.registry import is_paper
from orthorank.harness.results import atomic_write_text
from orthorank.harness.study.budgets import DOMAINS, ZEROSHOT_TASKS
from orthorank.harness.study.context import StudyContext
from orthorank.harness.study.long_inputs import decide, markdown

def level_dir(ctx: StudyContext, level: float) -> Path:
    return ctx.out / "policies" / sparsity_label(level)


def policies_output(ctx: StudyContext) -> Path:
    return ctx.out / "policies" / "policies.json"


def policies_calls(ctx: StudyContext) -> list[Options]:
    b, p = ctx.budget, ctx.budget.policies
    specs = ",".join(p.policies)
    calls: list[Options] = []
    for level in p.levels:
        d = level_dir(ctx, level)
        rows = {"methods": "dense,sleb,orthorank", "plans_dir": str(ctx.plans_dir), "policies": specs,
                "overwrite": True}
        calls += [
            ctx.options(CompareOptions, **rows, sparsity=sparsity_label(level), datasets=",".join(DOMAINS),
                        seq_len=b.ppl_seq_len, max_windows=b.ppl_windows, zeroshot=True,
                        tasks=",".join(ZEROSHOT_TASKS), limit=b.zeroshot_limit, out=str(d / "compare")),
            ctx.options(LongctxOptions, **rows, sparsity=level, lengths=p.lengths, samples=p.samples,
                        tasks=",".join(p.tasks), decode_modes="dense", out=str(d / "longctx")),
            ctx.options(LongbenchOptions, **rows, sparsity=level, tasks="multi_news", limit=p.longbench_limit,
                        decode_modes="dense", max_length=p.longbench_max_length, out=str(d / "longbench")),
        ]
    return calls


def level_choice(ctx: StudyContext, level: float) -> tuple[dict[str, Any], str]:
    """Decide one level from its three results and write DIR/policies/<level>/policy-choice.{md,json}; the level's
    entry of policies.json and the decision's Markdown. The stage calls it for every level at its end; it needs only
    that level's results, so a level can be decided by hand before the other one has run."""
    b, d = ctx.budget, level_dir(ctx, level)
    compare = json.loads((d / "compare" / "compare.json").read_text())
    longctx = json.loads((d / "longctx" / "longctx.json").read_text())
    longbench = json.loads((d / "longbench" / "longbench.json").read_text())
    result = decide(compare, [longctx], longbench, level)
    caption = (f"Selection policies at {level:g} on {ctx.model_name}: perplexity ratio to the paper's rule "
               f"({b.ppl_windows} windows of {b.ppl_seq_len} tokens per domain); paired difference to SLEB on "
               f"the long-context suite and LongBench ({b.policies.caption()}); paired 95% intervals, ** = "
               "excludes no difference.")
    text = markdown(result, caption)
    atomic_write_text(d / "policy-choice.md", text + "\n")
    atomic_write_text(d / "policy-choice.json", json.dumps(result, indent=1) + "\n")
    return {"headroom": compare.get("headroom"), "choice": result, "worst_domain": compare.get("worst_domain")}, text


def write_headroom(ctx: StudyContext, levels: list[float]) -> Path:
    """DIR/policies/headroom.md from the levels whose compare has run."""
    compares = {level: json.loads((level_dir(ctx, level) / "compare" / "compare.json").read_text())
                for level in levels}
    caption = (f"{ctx.model_name}, {ctx.budget.caption()}: every rule on OrthoRank's own plan at each level (its "
               "layers and keep ratio, so OrthoRank's compute); the oracle runs those layers densely to choose (an "
               "upper bound, never a speed-up)")
    path = ctx.out / "policies" / "headroom.md"
    atomic_write_text(path, headroom_markdown(compares, caption) + "\n")
    return path


def finish_policies(ctx: StudyContext) -> dict[str, Any]:
    """Decide per level from the three results, and gather the headroom tables and the decisions."""
    b = ctx.budget
    levels, lines = {}, [f"# Selection policies: {ctx.model_name}", "",
                         f"{b.caption()}; {b.policies.caption()}. Every rule runs on OrthoRank's own plan at each "
                         "level (its layers and keep ratio: equal compute), except the oracle, which runs the "
                         "selection layers densely to choose (an upper bound, never a speed-up).", ""]
    for level in b.policies.levels:
        d = level_dir(ctx, level)
        levels[sparsity_label(level)], text = level_choice(ctx, level)
        lines += [f"## {level:g} sparsity", "", (d / "compare" / "compare.md").read_text().strip(), "", text, ""]
    atomic_write_text(ctx.out / "policies" / "policies.md", "\n".join(lines).rstrip() + "\n")
    write_headroom(ctx, list(b.policies.levels))
    data = {"model": ctx.model_name, "budget": b.name, "levels": levels}
    atomic_write_text(policies_output(ctx), json.dumps(data, indent=1, default=str) + "\n")
    return data


_BOUNDS = ("sleb", "orthorank", "orthorank (policy random)", "orthorank (policy oracle)")


def _label(method: str) -> str:
    return f"{method} (the paper's rule)" if is_paper(method) else method


def _with_ci(value: float | None, ci: list[float]) -> str:
    return "-" if value is None else f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def headroom_markdown(compares: dict[float, dict[str, Any]], caption: str) -> str:
    """Two tables across levels: the perplexity of SLEB, the paper's rule, random and the oracle (what the shares
    are measured between), then each rule's share of the oracle's headroom, both with 95% intervals."""
    datasets = list(dict.fromkeys(d for c in compares.values() for d in c.get("datasets", [])))
    ppl = [f"Perplexity at each level ({caption}; 95% bootstrap intervals over windows):", "",
           "| row | level | " + " | ".join(datasets) + " |", "|---|---|" + "---|" * len(datasets)]
    share = ["Share of the oracle's headroom over random selection, (ppl_random - ppl_rule) / (ppl_random - "
             "ppl_oracle), paired 95% bootstrap interval over the same windows (1 = the oracle, 0 = random):", "",
             "| rule | level | " + " | ".join(datasets) + " |", "|---|---|" + "---|" * len(datasets)]
    for level, c in compares.items():
        rows = {(r["method"], r["level"]): r for r in c.get("rows", [])}
        for method in _BOUNDS:
            r = rows.get((method, level))
            if r is None:
                continue
            cells = [_with_ci(r[d]["perplexity"], r[d]["ci95"]) if d in r else "-" for d in datasets]
            ppl.append(f"| {_label(method)} | {level:g} | " + " | ".join(cells) + " |")
        by_rule: dict[str, dict[str, dict]] = {}
        for h in c.get("headroom") or []:
            if h["level"] == level:
                by_rule.setdefault(h["method"], {})[h["dataset"]] = h
        for method, by_d in by_rule.items():
            cells = [_with_ci(by_d[d]["share"], by_d[d]["ci95"]) if d in by_d else "-" for d in datasets]
            share.append(f"| {_label(method)} | {level:g} | " + " | ".join(cells) + " |")
    return "\n".join(ppl + [""] + share)
