"""`orthorank selection-map`: which tokens of a long prompt each layer of a plan updates, with the instruction,
the needle(s) and the question marked. Writes DIR/selection-map.json and one PNG per map; `orthorank analyze
--selection-map DIR/selection-map.json` puts them in the analysis report.

    orthorank selection-map --method orthorank --sparsity 0.2 --prompts needle:2k,longbench:multi_news --out DIR
    orthorank selection-map --plan PLAN.json --policies orthogonal,orthogonal+recent=64 --out DIR
"""

from __future__ import annotations

import json
from pathlib import Path

from orthorank.harness.api.common import (
    check_plan_options,
    load_model_from_options,
    plan_for,
    saved_plan_path,
    variants_without_decode,
)
from orthorank.harness.api.options import SelectionMapOptions
from orthorank.errors import UserError
from orthorank.harness.evaluation.compare import policy_plans
from orthorank.harness.evaluation.data import find_data_dir
from orthorank.harness.evaluation.longbench import load_task, prompt_text
from orthorank.harness.evaluation.longctx_suite import SuiteBuilder, load_pools, parse_lengths
from orthorank.harness.results import atomic_write_bytes, atomic_write_text, check_writable, write_json

MAP_JSON = "selection-map.json"


MAX_FIGURES = 8  # figures: the first map of each prompt kind and policy, at most this many; every map is in the JSON


