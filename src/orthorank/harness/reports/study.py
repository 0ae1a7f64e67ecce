"""One self-contained page per study (DIR/report.html, with DIR/study.json holding everything it shows), and one
summary across studies (claims x models).

The page has no scripts and no external references: figures are inlined PNGs, tables are the commands' own Markdown
tables turned into HTML, so it opens offline in any browser.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

from orthorank.errors import UserError
from orthorank.harness.results import atomic_write_text
from orthorank.harness.evaluation.claims import (CONTRADICTED, INCONCLUSIVE, NO_DIFFERENCE, SUPPORTED, claim_interval_text,
                                     headline)

_COLORS = {SUPPORTED: "#d9f2d9", CONTRADICTED: "#f9d6d5", NO_DIFFERENCE: "#eeeeee", INCONCLUSIVE: "#fff3cd"}
_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#f4f4f4}h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}h3{font-size:1em}
.caption{color:#555;font-size:13px;max-width:1100px}img{max-width:100%;border:1px solid #eee}
.verdict{font-weight:600}code{background:#f4f4f4;padding:0 3px}"""

# stage folder -> (section title, markdown files, figures)
SECTIONS = [
    ("perplexity", "Perplexity on every domain", ["compare.md"], ["compare.png"]),
    ("zeroshot", "Zero-shot accuracy", ["compare.md"], []),
    ("longctx-*", "Long inputs (offline suite)", ["longctx.md"], ["longctx.png"]),
    ("speed", "Prefill and decode speed", ["*.md"], []),
    ("decode", "Decode policies: continuation perplexity through the KV cache", ["compare.md"], []),
    ("hybrid", "Hybrid frontier", ["compare.md"], ["frontier.png", "compare.png"]),
    ("router", "The router policy (beyond the paper): fitted on calibration text, against SLEB and the paper's rule",
     ["compare.md"], ["compare.png"]),
    ("router/hybrid", "The router on the hybrid plans' selection layers, against SLEB at the same compute",
     ["compare.md"], []),
    ("decode-router", "The causal router (beyond the paper): decoding per token against SLEB at SLEB's decode speed",
     ["summary.md"], []),
    ("transfer", "Transfer: plans calibrated on one source, evaluated on every domain", ["transfer.md"],
     ["transfer-*.png"]),
    ("policies", "Selection policies: the oracle's headroom and long inputs per rule", ["policies.md"], []),
    ("long-prompt", "Long prompts: the retrieval frontier (prefill speed-up against needle score, free speed-ups)",
     ["frontier.md"], ["frontier-*.png"]),
    ("sink", "Attention-sink analysis", [], ["*.png"]),
]


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def markdown_to_html(md: str) -> str:
    """The Markdown the commands write: headings, pipe tables, paragraphs."""
    out, table, para = [], [], []

    def flush():
        if para:
            out.append(f"<p class='caption'>{_inline(' '.join(para))}</p>")
            para.clear()
        if table:
            rows = [r for r in table if not re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*", r)]
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
            head, body = cells[0], cells[1:]
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            if para:
                flush()
            table.append(line)
            continue
        if table:
            flush()
        m = re.match(r"(#+)\s+(.*)", line)
        if m:
            flush()
            level = min(len(m.group(1)) + 2, 4)
            out.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
        elif not line.strip():
            flush()
        else:
            para.append(line.strip())
    flush()
    return "\n".join(out)


def _img(path: Path, figure: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    name = html.escape(figure, quote=True)
    return f'<p><img data-figure="{name}" src="data:image/png;base64,{data}" alt="{name}"></p>'


def claims_table(claims: list[dict[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(c['group'])}</td><td>{html.escape(c['claim'])}</td><td>{html.escape(c['setting'])}</td>"
        f"<td>{html.escape(c['measure'])}</td><td>{claim_interval_text(c)}</td><td>{html.escape(c['n'])}</td>"
        f"<td class='verdict' style='background:{_COLORS[c['verdict']]}'>{c['verdict']}</td></tr>" for c in claims)
    return ("<table id='claims'><tr><th>group</th><th>claim</th><th>setting</th><th>measure</th>"
            "<th>value [95% CI]</th><th>over</th><th>verdict</th></tr>" + rows + "</table>")


def write_study_report(out: Path, study: dict[str, Any]) -> Path:
    """DIR/study.json and DIR/report.html from the finished stages."""
    claims = study["claims"]
    atomic_write_text(out / "study.json", json.dumps(study, indent=1, default=str) + "\n")
    parts = [f"<h1>OrthoRank study: {html.escape(study['model'])}</h1>",
             f"<p class='caption'>{html.escape(study['loaded'])}<br>{html.escape(study['budget_caption'])}. "
             f"Stages finished: {html.escape(', '.join(study['finished']) or 'none')}"
             + (f"; not run: {html.escape(', '.join(study['skipped']))}" if study["skipped"] else "")
             + f". Git commit {html.escape(str(study['environment'].get('git_commit')))}.</p>",
             "<h2>Claims of the paper, tested</h2>",
             "<p class='caption'>Each claim at its least favourable domain or task (all rows below). Verdicts come "
             "from the 95% paired intervals: supported = the interval is wholly on the claimed side, contradicted = "
             "wholly on the other side, no difference = it holds the null value; speed is an equivalence claim "
             "(supported inside +-10%, contradicted wholly outside, inconclusive across an edge). These are "
             f"measured on slices ({html.escape(study['budget_caption'])}).</p>",
             claims_table(headline(claims)),
             "<details><summary>Every claim row</summary>" + claims_table(claims) + "</details>"]
    for folder, title, mds, figs in SECTIONS:
        dirs = sorted(out.glob(folder)) if "*" in folder else [out / folder]
        for d in dirs:
            if not d.is_dir():
                continue
            parts.append(f"<h2>{html.escape(title)}{' (' + d.name + ')' if '*' in folder else ''}</h2>")
            for pattern in mds:
                for md in sorted(d.glob(pattern)):
                    parts.append(markdown_to_html(md.read_text()))
            for pattern in figs:
                for png in sorted(d.glob(pattern)):
                    parts.append(_img(png, f"{d.name}/{png.name}"))
    if study.get("stage_seconds"):
        parts.append("<h2>Time per stage (this run)</h2>" + markdown_to_html(
            "| stage | seconds |\n|---|---|\n" + "\n".join(f"| {k} | {v:.0f} |" for k, v in
                                                   study["stage_seconds"].items())))
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>OrthoRank study: "
            f"{html.escape(study['model'])}</title><style>{_STYLE}</style></head><body>" + "\n".join(parts)
            + "</body></html>\n")
    return atomic_write_text(out / "report.html", page)


SUMMARY_FILES = ("summary.md", "summary.json", "summary.html")
_STUDY_KEYS = ("model", "claims", "budget_caption")


def _read_study(folder: Path) -> dict[str, Any]:
    path = folder / "study.json"
    if not path.is_file():
        raise UserError(f"{folder} holds no study.json; run `orthorank study --out {folder}` first")
    try:
        study = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}; run `orthorank study --out {folder}` again") from None
    missing = [k for k in _STUDY_KEYS if not isinstance(study, dict) or k not in study]
    if missing:
        raise UserError(f"{path} is not a study written by `orthorank study` (no {', '.join(missing)}); run "
                        f"`orthorank study --out {folder}` again")
    return study


def _check_summary_out(out: Path, overwrite: bool) -> None:
    """The summary's folder may be rewritten by the next summary; files there that no summary wrote are the
    user's, replaced only with --overwrite."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    present = [out / f for f in SUMMARY_FILES if (out / f).exists()]
    if not present or overwrite:
        return
    try:
        ours = set(json.loads((out / "summary.json").read_text())) >= {"models", "studies", "cells"}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError):
        ours = False
    if not ours:
        raise UserError(f"{present[0]} exists and no earlier summary wrote it; pass --overwrite to replace it")


def write_summary(dirs: list[Path], out: Path, overwrite: bool = False) -> Path:
    """Claims x models: one Markdown table, one page, one JSON, from the studies' study.json files."""
    _check_summary_out(out, overwrite)
    studies = [_read_study(Path(d)) for d in dirs]
    models = [s["model"] for s in studies]
    if len(set(models)) < len(models):
        raise UserError(f"two studies of the same model in --summary: {', '.join(models)}")
    keys: list[tuple[str, str]] = []
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for s in studies:
        for c in headline(s["claims"]):
            key = (c["claim"], c["setting"].split(" ")[0].rstrip(","))
            if key not in cells:
                keys.append(key)
                cells[key] = {}
            cells[key][s["model"]] = c
    head = "| claim | level | " + " | ".join(models) + " |"
    lines = ["Claims x models: each cell is the claim's least favourable domain or task for that model, its "
             "95% paired interval and the verdict computed from it. Budgets: "
             + "; ".join(f"{s['model']}: {s['budget_caption']}" for s in studies), "", head,
             "|---|---|" + "---|" * len(models)]
    for key in keys:
        row = []
        for m in models:
            c = cells[key].get(m)
            row.append(f"{claim_interval_text(c)} {c['setting'].split(' ', 1)[1] if ' ' in c['setting'] else ''} "
                       f"**{c['verdict']}**" if c else "-")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(row) + " |")
    md = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.md", md)
    atomic_write_text(out / "summary.json", json.dumps({
        "models": models, "studies": [str(d) for d in dirs],
        "cells": [{"claim": k[0], "level": k[1], "by_model": cells[k]} for k in keys]}, indent=1) + "\n")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>OrthoRank: claims across models</title>"
            f"<style>{_STYLE}</style></head><body><h1>OrthoRank: claims across models</h1>"
            + markdown_to_html(md) + "</body></html>\n")
    return atomic_write_text(out / "summary.html", page)
