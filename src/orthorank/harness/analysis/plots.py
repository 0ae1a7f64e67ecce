"""Figures of a SinkAnalysis, drawn with matplotlib's object API on the Agg canvas (no pyplot, no global backend
change, nothing shown on screen). Every panel has the layer on the x axis."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from orthorank.harness.analysis.selection_map import DENSE, REMOVED
from orthorank.harness.analysis.stats import SinkAnalysis
from orthorank.harness.results import atomic_write_bytes

DPI = 110
SINK_COLOR = "#c0392b"
OTHER_COLOR = "#2c6fbb"
GREY = "#7f7f7f"


def _layer_axis(ax: Axes, a: SinkAnalysis) -> None:
    ax.set_xlabel("layer (its input, which OrthoRank scores)")
    ax.set_xlim(-0.5, a.num_layers - 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(16, a.num_layers + 1)))
    ax.grid(True, alpha=0.3)


def _valid(values: list[float | None]) -> tuple[list[int], list[float]]:
    xs = [i for i, v in enumerate(values) if v is not None]
    return xs, [values[i] for i in xs]


def draw_cosine(ax: Axes, a: SinkAnalysis) -> None:
    x = a.layers
    q = a.cos_quantiles
    ax.axhline(0.0, color="black", lw=0.8)
    ax.fill_between(x, q["q05"], q["q95"], color=OTHER_COLOR, alpha=0.15, lw=0, label="5-95% of tokens")
    ax.fill_between(x, q["q25"], q["q75"], color=OTHER_COLOR, alpha=0.3, lw=0, label="25-75% of tokens")
    ax.plot(x, a.cos_mean, color=OTHER_COLOR, lw=2.2, marker="o", ms=3.5, label="mean cos (normalized states)")
    ax.plot(x, a.cos_abs_mean, color=OTHER_COLOR, lw=1.2, ls="--", label="mean |cos| (what selection ranks)")
    ax.plot(x, a.cos_residual_mean, color=GREY, lw=1.2, ls=":", label="mean cos, residual stream h")
    ax.set_ylabel("cos(sink, token)")
    ax.set_title("Similarity of each token to the sink")
    ax.set_ylim(min(-0.05, min(q["q05"]) - 0.05), min(1.05, max(max(q["q95"]), max(a.cos_residual_mean)) + 0.1))
    _layer_axis(ax, a)
    ax.legend(loc="best", fontsize=8, framealpha=0.85)


def draw_stability(ax: Axes, a: SinkAnalysis) -> None:
    ax.axhline(1.0, color="black", lw=0.8)
    xs, ys = _valid(a.sink_stability)
    ax.plot(xs, ys, color=SINK_COLOR, lw=2.2, marker="o", ms=3.5, label="sink, normalized state")
    xs, ys = _valid(a.sink_stability_residual)
    ax.plot(xs, ys, color=SINK_COLOR, lw=1.2, ls="--", label="sink, residual stream h")
    xs, ys = _valid(a.token_stability)
    ax.plot(xs, ys, color=OTHER_COLOR, lw=1.2, ls=":", label="other tokens (mean), normalized")
    ax.set_ylabel("cos(state at layer l, state at layer l+1)")
    ax.set_title("How much the sink's state moves from layer to layer")
    _layer_axis(ax, a)
    ax.set_xlabel("layer l (transition l -> l+1)")
    ax.legend(loc="lower right", fontsize=8, framealpha=0.85)


def draw_norms(ax: Axes, a: SinkAnalysis) -> None:
    x = a.layers
    ax.plot(x, a.sink_norm, color=SINK_COLOR, lw=2.2, marker="o", ms=3.5, label="sink")
    ax.plot(x, a.other_norm_max, color=OTHER_COLOR, lw=1.2, ls="--", label="other tokens, max")
    ax.plot(x, a.other_norm_median, color=OTHER_COLOR, lw=2.0, label="other tokens, median")
    ax.set_yscale("log")
    ax.set_ylabel("|h| (residual stream, log scale)")
    ax.set_title("Hidden-state norm: sink vs. other tokens")
    _layer_axis(ax, a)
    ax.legend(loc="best", fontsize=8, framealpha=0.85)


def draw_attention(ax: Axes, a: SinkAnalysis) -> None:
    x = a.layers
    lo = [min(h) for h in a.attn_sink_share_heads]
    hi = [max(h) for h in a.attn_sink_share_heads]
    ax.fill_between(x, lo, hi, color=SINK_COLOR, alpha=0.15, lw=0, label="range over heads")
    ax.plot(x, a.attn_sink_share, color=SINK_COLOR, lw=2.2, marker="o", ms=3.5, label="mean over heads")
    ax.set_ylim(0.0, 1.02)
    ax.set_ylabel("attention weight on the sink")
    ax.set_title("Share of attention that goes to the sink")
    _layer_axis(ax, a)
    ax.legend(loc="best", fontsize=8, framealpha=0.85)


def draw_selection(ax: Axes, a: SinkAnalysis) -> None:
    sel = a.selection
    n, L = sel["n"], a.num_layers
    # grid[token][layer]: 0 bypassed, 1 selected, 2 the sink (never selected)
    grid = [[(2 if t == 0 else sel["keep"][l][t]) for l in range(L)] for t in range(n)]
    cmap = ListedColormap(["#eef1f5", "#1f5fa8", "#e6a5a0"])
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(L))
    ax.set_xticklabels([str(i) if L <= 32 or i % 2 == 0 else "" for i in range(L)], fontsize=7)
    ax.set_yticks(range(n))
    ax.set_yticklabels([_label(i, s) for i, s in enumerate(sel["labels"][:n])], fontsize=7, family="monospace")
    ax.set_xlabel("layer")
    ax.set_ylabel("token (position: text)")
    ax.set_title(f"Tokens OrthoRank would select (dark): ratio {a.ratio:g}, {sel['k']} of {n} per layer; "
                 "sink in red", fontsize=10)
    ax.set_xticks([i - 0.5 for i in range(1, L)], minor=True)
    ax.grid(which="minor", axis="x", color="white", lw=0.6)
    ax.tick_params(which="minor", length=0)


def _label(i: int, text: str, width: int = 14) -> str:
    text = repr(text)[1:-1].replace(" ", "\u00b7") if text else "''"  # middle dot marks spaces
    if len(text) > width:
        text = text[: width - 1] + "~"
    return f"{i:>3} {text}"


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


PANELS: dict[str, tuple[str, Callable[[Axes, SinkAnalysis], None]]] = {
    "sink-cosine": ("Similarity to the sink", draw_cosine),
    "sink-stability": ("Sink stability", draw_stability),
    "hidden-norms": ("Hidden-state norms", draw_norms),
    "attention-sink": ("Attention to the sink", draw_attention),
}


def render_figures(a: SinkAnalysis) -> dict[str, bytes]:
    """PNG bytes per figure name: the four panels, the selection map and a 2x2 overview."""
    out: dict[str, bytes] = {}
    for name, (_, draw) in PANELS.items():
        fig = _figure(7.5, 4.4)
        draw(fig.add_subplot(), a)
        fig.suptitle(a.model, fontsize=9, color=GREY, x=0.99, ha="right")
        out[name] = _png(fig)
    n = a.selection["n"]
    fig = _figure(max(6.5, 2.2 + 0.2 * a.num_layers), max(4.0, 1.4 + 0.17 * n))
    draw_selection(fig.add_subplot(), a)
    out["selection"] = _png(fig)
    fig = _figure(13.0, 8.0)
    axes = fig.subplots(2, 2)
    for ax, (_, draw) in zip(axes.flat, PANELS.values()):
        draw(ax, a)
    fig.suptitle(f"Attention sink in {a.model} ({a.samples} x {a.tokens_per_sample} tokens of {a.source})",
                 fontsize=12)
    out["overview"] = _png(fig)
    return out


def save_figures(a: SinkAnalysis, folder: str | Path) -> dict[str, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in render_figures(a).items():
        paths[name] = folder / f"{name}.png"
        atomic_write_bytes(paths[name], data)
    return paths


SPAN_COLORS = {"instruction": "#2e8b57", "needle": "#c0392b", "question": "#e67e22"}


def draw_selection_map(ax: Axes, strip: Axes, m, bins: int = 512) -> None:
    """Layers (rows, 0 at the top) x token positions (binned to at most `bins` columns): for a selection layer the
    share of the bin's tokens it updated (white 0 .. dark blue 1), grey for a dense layer, black for a removed one.
    `strip` above marks the named spans."""
    T, L = m.tokens, len(m.states)
    nb = min(bins, T)
    edges = np.linspace(0, T, nb + 1).astype(int)
    width = np.maximum(np.diff(edges), 1)
    light, dark = np.array([0.97, 0.97, 0.98]), np.array([0.12, 0.37, 0.66])
    img = np.zeros((L, nb, 3))
    for layer, state in enumerate(m.states):
        if state == DENSE:
            img[layer] = 0.72
        elif state == REMOVED:
            img[layer] = 0.0
        else:
            hit = np.zeros(T)
            hit[m.kept[layer]] = 1.0
            share = np.add.reduceat(hit, edges[:-1]) / width
            img[layer] = light + share[:, None] * (dark - light)
    ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, T, L - 0.5, -0.5))
    ax.set_ylabel("layer")
    ax.set_xlabel("token position")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(16, L)))
    for name, ranges in m.spans.items():
        color = SPAN_COLORS.get(name, GREY)
        for a, b in ranges:
            strip.axvspan(a, max(b, a + T / 400), color=color, lw=0)
            if name != "instruction":
                ax.axvline(a, color=color, lw=0.8, alpha=0.8)
    strip.set_xlim(0, T)
    strip.set_yticks([])
    strip.tick_params(labelbottom=False)
    handles = [strip.bar(0, 0, color=SPAN_COLORS.get(k, GREY), label=k) for k in m.spans]
    if handles:
        strip.legend(loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=7, frameon=False)
    s = m.summary()
    shares = "; ".join(f"{k} {v['mean']:.2f}" for k, v in s["span_share_updated"].items())
    sel = m.plan.get("selection") or {}
    policy = sel.get("policy", sel.get("order", "orthogonal")) + "".join(f"+{k.split('_')[1]}={sel[k]}" for k in ("keep_recent",
                                                                                               "keep_first") if sel.get(k))
    strip.set_title(f"{m.name}: {T} tokens, policy {policy}; share updated per selection layer: all "
                 f"{s['overall_share_updated']:.2f}; {shares}; last token updated in {s['last_token_updated_in']} of "
                 f"{s['selection_layers']} selection layers (grey: dense layer, black: removed)", fontsize=8, wrap=True)


def selection_map_png(m, model: str) -> bytes:
    fig = _figure(12.0, max(3.5, 1.4 + 0.12 * len(m.states)))
    strip, ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 14]})
    draw_selection_map(ax, strip, m)
    fig.suptitle(model, fontsize=9, color=GREY, x=0.99, ha="right")
    return _png(fig)