def _aggregate(maps, model: str) -> str:
    """A Markdown table of means over the prompts of one kind and policy (e.g. 20 needle prompts)."""
    groups: dict[tuple[str, str], list] = {}
    for m in maps:
        kind = m.name.split(" #")[0]
        label = m.name.split("[")[-1].rstrip("]") if "[" in m.name else "the plan's"
        groups.setdefault((kind, label), []).append(m.summary())
    spans = sorted({k for s in (x for v in groups.values() for x in v) for k in s["span_share_updated"]})
    head = ["prompts", "policy", "n", "last token updated in (of the selection layers)", "all tokens",
            *[f"{k} tokens" for k in spans]]
    lines = [f"Share of tokens each selection layer updates, mean over the prompts; {model}, plan "
             f"{maps[0].plan.get('source') or maps[0].plan.get('method')}.", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for (kind, label), sums in groups.items():
        n = len(sums)
        cells = [kind, label, str(n), f"{sum(s['last_token_updated_in'] for s in sums) / n:.1f} of "
                 f"{sums[0]['selection_layers']}", f"{sum(s['overall_share_updated'] for s in sums) / n:.2f}"]
        for k in spans:
            have = [s["span_share_updated"][k]["mean"] for s in sums if k in s["span_share_updated"]]
            cells.append(f"{sum(have) / len(have):.2f}" if have else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _needle(lm, spec: list[str], data_dir):
    # lazily: orthorank.harness.analysis imports matplotlib
    from orthorank.harness.analysis.selection_map import needle_spans, tokenize_with_spans

    if len(spec) not in (2, 3):
        raise UserError("write needle:LENGTH[:INDEX or FIRST-LAST], e.g. needle:2k or needle:2k:0-19")
    length = parse_lengths(spec[1])[0]
    builder = SuiteBuilder(lm.tokenizer, load_pools(data_dir))
    out = []
    for index in _indices(spec):
        sample = builder.sample("niah_single", length, index)
        ids, spans = tokenize_with_spans(lm.tokenizer, sample.prompt, needle_spans(sample.prompt))
        out.append((f"niah_single {length} #{index}", ids, spans))
    return out


def _indices(spec: list[str]) -> list[int]:
    if len(spec) < 3:
        return [0]
    first, _, last = spec[2].partition("-")
    if not first.isdigit() or (last and not last.isdigit()) or (last and int(last) < int(first)):
        raise UserError(f"the example index {spec[2]!r} is not a whole number or a range FIRST-LAST")
    return list(range(int(first), int(last or first) + 1))


def _index(spec: list[str], default: int | None) -> int | None:
    if len(spec) < 3:
        return default
    if not spec[2].isdigit():
        raise UserError(f"the example index {spec[2]!r} is not a whole number")
    return int(spec[2])


def _longbench(lm, spec: list[str], data_dir, max_tokens: int):
    # lazily: orthorank.harness.analysis imports matplotlib
    from orthorank.harness.analysis.selection_map import template_spans, tokenize_with_spans

    if len(spec) not in (2, 3):
        raise UserError("write longbench:TASK[:INDEX], e.g. longbench:multi_news")
    root = Path(data_dir) if data_dir else find_data_dir()
    if root is None:
        raise UserError("LongBench files not found: pass --data-dir")
    task = load_task(Path(root) / "longbench" if (Path(root) / "longbench").is_dir() else Path(root), spec[1])
    wanted = _index(spec, None)
    for i, row in enumerate(task.rows):
        if wanted is not None and i != wanted:
            continue
        text = prompt_text(lm.tokenizer, task, row, max_length=max_tokens, chat=True)
        inner = task.prompt.format(**row)
        if inner not in text:  # truncated
            if wanted is not None:
                raise UserError(f"{spec[1]} example {i} does not fit {max_tokens} tokens; raise --max-tokens")
            continue
        chat = text != inner  # the chat template spells its special tokens; a bare prompt gets the tokenizer's
        ids, spans = tokenize_with_spans(lm.tokenizer, text, template_spans(text, inner, row["context"]),
                                         add_special_tokens=not chat)
        return f"{task.name} #{i}", ids, spans
    raise UserError(f"no {spec[1]} example fits {max_tokens} tokens untruncated; raise --max-tokens")


def _unknown_prompt(part: str) -> str:
    return f"unknown prompt {part!r}; use needle:LENGTH[:INDEX] or longbench:TASK[:INDEX]"


def check_prompt_kinds(text: str) -> None:
    """The kinds of --prompts, before the model loads (their lengths and tasks are read with the data)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UserError("--prompts names no prompt")
    for part in parts:
        if part.split(":")[0] not in ("needle", "longbench"):
            raise UserError(_unknown_prompt(part))


def _prompts(lm, text: str, data_dir, max_tokens: int):
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        spec = part.split(":")
        if spec[0] == "needle":
            out.extend(_needle(lm, spec, data_dir))
        elif spec[0] == "longbench":
            out.append(_longbench(lm, spec, data_dir, max_tokens))
        else:
            raise UserError(_unknown_prompt(part))
    if not out:
        raise UserError("--prompts names no prompt")
    return out


def run(opts: SelectionMapOptions) -> int:
    from orthorank.harness.analysis.plots import selection_map_png  # lazily: orthorank.harness.analysis imports matplotlib
    from orthorank.harness.analysis.selection_map import take_map  # lazily: orthorank.harness.analysis imports matplotlib

    out = Path(opts.out)
    check_writable(out / MAP_JSON, opts.overwrite)
    policies = variants_without_decode(opts.policies, "selection-map", "maps the prompt's prefill, which no "
                                       "decode policy changes") if opts.policies else None
    check_plan_options(opts)
    check_prompt_kinds(opts.prompts)
    saved = saved_plan_path(opts)
    lm = load_model_from_options(opts)
    if lm.tokenizer is None:
        raise UserError("the selection map needs a real model with a tokenizer")
    plan = plan_for(opts, lm, saved)
    if plan.selection is None:
        raise UserError(f"a {plan.method} plan selects no tokens; map an orthorank or hybrid plan")
    plan.provenance.setdefault("file", str(saved or opts.plan or ""))
    variants = [("plan", plan)] if not policies else [(spec, p) for spec, (_, p) in
                                                       zip(policies, policy_plans(plan, policies))]
    maps = []
    for name, ids, spans in _prompts(lm, opts.prompts, opts.data_dir, opts.max_tokens):
        for label, variant in variants:
            m = take_map(lm.model, variant, ids, spans, name if label == "plan" else f"{name} [{label}]")
            maps.append(m)
            s = m.summary()
            shares = ", ".join(f"{k} {v['mean']:.2f}" for k, v in s["span_share_updated"].items())
            print(f"{m.name}: {m.tokens} tokens; share updated per selection layer: all {s['overall_share_updated']:.2f}"
                  f", {shares}; last token updated in {s['last_token_updated_in']} of {s['selection_layers']} "
                  "selection layers")
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    summary = _aggregate(maps, lm.name)
    print(summary)
    atomic_write_text(out / "summary.md", summary + "\n")
    firsts: dict[tuple[str, str], object] = {}
    for m in maps:
        firsts.setdefault((m.name.split(" #")[0], m.name.split("[")[-1] if "[" in m.name else ""), m)
    for i, m in enumerate(list(firsts.values())[:MAX_FIGURES]):
        path = out / f"selection-map-{i}.png"
        atomic_write_bytes(path, selection_map_png(m, lm.name))
        figures.append(path.name)
    write_json(out / MAP_JSON, {"command": "selection-map", "model": lm.name, "maps": [m.to_dict() for m in maps],
                                "figures": figures}, device=lm.device, overwrite=True)
    print(f"wrote {out / MAP_JSON} and {len(figures)} figure(s)")
    return 0


def load_maps(path: str | Path) -> list:
    """The maps of a selection-map JSON (for the analysis report)."""
    from orthorank.harness.analysis.selection_map import SelectionMap  # lazily: orthorank.harness.analysis imports matplotlib

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read the selection map {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("command") != "selection-map":
        raise UserError(f"{path} is not an `orthorank selection-map` result")
    return [SelectionMap.from_dict(m) for m in data.get("maps", [])]
