"""`orthorank analyze`: the per-layer statistics, the figures, the HTML report and its table, the CLI's errors,
and (where /usr/bin/chromium exists) that every figure renders in a real browser."""

from __future__ import annotations

import base64
import json
import math
import re
from html.parser import HTMLParser

import pytest
import torch

from orthorank.method.apply import selective
import torch.nn.functional as F

from conftest import tiny_model
from orthorank.harness.analysis import analyze, observations
from orthorank.harness.reports.analysis import load_compare, render_report
from orthorank.harness.analysis.plots import render_figures
from orthorank.harness.reports.analysis import FIGURES, per_layer_columns
from orthorank.harness.cli.main import main
from orthorank.errors import UserError
from orthorank.method import SelectionConfig, apply_orthorank, restore_dense

# Token ids for the tiny models (vocab 128; 0 is the pad id): 2 samples of 24 tokens, fixed.
TINY_IDS = torch.randint(1, 128, (2, 24), generator=torch.Generator().manual_seed(1234))
SAMPLE_TOKENS = 16

COMPARE = {
    "command": "compare", "model": "tiny", "dataset": "wikitext2",
    "rows": [
        {"method": "dense", "sparsity": 0.0, "effective_sparsity": 0.0, "wikitext2": 12.3456789},
        {"method": "orthorank", "sparsity": 0.2, "effective_sparsity": 0.1989, "wikitext2": 14.5, "layers": [3, 5]},
        {"method": "prune", "sparsity": 0.2, "effective_sparsity": 0.2, "wikitext2": 18.25, "extra": {"c4": 20.5}},
        "not a row",
    ],
    "plans": [{"method": "dense", "layers": []}],
    "zeroshot": [{"method": "dense", "piqa": 0.61}, {"method": "orthorank", "piqa": 0.6}],
}


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama", layers=4)


@pytest.fixture(scope="module")
def result(tiny):
    return analyze(tiny, TINY_IDS, sample_tokens=SAMPLE_TOKENS, name="tiny-llama")


