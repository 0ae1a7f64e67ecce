"""A self-contained HTML report (figures embedded as base64 PNG, no scripts, no external resources), the figures
as PNG files and the numbers as JSON, all in one folder."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Callable

from orthorank.harness.analysis.plots import render_figures, selection_map_png
from orthorank.harness.analysis.stats import QUANTILES, SinkAnalysis, observations, quantile_key
from orthorank.errors import UserError
from orthorank.harness.results import atomic_write_bytes, atomic_write_text

REPORT = "report.html"
ANALYSIS_JSON = "analysis.json"
FIGURES = ("overview", "sink-cosine", "sink-stability", "hidden-norms", "attention-sink", "selection")

# Per-layer table: (data-key, header, value of layer l). The data-key names the SinkAnalysis field.
Column = tuple[str, str, Callable[[SinkAnalysis, int], "float | None"]]


def per_layer_columns() -> list[Column]:
    cols: list[Column] = [
        ("cos_mean", "mean cos(sink, token)", lambda a, l: a.cos_mean[l]),
        ("cos_abs_mean", "mean |cos|", lambda a, l: a.cos_abs_mean[l]),
    ]
    for q in QUANTILES:
        key = quantile_key(q)
        cols.append((f"cos_{key}", f"cos {round(q * 100)}%", lambda a, l, key=key: a.cos_quantiles[key][l]))
    cols += [
        ("cos_residual_mean", "mean cos, residual h", lambda a, l: a.cos_residual_mean[l]),
        ("sink_stability", "sink cos(l, l+1)", lambda a, l: a.sink_stability[l]),
        ("sink_stability_residual", "sink cos(l, l+1), residual h", lambda a, l: a.sink_stability_residual[l]),
        ("token_stability", "others cos(l, l+1)", lambda a, l: a.token_stability[l]),
        ("sink_norm", "sink |h|", lambda a, l: a.sink_norm[l]),
        ("other_norm_median", "others |h| median", lambda a, l: a.other_norm_median[l]),
        ("other_norm_max", "others |h| max", lambda a, l: a.other_norm_max[l]),
        ("norm_ratio", "sink / median", lambda a, l: a.norm_ratio[l]),
        ("max_norm_is_sink", "sink is largest (share of samples)", lambda a, l: a.max_norm_is_sink[l]),
        ("attn_sink_share", "attention to sink", lambda a, l: a.attn_sink_share[l]),
    ]
    return cols


def fmt(value: Any) -> str:
    """Numbers as the report prints them: 4 decimals, 1 decimal from 1000 on."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


# ---------------------------------------------------------------- compare results (from `orthorank compare`)

_FIRST_COLUMNS = ("method", "label", "sparsity", "effective_sparsity")


def _long_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 12


def _flatten_rows(rows: list[Any]) -> tuple[list[str], list[dict[str, Any]], int]:
    flat, skipped = [], 0
    for row in rows:
        if not isinstance(row, dict):
            skipped += 1
            continue
        out: dict[str, Any] = {}
        for k, v in row.items():
            if isinstance(v, dict):
                for k2, v2 in v.items():
                    if not _long_list(v2):  # per-window or per-item values stay in the JSON, not the table
                        out[f"{k}.{k2}"] = v2
            elif not _long_list(v):
                out[str(k)] = v
        flat.append(out)
    seen: list[str] = []
    for row in flat:
        seen += [k for k in row if k not in seen]
    columns = [c for c in _FIRST_COLUMNS if c in seen] + [c for c in seen if c not in _FIRST_COLUMNS]
    return columns, flat, skipped


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(r, dict) for r in value)


