"""The selective layer's phase profile (harness/speed/phase_profile.py), its marks (method/phase_marks.py) and the
row gathers and norm reuse whose cost it exposed (method/attention_routing.py)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_model
from orthorank.harness.cli.main import main
from orthorank.harness.speed.phase_profile import PHASES, attention_share, phase_ideal_shares
from orthorank.method import SelectionConfig, apply_orthorank, phase_marks, restore_dense
from orthorank.method.attention_routing import gather_rows, scatter_rows
from orthorank.method.plan import Plan
from orthorank.models.loading import load_model


def test_marks_are_shared_no_ops_unless_marking():
    assert phase_marks.phase("scoring") is phase_marks.phase("gather")  # one no-op object: nothing allocated
    with phase_marks.marking():
        assert isinstance(phase_marks.phase("scoring"), torch.profiler.record_function)
    assert not phase_marks._enabled


@pytest.mark.parametrize("B, N", [(1, 1), (3, 3), (3, 1)])
def test_row_gather_and_scatter_equal_the_expanded_index_forms(B, N):
    g = torch.Generator().manual_seed(B + N)
    T, C, K = 17, 6, 5
    t = torch.randn(N, T, C, generator=g)
    idx = torch.stack([torch.randperm(T, generator=g)[:K].sort().values for _ in range(B)])
    reference = t.expand(B, T, C).gather(1, idx.unsqueeze(-1).expand(B, K, C))
    assert torch.equal(gather_rows(t, idx), reference)
    if N == B:
        rows = torch.randn(B, K, C, generator=g)
        expected = t.scatter(1, idx.unsqueeze(-1).expand(B, K, C), rows)
        copy = scatter_rows(t, idx, rows, inplace=False)
        assert torch.equal(copy, expected) and copy.data_ptr() != t.data_ptr()
        strided = t.transpose(0, 1).contiguous().transpose(0, 1)  # not contiguous: the scatter fallback
        assert torch.equal(scatter_rows(strided, idx, rows, inplace=False), expected)
        assert torch.equal(scatter_rows(t, idx, rows, inplace=True), expected) and torch.equal(t, expected)


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3"])
def test_selective_layer_norms_every_token_once(monkeypatch, family):
    """The family's forward on the selected rows gets their rows of the input norm already computed for every token,
    not a second norm: the norm's own forward runs once per selection layer call, and the output is unchanged."""
    m = tiny_model(family)
    ids = torch.randint(1, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    norm = m.model.layers[1].input_layernorm
    inner = type(norm).forward
    calls = []

    def counted(self, x):
        if self is norm:
            calls.append(x.shape[1])
        return inner(self, x)

    monkeypatch.setattr(type(norm), "forward", counted)  # before the plan, which routes the norm's own forward
    with torch.inference_mode():
        dense = m(ids).logits
    apply_orthorank(m, [1], SelectionConfig(ratio=0.4))
    calls.clear()
    with torch.inference_mode():
        got = m(ids).logits
    assert calls == [24]  # every token once; the ceil(0.4 * 24) = 10 selected rows are not normed again
    restore_dense(m)
    monkeypatch.setattr(type(norm), "forward", inner)
    reference = tiny_model(family)
    apply_orthorank(reference, [1], SelectionConfig(ratio=0.4))
    with torch.inference_mode():
        assert torch.equal(got, reference(ids).logits) and not torch.equal(got, dense)


def test_phase_ideal_and_attention_share():
    shares = phase_ideal_shares(0.25, 0.1, 8, 2)
    assert set(shares) == set(PHASES)
    assert shares["MLP"] == 0.25 and shares["keys/values"] == 1.0 and shares["gather"] == 0.0
    assert shares["RoPE, reshapes"] == pytest.approx((0.25 * 8 + 2) / 10)
    T = 10
    assert attention_share(torch.arange(T).unsqueeze(0), T) == pytest.approx(1.0)  # every query: the triangle
    assert attention_share(torch.tensor([[0]]), T) == pytest.approx(1 / 55)


def test_bench_layer_mode_runs_a_plans_selection_layer_and_splits_it_into_phases(tmp_path, capsys):
    lm = load_model("smollm2-135m-shape", device="cpu", num_layers=4)
    plan = tmp_path / "plan.json"
    Plan("orthorank", [1, 2], lm.name, lm.signature(), selection=SelectionConfig(ratio=0.5)).save(plan)
    out = tmp_path / "bench.json"
    base = ["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--device", "cpu", "--seq-len", "32",
            "--warmup", "1", "--repeats", "2", "--mode", "layer", "--methods", "dense,orthorank", "--plan", str(plan)]
    assert main([*base, "--profile", "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["layer_index"] == 1 and run["kept_tokens_per_row"] == 16  # the plan's first layer, at its ratio
    phases = run["profile"]["phases"]
    assert set(phases["phases"]) == set(PHASES) and phases["ratio"] == 0.5
    for name in ("scoring", "top-K", "gather", "scatter"):  # the dense layer has none of the selection's work
        assert phases["phases"][name]["dense_ms"] == 0 and phases["phases"][name]["selective_ms"] > 0
    assert phases["phases"]["MLP"]["dense_ms"] > 0 and phases["phases"]["attention kernel"]["dense_ms"] > 0
    assert phases["selective_ms"] == pytest.approx(sum(p["selective_ms"] for p in phases["phases"].values()))
    assert "excess" in capsys.readouterr().out
    assert main([*base, "--layer-index", "3"]) == 2
    assert "not a selection layer" in capsys.readouterr().err


def test_layer_mode_gives_a_sliding_layer_its_band_as_the_models_forward_does():
    """`bench --mode layer` on a sliding-window layer: the dense call reads only the window (the band mask a model's
    forward passes, under which the blocked sliding kernel runs), not every key causally; its output equals the
    layer inside the model's own forward."""
    from conftest import tiny_model
    from orthorank.harness.speed.layer_mode import _layer_calls, band_mask
    from orthorank.harness.speed.runner import RunSettings
    from orthorank.method.selection import SelectionConfig
    from orthorank.models.adapters import get_adapter

    T, window = 40, 16
    assert torch.equal(band_mask(5, 2, torch.device("cpu"))[0, 0].int(),
                       torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0],
                                     [0, 0, 0, 1, 1]]))
    model = tiny_model("gemma3", layers=2)
    assert model.config.layer_types[0] == "sliding_attention" and model.config.sliding_window == window
    adapter = get_adapter(model)
    layer = adapter.layers(model)[0]
    settings = RunSettings(mode="layer", batch=1, seq_len=T)
    with torch.inference_mode():
        fns, path, _ = _layer_calls(model, adapter, layer, 0, SelectionConfig(), settings, torch.device("cpu"))
        assert path == "window"
        # the mask the layer gets in the benchmark's dense call and in the model's own forward, captured by a hook
        seen = {}
        handle = layer.register_forward_hook(lambda m, a, k, out: seen.update(mask=k.get("attention_mask")),
                                             with_kwargs=True)  # returns None: the output stays the layer's
        fns["dense_layer"]()
        bench_mask = seen.pop("mask")
        model(torch.randint(0, model.config.vocab_size, (1, T)))
        handle.remove()
    band = band_mask(T, window, torch.device("cpu"))[0, 0]
    for mask in (bench_mask, seen["mask"]):
        assert mask is not None
        allowed = mask if mask.dtype == torch.bool else mask == 0
        assert torch.equal(allowed[0, 0], band)