@pytest.fixture(scope="module")
def report(result, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    cmp_path = out.parent / "compare.json"
    cmp_path.write_text(json.dumps(COMPARE))
    paths = render_report(result, out, compare=[load_compare(cmp_path)], provenance={"test": "tiny"})
    return out, paths


# ------------------------------------------------------------------ statistics


def _manual(model, ids):
    """Reference statistics from output_hidden_states, computed independently of the hooks."""
    out = model(ids, output_hidden_states=True, use_cache=False)
    layers = model.model.layers
    hs = out.hidden_states[: len(layers)]  # hidden_states[l] enters layer l
    xs = [layer.input_layernorm(h) for layer, h in zip(layers, hs)]
    return hs, xs


def test_statistics_match_a_manual_computation(tiny, result):
    hs, xs = _manual(tiny, TINY_IDS)
    L = len(xs)
    assert result.num_layers == L and result.samples == 2 and result.tokens_per_sample == 24
    for l in range(L):
        cos = F.cosine_similarity(xs[l][:, 1:], xs[l][:, :1], dim=-1).double()
        assert result.cos_mean[l] == pytest.approx(float(cos.mean()), abs=1e-6)
        assert result.cos_abs_mean[l] == pytest.approx(float(cos.abs().mean()), abs=1e-6)
        assert result.cos_quantiles["q50"][l] == pytest.approx(float(cos.flatten().quantile(0.5)), abs=1e-6)
        assert result.cos_quantiles["q05"][l] <= result.cos_quantiles["q25"][l] <= result.cos_quantiles["q50"][l]
        assert result.cos_quantiles["q50"][l] <= result.cos_quantiles["q75"][l] <= result.cos_quantiles["q95"][l]
        cos_h = F.cosine_similarity(hs[l][:, 1:], hs[l][:, :1], dim=-1).double()
        assert result.cos_residual_mean[l] == pytest.approx(float(cos_h.mean()), abs=1e-6)
        norms = hs[l].norm(dim=-1).double()
        assert result.sink_norm[l] == pytest.approx(float(norms[:, 0].mean()), rel=1e-5)
        assert result.other_norm_median[l] == pytest.approx(float(norms[:, 1:].flatten().median()), rel=1e-5)
        assert result.other_norm_max[l] == pytest.approx(float(norms[:, 1:].max()), rel=1e-5)
        if l < L - 1:
            stab = F.cosine_similarity(xs[l][:, 0], xs[l + 1][:, 0], dim=-1).double().mean()
            assert result.sink_stability[l] == pytest.approx(float(stab), abs=1e-6)
            stab_h = F.cosine_similarity(hs[l][:, 0], hs[l + 1][:, 0], dim=-1).double().mean()
            assert result.sink_stability_residual[l] == pytest.approx(float(stab_h), abs=1e-6)
        else:
            assert result.sink_stability[l] is None and result.token_stability[l] is None


@pytest.mark.parametrize("family, overrides", [("llama", {}), ("qwen2", {}), ("mistral", {"sliding_window": 8})])
def test_attention_share_matches_eager_attention_weights(family, overrides, monkeypatch):
    """The hooks recompute attention from q/k (in query blocks, made small here); eager attention's own weights
    must agree, per head."""
    monkeypatch.setattr("orthorank.harness.analysis.stats._QUERY_BLOCK", 7)
    eager = tiny_model(family, layers=2, attn="eager", **overrides)
    res = analyze(eager, TINY_IDS, sample_tokens=8)
    out = eager(TINY_IDS, output_attentions=True, use_cache=False)
    for l, att in enumerate(out.attentions):
        ref = att[:, :, 1:, 0].mean(dim=-1).mean(dim=0)  # queries 1..T-1, then samples
        got = torch.tensor(res.attn_sink_share_heads[l], dtype=torch.float64)
        assert torch.allclose(got, ref.double(), atol=1e-5)
        assert res.attn_sink_share[l] == pytest.approx(float(ref.mean()), abs=1e-5)
    sdpa = analyze(tiny_model(family, layers=2, attn="sdpa", **overrides), TINY_IDS, sample_tokens=8)
    assert sdpa.attn_sink_share == pytest.approx(res.attn_sink_share, abs=1e-6)


@pytest.mark.parametrize("layer", [1, 3])
def test_selection_is_what_an_orthorank_layer_selects(layer):
    """The selection map must equal the keep mask of a real OrthoRank layer placed at that layer (the layers
    before it are dense, so its input states are the dense model's)."""
    model = tiny_model("llama", layers=4)
    ids = TINY_IDS[:1]
    res = analyze(model, ids, ratio=0.33, sample_tokens=ids.shape[1])
    apply_orthorank(model, [layer], SelectionConfig(ratio=0.33))
    try:
        model(ids, use_cache=False)
        keep = selective(model.model.layers[layer]).last_keep[0].int().tolist()
        with pytest.raises(UserError, match="dense model"):
            analyze(model, ids)
    finally:
        restore_dense(model)
    assert res.selection["keep"][layer] == keep
    assert sum(keep) == res.selection["k"] == math.ceil(0.33 * ids.shape[1])
    assert res.selection["keep"][layer][0] == 0  # the sink is never selected


def test_deterministic(tiny, result, report):
    again = analyze(tiny, TINY_IDS.tolist(), sample_tokens=SAMPLE_TOKENS, name="tiny-llama")
    assert again.to_dict() == result.to_dict()
    out, _ = report
    assert render_figures(again) == {name: (out / f"{name}.png").read_bytes() for name in FIGURES}


def test_bad_ids_are_user_errors(tiny):
    for ids in ([[5]], [], [[1, 2], [3]], [[1, 500]]):
        with pytest.raises(UserError):
            analyze(tiny, ids)
    with pytest.raises(UserError):
        analyze(tiny, TINY_IDS, ratio=0.0)


def test_observations_name_the_sink_layer(tiny, result):
    obs = observations(result)
    j = obs["sink_layer"]
    assert 0 <= j < result.num_layers - 1
    ratio = result.norm_ratio
    assert obs["norm_jump"]["factor"] == pytest.approx(max(ratio[l + 1] / ratio[l] for l in range(len(ratio) - 1)))


# ------------------------------------------------------------------ report


class _Tables(HTMLParser):
    """Collects every table as {"id", "keys" (th data-key), "rows" (cell texts)}."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict] = {}
        self._t = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._t = {"keys": [], "rows": []}
            self.tables[a.get("id", f"t{len(self.tables)}")] = self._t
        elif tag == "tr" and self._t is not None:
            self._t["rows"].append([])
        elif tag == "th" and self._t is not None:
            self._t["keys"].append(a.get("data-key"))
        elif tag == "td" and self._t is not None:
            self._cell = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._t["rows"][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._t = None


def _close(cell: str, value) -> bool:
    if value is None:
        return cell == "—"
    return math.isclose(float(cell), value, rel_tol=1e-4, abs_tol=5.1e-5)


def test_report_files_and_figures(report):
    out, paths = report
    html = (out / "report.html").read_text(encoding="utf-8")
    for name in FIGURES:
        png = (out / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, name
        m = re.search(rf'data-figure="{name}"[^>]*src="data:image/png;base64,([^"]+)"', html)
        assert m, f"figure {name} is not embedded"
        assert base64.b64decode(m.group(1)) == png
    # Self-contained: no external resources, no scripts.
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<script" not in html
    data = json.loads((out / "analysis.json").read_text())
    assert data["format"] == "orthorank-analysis/1" and data["analysis"]["num_layers"] == 4
    for fragment in ("Similarity to the sink", "Sink stability", "Hidden-state norms", "Attention to the sink",
                     "Token selection", "Attention to the sink: "):
        assert fragment in html


def test_report_table_matches_the_computed_numbers(report, result):
    out, _ = report
    tables = _Tables()
    tables.feed((out / "report.html").read_text(encoding="utf-8"))
    t = tables.tables["per-layer"]
    keys = t["keys"]
    assert keys[0] == "layer" and keys[1:] == [k for k, _, _ in per_layer_columns()]
    rows = [r for r in t["rows"] if r]
    assert len(rows) == result.num_layers
    fields = result.to_dict()
    for l, row in enumerate(rows):
        assert int(row[0]) == l
        for key, cell in zip(keys[1:], row[1:]):
            if key.startswith("cos_q"):
                value = result.cos_quantiles[key[4:]][l]
            else:
                value = fields[key][l]
            assert _close(cell, value), (l, key, cell, value)
    heads = [r for r in tables.tables["attention-heads"]["rows"] if r]
    for l, row in enumerate(heads):
        assert all(_close(c, v) for c, v in zip(row[1:], result.attn_sink_share_heads[l]))


def test_report_compare_table(report):
    out, _ = report
    tables = _Tables()
    tables.feed((out / "report.html").read_text(encoding="utf-8"))
    t = tables.tables["compare-0"]
    assert t["keys"][:4] == ["method", "sparsity", "effective_sparsity", "wikitext2"]
    assert "extra.c4" in t["keys"] and "layers" in t["keys"]
    rows = [dict(zip(t["keys"], r)) for r in t["rows"] if r]
    assert [r["method"] for r in rows] == ["dense", "orthorank", "prune"]
    assert rows[0]["wikitext2"] == "12.3457" and rows[2]["extra.c4"] == "20.5000" and rows[0]["extra.c4"] == "—"
    assert "1 row(s) that are not JSON objects" in (out / "report.html").read_text(encoding="utf-8")
    zs = tables.tables["compare-0-1"]  # other lists of rows become extra tables; "plans" are left out
    assert zs["keys"] == ["method", "piqa"] and [r for r in zs["rows"] if r][1] == ["orthorank", "0.6000"]
    assert "compare-0-2" not in tables.tables


def test_load_compare_is_lenient(tmp_path):
    p = tmp_path / "c.json"
    for data, n in ((COMPARE["rows"][:2], 2), ({"results": COMPARE["rows"][:3]}, 3), (COMPARE, 3)):
        p.write_text(json.dumps(data))
        assert len(load_compare(p)["rows"]) == n
    for bad in ("{not json", json.dumps({"rows": "x"}), json.dumps([1, 2])):
        p.write_text(bad)
        with pytest.raises(UserError):
            load_compare(p)
    with pytest.raises(UserError):
        load_compare(tmp_path / "missing.json")


def test_render_refuses_to_overwrite(result, tmp_path):
    (tmp_path / "report.html").write_text("an older report")
    with pytest.raises(UserError, match="--overwrite"):
        render_report(result, tmp_path)
    render_report(result, tmp_path, overwrite=True)
    assert "tiny-llama" in (tmp_path / "report.html").read_text(encoding="utf-8")


# ------------------------------------------------------------------ command line


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _user_error(capsys, fragment, *argv):
    code, out, err = _cli(capsys, *argv)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and lines and "Traceback" not in err, (code, err)
    assert lines[-1].startswith("orthorank analyze: error:") and fragment in lines[-1], lines[-1]


def test_cli_bad_input_is_one_line(capsys, tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.html").write_text("x")
    _user_error(capsys, "--overwrite", "analyze", "--text", "hello world", "--out", tmp_path / "old")
    _user_error(capsys, "--text is empty", "analyze", "--text", "  ", "--out", tmp_path / "a")
    _user_error(capsys, "does not exist", "analyze", "--text", "hi there", "--compare-json", tmp_path / "no.json",
                "--out", tmp_path / "b")
    (tmp_path / "file").write_text("x")
    _user_error(capsys, "not a folder", "analyze", "--text", "hi there", "--out", tmp_path / "file")
    _user_error(capsys, "--ratio", "analyze", "--text", "hi there", "--ratio", "1.5", "--out", tmp_path / "c")


def test_cli_end_to_end_with_a_tokenizer(capsys, tiny_hf_folder, tmp_path):
    cmp_path = tmp_path / "compare.json"
    cmp_path.write_text(json.dumps(COMPARE))
    out = tmp_path / "out"
    code, stdout, err = _cli(capsys, "analyze", "--model", tiny_hf_folder, "--text", "The quick brown fox " * 30,
                             "--seq-len", 32, "--samples", 2, "--sample-tokens", 12, "--compare-json", cmp_path,
                             "--out", out, "--device", "cpu")
    assert code == 0, err
    assert "wrote" in stdout and (out / "report.html").is_file()
    data = json.loads((out / "analysis.json").read_text())
    a = data["analysis"]
    assert a["samples"] == 2 and a["tokens_per_sample"] == 32 and a["selection"]["n"] == 12
    assert a["selection"]["labels"][1].strip() == "quick"
    assert data["compare"][0]["rows"][0]["method"] == "dense"
    # Text shorter than 2 tokens: a one-line error after the model loads.
    _user_error(capsys, "at least 2", "analyze", "--model", tiny_hf_folder, "--text", "The", "--out",
                tmp_path / "short", "--device", "cpu")


# ------------------------------------------------------------------ browser


def test_report_renders_in_chromium(report):
    browser_check = pytest.importorskip("browser_check")
    if not browser_check.chromium_available():
        pytest.skip(f"{browser_check.CHROMIUM} not found; CI installs it with: apt-get install -y chromium "
                    "chromium-driver")
    out, _ = report
    result = browser_check.check_report(out / "report.html")
    assert result["problems"] == []
    assert sorted(img["data-figure"] for img in result["images"]) == sorted(FIGURES)
    assert all(img["data-rendered"] == "yes" for img in result["images"])


# ------------------------------------------------------------------ embedded model (slower)


@pytest.mark.integration
@pytest.mark.data
def test_embedded_model_has_a_sink(tmp_path, capsys):
    code, stdout, err = _cli(capsys, "analyze", "--samples", 1, "--seq-len", 256, "--out", tmp_path, "--device",
                             "cpu")
    assert code == 0, err
    a = json.loads((tmp_path / "analysis.json").read_text())["analysis"]
    ratio = a["norm_ratio"]
    sink = max(range(len(ratio)), key=ratio.__getitem__)
    assert ratio[sink] > 20  # massive activation on the first token
    late = [v for v in a["sink_stability"][sink:-1] if v is not None]
    assert min(late) > 0.8 and sum(late) / len(late) > 0.95
    assert max(a["attn_sink_share"]) > 0.3