def load_compare(path: str | Path) -> dict[str, Any]:
    """Read a compare result leniently: {"rows": [...]}, a bare list of rows, or any dict whose first list of
    dicts holds the rows. Nested dicts in a row become "key.sub" columns; top-level scalars become metadata; other
    top-level lists of rows (e.g. "zeroshot"; not "plans") become extra tables. Returns title, meta, columns,
    rows, skipped (rows that were not objects) and extra ([{name, columns, rows, skipped}])."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--compare-json file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"--compare-json file {path} is not valid JSON: {exc}") from None
    rows, key, meta, extra = None, None, {}, []
    if isinstance(data, list):
        rows = data
    elif isinstance(data, dict):
        if isinstance(data.get("rows"), list):
            key = "rows"
        else:
            key = next((k for k, v in data.items() if _is_rows(v)), None)
        rows = data[key] if key is not None else None
        meta = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool))}
        for k, v in data.items():
            if k not in (key, "plans") and _is_rows(v):
                cols, flat, skipped = _flatten_rows(v)
                extra.append({"name": str(k), "columns": cols, "rows": flat, "skipped": skipped})
    if rows is None:
        raise UserError(f"--compare-json file {path} has no rows (expected {{\"rows\": [{{\"method\": ...}}, ...]}})")
    columns, flat, skipped = _flatten_rows(rows)
    if not flat:
        raise UserError(f"--compare-json file {path} has no rows that are JSON objects")
    return {"title": path.name, "meta": meta, "columns": columns, "rows": flat, "skipped": skipped, "extra": extra}


# ---------------------------------------------------------------- HTML

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1180px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #e3e3e3; }
figcaption { color: #444; font-size: 0.95em; margin-top: 0.4em; }
table { border-collapse: collapse; font-size: 0.82em; margin: 0.8em 0; }
th, td { border: 1px solid #d0d0d0; padding: 3px 6px; text-align: right; }
th { background: #f3f5f8; position: sticky; top: 0; } td.text { text-align: left; }
.meta { color: #555; } .note { background: #fbf7e9; border-left: 4px solid #e0c45c; padding: 0.5em 1em; }
.tokens span { display: inline-block; margin: 1px; padding: 1px 3px; border-radius: 3px; font-family: monospace;
               font-size: 0.85em; white-space: pre; }
.scroll { overflow-x: auto; }
"""

_EXPLAIN = {
    "overview": "The four per-layer measurements side by side; each is explained below.",
    "sink-cosine": (
        "For every layer, the cosine similarity between the sink's normalized hidden state (the output of the "
        "layer's input RMSNorm, which feeds Q/K/V and which OrthoRank scores) and each other token's. The line is "
        "the mean over all tokens of all samples, the bands hold the middle 50% and 90% of tokens. The paper "
        "observes that, after the sink forms, this similarity rises with depth: tokens drift towards the sink. "
        "The dashed line is the mean |cos| (OrthoRank keeps the tokens with the smallest |&lt;x_sink, x_i&gt;|); "
        "the dotted grey line is the same cosine on the raw residual stream h, without the RMSNorm's per-channel "
        "weights, which can damp or amplify the sink's few massive channels."),
    "sink-stability": (
        "Cosine between the sink's state at layer l and at layer l+1. The paper observes that, once the sink has "
        "formed, its normalized state barely moves (cosine close to 1), which is why a single direction can "
        "serve as the reference for scoring tokens. The solid line uses the normalized states (which include each "
        "layer's own RMSNorm weights), the dashed line the residual stream's direction; the dotted blue line is the "
        "mean over the other tokens, for reference."),
    "hidden-norms": (
        "Norm of the residual-stream hidden state entering each layer, for the sink and for the other tokens "
        "(median and maximum), on a log scale. The layer where the sink's norm jumps far above the others "
        "(massive activations) is where the sink forms."),
    "attention-sink": (
        "Attention weight that queries put on the sink, recomputed from each layer's own query/key projections "
        "and rotary embeddings with the model's causal mask: averaged over query positions 1..n-1 (the sink's own "
        "query can only attend to itself) and samples; the line is the mean over heads, the band the range over "
        "heads."),
    "selection": (
        "Which tokens OrthoRank would update in each layer if that layer were a selection layer, for the first "
        "tokens of the first sample: the K = ceil(ratio &middot; n) tokens most orthogonal to the sink (smallest "
        "|&lt;x_sink, x_i&gt;|), computed on the dense model's states with the package's own selection code. The "
        "sink (red) is never selected. In layers before the sink forms the choice carries little meaning; the paper "
        "selects tokens only in layers after it."),
}


def _img(name: str, data: bytes, alt: str, caption: str | None = None) -> str:
    b64 = base64.b64encode(data).decode("ascii")
    return (f'<figure id="fig-{name}"><img class="figure" data-figure="{name}" alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{b64}"><figcaption>{caption or _EXPLAIN[name]}</figcaption></figure>')


_MAP_CAPTION = (
    "Rows are layers, columns token positions of one prompt (binned): in a selection layer, the share of tokens it "
    "updated (dark = all, white = none; bypassed tokens keep their state but still give keys and values); grey "
    "layers run densely, black ones are removed. The strip above marks the instruction, the needle(s) and the "
    "question. The prompt's last token predicts the first generated token, so a rule that bypasses it answers from "
    "a state that skipped those layers.")


def _maps_html(maps: list[Any], model: str) -> str:
    e = html.escape
    parts = ['<h2 id="selection-maps">Selection maps of long prompts</h2>']
    spans = sorted({k for m in maps for k in m.spans})
    head = ["prompt", "tokens", "policy", "all", *spans, "last token updated"]
    rows = []
    for i, m in enumerate(maps):
        s = m.summary()
        sel = m.plan.get("selection") or {}
        policy = sel.get("policy", sel.get("order", "-")) + "".join(f"+{k.split('_')[1]}={sel[k]}"
                                                 for k in ("keep_recent", "keep_first") if sel.get(k))
        cells = [m.name, str(m.tokens), policy, f"{s['overall_share_updated']:.2f}"]
        cells += [f"{s['span_share_updated'][k]['mean']:.2f}" if k in s["span_share_updated"] else "-" for k in spans]
        cells.append(f"{s['last_token_updated_in']} of {s['selection_layers']} selection layers")
        rows.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
        parts.append(_img(f"selection-map-{i}", selection_map_png(m, model), f"Selection map: {m.name}",
                          _MAP_CAPTION))
    table = ('<table id="selection-map-shares"><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in head)
             + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    parts.insert(1, "<p>Share of each span's tokens updated, averaged over the selection layers:</p>" + table)
    return "".join(parts)


def observation_lines(a: SinkAnalysis, obs: dict[str, Any]) -> list[str]:
    lines = []
    jump = obs.get("norm_jump")
    if jump:
        j = jump["layer"]
        peak = max(a.norm_ratio)
        if peak < 3.0:
            lines.append(f"No clear sink: the first token's norm is never more than {peak:.1f}x the other tokens' "
                         "median, so OrthoRank's reference direction is weak for this model and text.")
        else:
            lines.append(f"The sink forms in layer {j}: its norm over the other tokens' median goes from "
                         f"{jump['ratio_before']:.1f}x (input of layer {j}) to {jump['ratio_after']:.1f}x (input "
                         f"of layer {j + 1}); the largest ratio is {peak:.1f}x.")
        st = obs.get("sink_stability_after")
        if st:
            lines.append(f"From layer {j + 1} on, the sink's normalized state moves little: layer-to-layer cosine "
                         f"mean {st['mean']:.3f}, minimum {st['min']:.3f}.")
        c = obs.get("cos_after_sink")
        if c and "cos_trend_per_layer" in obs:
            trend = obs["cos_trend_per_layer"]
            word = "rises" if trend > 0.002 else "falls" if trend < -0.002 else "stays about flat"
            lines.append(f"After the sink forms, the mean cos(sink, token) {word} with depth: "
                         f"{c['first']:+.3f} at layer {c['first_layer']}, {c['last']:+.3f} at layer "
                         f"{c['last_layer']} (linear trend {trend:+.4f} per layer).")
    at = obs["attn_sink_share"]
    after = obs.get("attn_sink_share_after")
    lines.append(f"Attention to the sink: {at['mean']:.1%} of the attention weight on average over layers"
                 + (f", {after:.1%} from layer {obs['sink_layer'] + 1} on" if after is not None else "")
                 + f"; the most in layer {at['max_layer']} ({at['max']:.1%}).")
    return lines


def _per_layer_table(a: SinkAnalysis) -> str:
    cols = per_layer_columns()
    head = '<th data-key="layer">layer</th>' + "".join(
        f'<th data-key="{k}">{html.escape(h)}</th>' for k, h, _ in cols)
    body = []
    for l in a.layers:
        cells = "".join(f"<td>{fmt(get(a, l))}</td>" for _, _, get in cols)
        body.append(f'<tr data-layer="{l}"><td>{l}</td>{cells}</tr>')
    return (f'<div class="scroll"><table id="per-layer"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _heads_table(a: SinkAnalysis) -> str:
    head = "<th>layer</th>" + "".join(f"<th>head {h}</th>" for h in range(a.num_heads))
    body = "".join(f'<tr><td>{l}</td>{"".join(f"<td>{fmt(v)}</td>" for v in a.attn_sink_share_heads[l])}</tr>'
                   for l in a.layers)
    return (f'<div class="scroll"><table id="attention-heads"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _tokens_html(a: SinkAnalysis) -> str:
    sel = a.selection
    n, L = sel["n"], a.num_layers
    spans = []
    for t in range(n):
        count = sum(sel["keep"][l][t] for l in range(L))
        share = count / L
        label = html.escape(repr(sel["labels"][t])[1:-1] if sel["labels"][t] else "''")
        style = ("background:#e6a5a0" if t == 0 else
                 f"background:rgba(31,95,168,{0.08 + 0.8 * share:.3f});color:{'#fff' if share > 0.55 else '#111'}")
        title = "sink" if t == 0 else f"selected in {count} of {L} layers"
        spans.append(f'<span style="{style}" title="{title}">{label}</span>')
    return f'<p class="tokens">{"".join(spans)}</p>'


def _rows_table(columns: list[str], rows: list[dict[str, Any]], table_id: str) -> str:
    head = "".join(f'<th data-key="{html.escape(c)}">{html.escape(c)}</th>' for c in columns)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="{"text" if isinstance(r.get(c), str) else "num"}">{html.escape(fmt(r.get(c)))}</td>'
            for c in columns) + "</tr>"
        for r in rows)
    return (f'<div class="scroll"><table class="compare" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _compare_html(tables: list[dict[str, Any]]) -> str:
    parts = ['<h2 id="compare">Compared methods</h2><p>Results of <code>orthorank compare</code> added with '
             "<code>--compare-json</code>.</p>"]
    for i, t in enumerate(tables):
        meta = ", ".join(f"{html.escape(str(k))}: {html.escape(fmt(v))}" for k, v in t["meta"].items())
        parts.append(f"<h3>{html.escape(t['title'])}</h3>" + (f'<p class="meta">{meta}</p>' if meta else ""))
        if t.get("skipped"):
            parts.append(f'<p class="note">{t["skipped"]} row(s) that are not JSON objects were left out.</p>')
        parts.append(_rows_table(t["columns"], t["rows"], f"compare-{i}"))
        for j, x in enumerate(t.get("extra", [])):
            parts.append(f"<h4>{html.escape(t['title'])}: {html.escape(x['name'])}</h4>"
                         + _rows_table(x["columns"], x["rows"], f"compare-{i}-{j + 1}"))
    return "".join(parts)


def build_html(a: SinkAnalysis, figures: dict[str, bytes], compare: list[dict[str, Any]] | None = None,
               provenance: dict[str, Any] | None = None, maps: list[Any] | None = None) -> str:
    obs = observations(a)
    e = html.escape
    sections = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>OrthoRank sink analysis: {e(a.model)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Attention sink analysis: {e(a.model)}</h1>",
        f'<p class="meta">{a.num_layers} layers, {a.num_heads} heads; {a.samples} sample(s) of {a.tokens_per_sample} '
        f"tokens from {e(a.source)}; the first token of each sample is the sink. Selection ratio {a.ratio:g}, "
        f"criterion |{'&lt;x_sink, x_i&gt;' if a.criterion == 'dot' else 'cos(x_sink, x_i)'}|.</p>",
        "<p>OrthoRank (Shin, Oh, Oh, ICML 2025) rests on three observations about the attention sink: its hidden "
        "state's norm towers over the others, its normalized state barely changes from layer to layer once formed, "
        "and the other tokens' normalized states grow more similar to it with depth. The figures below check each "
        "for this model.</p>",
        '<h2 id="summary">Summary</h2><ul id="observations">'
        + "".join(f"<li>{e(line)}</li>" for line in observation_lines(a, obs)) + "</ul>",
    ]
    for name in FIGURES:
        if name == "selection":
            continue
        title = {"overview": "Overview", "sink-cosine": "Similarity to the sink", "sink-stability": "Sink stability",
                 "hidden-norms": "Hidden-state norms", "attention-sink": "Attention to the sink"}[name]
        sections.append(f'<h2 id="{name}">{title}</h2>' + _img(name, figures[name], title))
    sections.append('<h2 id="selection">Token selection</h2>' + _img("selection", figures["selection"],
                                                                     "Token selection per layer"))
    sections.append("<p>The sample's tokens, shaded by the share of layers that would select them (darker = "
                    "selected in more layers; hover for the count):</p>" + _tokens_html(a))
    sections.append('<h2 id="numbers">Numbers per layer</h2><p>Layer l means the hidden state entering layer l. '
                    "Stability columns compare layer l with layer l+1 (none for the last layer).</p>"
                    + _per_layer_table(a))
    sections.append("<details><summary>Attention to the sink per head</summary>" + _heads_table(a) + "</details>")
    if maps:
        sections.append(_maps_html(maps, a.model))
    if compare:
        sections.append(_compare_html(compare))
    if provenance:
        items = "".join(f"<li>{e(str(k))}: <code>{e(fmt(v))}</code></li>" for k, v in provenance.items())
        sections.append(f'<h2 id="provenance">Provenance</h2><ul>{items}</ul>')
    sections.append("</body></html>")
    return "\n".join(sections) + "\n"


def check_out_dir(out: str | Path, overwrite: bool = False) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")
    if (out / REPORT).exists() and not overwrite:
        raise UserError(f"{out / REPORT} exists; pass --overwrite to replace it")
    return out


def render_report(a: SinkAnalysis, out: str | Path, *, compare: list[dict[str, Any]] | None = None,
                  provenance: dict[str, Any] | None = None, overwrite: bool = False,
                  maps: list[Any] | None = None) -> dict[str, Path]:
    """Write DIR/report.html, DIR/<figure>.png for every figure and DIR/analysis.json. Returns their paths."""
    out = check_out_dir(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    figures = render_figures(a)
    paths: dict[str, Path] = {}
    for name in FIGURES:
        paths[name] = out / f"{name}.png"
        atomic_write_bytes(paths[name], figures[name])
    payload = {"format": "orthorank-analysis/1", "analysis": a.to_dict(), "observations": observations(a),
               "compare": compare or [], "provenance": provenance or {}}
    if maps:
        payload["selection_maps"] = [m.to_dict() for m in maps]
    paths["json"] = out / ANALYSIS_JSON
    atomic_write_text(paths["json"], json.dumps(payload, indent=1, default=str) + "\n")
    paths["report"] = out / REPORT
    atomic_write_text(paths["report"], build_html(a, figures, compare, provenance, maps))
    return paths
