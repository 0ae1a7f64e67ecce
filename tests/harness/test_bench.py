"""Throughput benchmark: cost model, the bench CLI on a tiny shape, and exactness of the fast selective layer's
paths that the method tests do not reach (chunked attention, fixed-K selection)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orthorank.method.apply import selective

from conftest import tiny_model
from orthorank.harness.runtime.costmodel import (
    flop_layer_cost, ideal_speedup, kv_fraction, selective_layer_cost, spread_layers,
)
from orthorank.harness.cli.main import main
from orthorank.method import SelectionConfig, apply_orthorank
from orthorank.method.attention import _chunks
from orthorank.method.layer import SelectiveLayer
from orthorank.method.selection import keep_to_indices, tokens_to_keep, top_k_indices, topk_keep_mask
from orthorank.models.shapes import shape_config

ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-5


def test_kv_fraction_from_config():
    assert round(kv_fraction(shape_config("llama2-7b")), 3) == 0.166
    assert round(kv_fraction(shape_config("llama3-8b")), 3) == 0.038
    assert round(kv_fraction(shape_config("mistral-7b")), 3) == 0.038
    # SmolLM2-135M: q 576x576, k/v 576x192 each, o 576x576, MLP 3x576x1536
    assert kv_fraction(shape_config("smollm2-135m-shape")) == pytest.approx(2 * 192 / (2 * 576 + 2 * 192 + 3 * 1536))


def test_flop_layer_cost_counts_attention():
    """Short prompts: close to the weight-only cost; long prompts: attention's share grows and the selection
    layer's ideal cost falls towards the ratio (Llama-2-7B: 0.441 by weights)."""
    cfg = shape_config("llama2-7b")
    w = selective_layer_cost(kv_fraction(cfg), 0.33)
    short, long_ = flop_layer_cost(cfg, 128, 0.33), flop_layer_cost(cfg, 32768, 0.33)
    assert abs(short - w) < 0.01
    assert 0.33 < long_ < short - 0.03
    costs = [flop_layer_cost(cfg, n, 0.33) for n in (1024, 4096, 16384, 32768)]
    assert costs == sorted(costs, reverse=True)
    # hand count at 32k: per token, K/V + norm for all; attention over (T+1)/2 keys for the selected third
    d, T = 4096, 32768
    every = 4 * d + 2 * 2 * d * d + 3 * d + 2 * d
    keys = (T + 1) / 2
    updated = 2 * d * d + 3 * d + (4 * d * keys + 5 * 32 * keys) + 2 * d * d + d + 4 * d + (6 * d * 11008 + 5 * 11008) + d
    dense = every - 2 * d + updated
    assert long_ == pytest.approx((every + 0.33 * updated) / dense, rel=1e-4)


def test_ideal_speedup():
    f2, f3 = kv_fraction(shape_config("llama2-7b")), kv_fraction(shape_config("llama3-8b"))
    assert selective_layer_cost(f2, 0.33) == pytest.approx(0.441, abs=1e-3)
    # The numbers: 10 of 32 layers at ratio 0.33 -> 1.21x (Llama-2-7B), 1.25x (Llama-3-8B); 7 removed -> 1.28x
    assert ideal_speedup(32, 0, 10, f2, 0.33) == pytest.approx(1.2116, abs=1e-3)
    assert ideal_speedup(32, 0, 10, f3, 0.33) == pytest.approx(1.2521, abs=1e-3)
    assert ideal_speedup(32, 7) == pytest.approx(32 / 25)
    assert ideal_speedup(32) == 1.0
    # a hybrid: removals shrink the model, selection layers then save their share of the kept layers
    assert ideal_speedup(32, 4, 10, f2, 0.33) == pytest.approx(32 / 28 * ideal_speedup(28, 0, 10, f2, 0.33))
    assert ideal_speedup(32, 32) is None
    assert ideal_speedup(32, 0, 10, f2, 1.0) == pytest.approx(1.0)
    assert ideal_speedup(32, 0, 10, f2, 0.33, mode="decode") == 1.0  # every new token is updated
    assert ideal_speedup(32, 0, 10, f2, 0.33, mode="decode", decode="threshold") is None


def test_spread_layers():
    assert spread_layers(10, 32) == [2, 5, 8, 11, 14, 17, 20, 23, 26, 29]
    for n in range(0, 33):
        layers = spread_layers(n, 32)
        assert len(layers) == n and len(set(layers)) == n and all(0 <= i < 32 for i in layers)
        if n <= 30:
            assert 0 not in layers and 31 not in layers


def _bench(tmp_path, *extra):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--device", "cpu",
               "--sparsity", "0.25", "--seq-len", "24", "--warmup", "1", "--repeats", "2",
               "--json", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def test_bench_cli_prefill_decode_layer(tmp_path):
    data = _bench(tmp_path, "--mode", "prefill,decode,layer", "--batch-size", "2", "--new-tokens", "3",
                  "--methods", "dense,spread-prune,spread-orthorank")
    from orthorank.method.cost import Arch
    from orthorank.method.plan import layers_for_sparsity

    n_sel = layers_for_sparsity(0.25, 4, "orthorank", 0.33, match="compute", seq_len=24, inner_only=False,
                                arch=Arch.from_config(shape_config("smollm2-135m-shape"), 4))
    assert data["command"] == "bench" and data["model"] == "smollm2-135m-shape" and data["num_layers"] == 4
    assert data["f_kv"] == pytest.approx(kv_fraction(shape_config("smollm2-135m-shape")))
    assert {"torch", "transformers", "device", "git_commit"} <= set(data["environment"])
    runs = {r["mode"]: r for r in data["runs"]}
    assert set(runs) == {"prefill", "decode", "layer"}
    for mode in ("prefill", "decode"):
        run = runs[mode]
        assert run["batch"] == 2 and run["seq_len"] == 24 and run["repeats"] == 2
        assert run["tokens_per_run"] == (2 * 24 if mode == "prefill" else 2 * 3)
        methods = {m["method"]: m for m in run["methods"]}
        assert set(methods) == {"dense", "spread-prune", "spread-orthorank"}
        # 0.25 of 4 layers: layer removal drops ceil(1.0) = 1; OrthoRank selects in as many layers as it takes to
        # skip at least that much compute at 24 tokens
        assert methods["spread-prune"]["changed_layers"] == 1
        assert methods["spread-orthorank"]["changed_layers"] == n_sel
        assert methods["dense"]["speedup_vs_dense"] == pytest.approx(1.0)
        assert methods["spread-prune"]["throughput_vs_layer_removal"] == pytest.approx(1.0)
        if mode == "prefill":  # decode's ideal counts the LM head (test_decode_ideal_counts_the_lm_head_every_...)
            assert methods["spread-prune"]["ideal_speedup"] == pytest.approx(4 / 3)
        for m in methods.values():
            t = m["timing"]
            assert len(t["times_s"]) == 2 and t["min_s"] <= t["median_s"] <= t["max_s"] and t["spread_pct"] >= 0
            assert m["tokens_per_s"] > 0 and m["pct_of_ideal"] > 0
            assert m["memory"]  # process peak RSS on CPU, peak allocated on CUDA
    f = data["f_kv"]
    cfg = shape_config("smollm2-135m-shape")
    assert runs["prefill"]["methods"][2]["ideal_speedup"] == pytest.approx(
        4 / (4 - n_sel + n_sel * flop_layer_cost(cfg, 24, 0.33)))
    assert runs["prefill"]["methods"][2]["ideal_speedup_weights_only"] == pytest.approx(
        4 / (4 - n_sel + n_sel * selective_layer_cost(f, 0.33)))
    assert runs["decode"]["methods"][2]["ideal_speedup"] == 1.0
    assert runs["decode"]["new_tokens"] == 3
    dec = {m["method"]: m for m in runs["decode"]["methods"]}
    assert runs["decode"]["copy_bandwidth_gb_s"] > 0 and "copy_bandwidth_gb_s" not in runs["prefill"]
    # removing a layer removes its weights and K/V from what a step reads; a selection layer decodes whole
    assert dec["spread-prune"]["bandwidth_bound_tokens_per_s"] > dec["dense"]["bandwidth_bound_tokens_per_s"]
    assert dec["spread-orthorank"]["decode_bytes_per_step"] == dec["dense"]["decode_bytes_per_step"]
    for m in dec.values():
        assert m["pct_of_bandwidth_bound"] == pytest.approx(100 * m["tokens_per_s"] / m["bandwidth_bound_tokens_per_s"])
    assert "implied_selective_layer_cost" in runs["prefill"]["analysis"]
    layer = runs["layer"]
    assert layer["ideal_selective_cost_fraction"] == pytest.approx(flop_layer_cost(cfg, 24, 0.33))
    assert layer["ideal_selective_cost_fraction_weights_only"] == pytest.approx(selective_layer_cost(f, 0.33))
    assert layer["selective_cost_fraction"] > 0 and layer["kept_tokens_per_row"] == 8
    assert {"dense_layer", "selective_layer", "selective_layer_unchunked", "input_norm", "scoring",
            "scoring_and_topk"} <= set(layer["timing"])
    assert layer["attention_chunks"] == 1 and layer["unchunked_attention_cost_fraction"] > 0
    alone = layer["attention_alone"]  # 24 tokens fit the local window: its keys are every key, its ideal is 1
    assert alone["local_fraction_of_causal"] > 0 and alone["local_ideal_fraction_of_causal"] == pytest.approx(1.0)
    assert runs["prefill"]["methods"][0]["speedup_vs_dense_best_runs"] == pytest.approx(1.0)
    from orthorank.harness.reports.speed import markdown_table

    table = markdown_table([data])
    assert table.count("\n| smollm2-135m-shape (4 layers) |") == 6 and "| smollm2-135m-shape | CPU" in table

def test_layer_profile_sorts_operators_into_families(tmp_path, capsys):
    from orthorank.harness.speed.layer_mode import profile_category

    assert profile_category("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention kernel"
    assert profile_category("aten::addmm") == profile_category("aten::mm") == "matmul"
    assert profile_category("aten::index_select") == profile_category("aten::scatter_") == "gather / scatter / copy"
    assert profile_category("aten::sort") == "sort / top-K"
    assert profile_category("aten::rsqrt") == "elementwise"
    data = _bench(tmp_path, "--mode", "layer", "--profile")
    prof = data["runs"][0]["profile"]
    cats = prof["categories"]
    assert set(cats) == {"attention kernel", "matmul", "gather / scatter / copy", "sort / top-K", "elementwise"}
    assert cats["matmul"]["dense_ms"] > 0 and cats["matmul"]["selective_ms"] > 0
    assert cats["sort / top-K"]["dense_ms"] == 0 and cats["sort / top-K"]["selective_over_dense"] is None
    assert "aten::" in prof["dense_layer"] and prof["calls"] == 3
    assert "matmul" in capsys.readouterr().out
    # the gap to the ideal, split by family: the families' excesses add up to the gap (their ideals are the FLOP
    # model's parts; on this tiny shape attention's FLOPs are a small share, so within a few points)
    from orthorank.harness.reports.speed import GAP_PARTS, markdown_table, profile_gap

    run = data["runs"][0]
    gap = profile_gap(run)
    cats = run["profile"]["categories"]
    dense, sel = (sum(c[k] for c in cats.values()) for k in ("dense_ms", "selective_ms"))
    assert gap["fraction"] == pytest.approx(sel / dense)
    attention = cats["attention kernel"]
    assert gap["attention kernel"] == pytest.approx(
        (attention["selective_ms"] - run["kept_tokens_per_row"] / run["seq_len"] * attention["dense_ms"]) / dense)
    assert sum(gap[k] for k in GAP_PARTS) == pytest.approx(gap["gap"], abs=0.08)
    empty = {**run, "profile": {"categories": {c: {"dense_ms": 0.0, "selective_ms": 0.0} for c in cats}}}
    assert profile_gap(empty) is None  # a profile that recorded no time gives no gap, not a division by zero
    table = markdown_table([data])
    assert "| profiled cost fraction |" in table and "mean of 3 profiled calls" in table
    brief = markdown_table([data], family_rows=False)  # `report --brief`: the gap table without the families' ms
    assert "| operator family |" in table and "| operator family |" not in brief
    assert "| profiled cost fraction |" in brief



def test_bench_cli_plan_override_and_errors(tmp_path, capsys):
    from orthorank.method.plan import Plan
    from orthorank.models.loading import load_model

    lm = load_model("smollm2-135m-shape", device="cpu", num_layers=4)
    plan = tmp_path / "plan.json"
    Plan("orthorank", [1, 2], lm.name, lm.signature()).save(plan)
    data = _bench(tmp_path, "--methods", "dense,orthorank", "--plan", str(plan), "--batch-size", "1")
    ortho = data["runs"][0]["methods"][1]
    assert ortho["layers"] == [1, 2] and ortho["layers_from"] == str(plan)
    assert main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "2", "--mode", "sideways"]) == 2
    assert main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "2", "--methods", "dense,magic"]) == 2
    assert "unknown" in capsys.readouterr().err
    # a searched method means its saved plan, never evenly spread layers
    assert main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--methods", "sleb"]) == 2
    assert "no sleb plan" in capsys.readouterr().err


@pytest.mark.parametrize("entry", [
    "orthorank.harness.cli.main",
    "orthorank.harness.cli.bench",
])
def test_bench_path_needs_no_optional_packages(tmp_path, entry):
    """The GPU machine has torch and transformers only: `python -m orthorank.harness.cli.main bench` (and the fallback
    `python -m orthorank.harness.cli.bench`) must not import lm_eval, matplotlib, gguf, accelerate or psutil."""
    code = (
        "import sys, importlib.abc, importlib.util\n"
        "BLOCK = {'lm_eval', 'matplotlib', 'gguf', 'accelerate', 'psutil', 'pandas', 'datasets', 'scipy'}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCK: raise ModuleNotFoundError('not installed: ' + name, name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "_find = importlib.util.find_spec\n"  # availability probes (transformers) see the package as absent
        "importlib.util.find_spec = lambda n, p=None: None if n.split('.')[0] in BLOCK else _find(n, p)\n"
        f"from {entry} import {'main' if entry.endswith('main') else 'standalone as main'}\n"
        f"rc = main(['bench', '--model', 'smollm2-135m-shape', '--num-layers', '2', '--device', 'cpu', "
        f"'--seq-len', '16', '--repeats', '1', '--warmup', '0', '--json', {str(tmp_path / 'b.json')!r}])\n"
        "sys.exit(rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# -- the fast selective layer ------------------------------------------------------------------------------------


def test_top_k_indices_matches_mask_path():
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 6, (3, 40), generator=g).float()  # many ties: earlier positions must win
    keys[1, 0] = -5.0  # the sink has the best raw key but ranks last
    valid = torch.ones(3, 40, dtype=torch.bool)
    for k in (1, 7, 13, 39, 40):
        ref = keep_to_indices(topk_keep_mask(keys, valid, torch.zeros(3, dtype=torch.long), torch.full((3,), k)))[0]
        assert torch.equal(top_k_indices(keys, k, sink_pos=0), ref)


def _naive_reference(m, layer_index, ids, **forward_kwargs):
    """Run the model; return (selective output, dense layer output with only the kept rows updated, keep)."""
    wrapper = m.model.layers[layer_index]
    seen = {}

    def hook(module, args, kwargs, output):
        seen["h"], seen["kwargs"], seen["out"] = args[0], kwargs, output

    handle = wrapper.register_forward_hook(hook, with_kwargs=True)
    m(ids, use_cache=False, **forward_kwargs)
    handle.remove()
    keep = selective(wrapper).last_keep
    dense_out = selective(wrapper).inner(seen["h"], **seen["kwargs"])
    return seen["out"], torch.where(keep.unsqueeze(-1), dense_out, seen["h"]), keep


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_attention_is_exact(monkeypatch, kv_heads, attn, padded):
    """Query chunks against key prefixes (long sequences) give the dense layer's rows, with and without GQA,
    with the model's 4-D mask (eager, padding) and without one (SDPA, no padding)."""
    monkeypatch.setattr(SelectiveLayer, "min_chunk_keys", 16)
    m = tiny_model(num_key_value_heads=kv_heads, attn=attn)
    apply_orthorank(m, [2], SelectionConfig(ratio=0.33))
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 128, (2, 200), generator=g)
    kwargs = {}
    if padded:
        mask = torch.ones(2, 200, dtype=torch.long)
        mask[1, :23] = 0
        kwargs = {"attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp_min(0)}
    assert len(_chunks(66, 200, SelectiveLayer.max_attention_chunks, SelectiveLayer.min_chunk_keys)) == 4
    out, ref, keep = _naive_reference(m, 2, ids, **kwargs)
    assert torch.allclose(out, ref, atol=ATOL), (out - ref).abs().max()
    n_valid = torch.tensor([200, 177 if padded else 200])
    assert (keep.sum(1) == tokens_to_keep(n_valid, 0.33)).all()
    # The same with one chunk: identical selection, outputs equal to rounding.
    monkeypatch.setattr(SelectiveLayer, "max_attention_chunks", 1)
    out1, _, keep1 = _naive_reference(m, 2, ids, **kwargs)
    assert torch.equal(keep, keep1) and torch.allclose(out, out1, atol=ATOL)


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral"])
@pytest.mark.parametrize("padded", [False, True])
def test_long_prompt_paths_are_exact(monkeypatch, family, padded):
    """The two long-prompt paths of selective attention on CPU give the dense layer's rows: sliding-window layers
    read only their chunks' windows of keys, full layers split into an unmasked prefix and a masked diagonal (made
    to engage at 16 keys here; padding keeps the masked path). Both full and sliding layers of Gemma 3."""
    from orthorank.method import attention, attention_split

    monkeypatch.setattr(SelectiveLayer, "min_chunk_keys", 16)
    monkeypatch.setattr(attention, "SPLIT_MIN_KEYS", 16)
    calls = {"split": 0, "window": 0}
    split, windowed = attention_split.split_attention, attention._window_chunks

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(attention_split, "split_attention", count("split", split))
    monkeypatch.setattr(attention, "_window_chunks", count("window", windowed))
    m = tiny_model(family, **({"sliding_window": 16} if family == "mistral" else {}))
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33))
    ids = torch.randint(1, 128, (2, 200), generator=torch.Generator().manual_seed(5))
    kwargs = {}
    if padded:
        mask = torch.ones(2, 200, dtype=torch.long)
        mask[1, :23] = 0
        kwargs = {"attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp_min(0)}
    for layer in (1, 2):
        out, ref, _ = _naive_reference(m, layer, ids, **kwargs)
        assert torch.allclose(out, ref, atol=ATOL), (family, layer, (out - ref).abs().max())
    if family in ("gemma3", "mistral"):
        assert calls["window"] > 0  # the sliding layers took the windowed chunks
    if family != "mistral" and not padded and attention_split.available():
        assert calls["split"] > 0  # the full layers took the split


@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_mask_is_one_row_per_selected_token(monkeypatch, padded):
    """Long prompts: the masks handed to SDPA are [B, 1, chunk, keys], one row per selected token shared by all
    heads, never repeated per head or per query group (memory at 8k tokens)."""
    import torch.nn.functional as F

    from orthorank.method import attention

    monkeypatch.setattr(SelectiveLayer, "min_chunk_keys", 16)
    m = tiny_model(num_key_value_heads=2)  # 4 heads: query groups of 2
    apply_orthorank(m, [2], SelectionConfig(ratio=0.33))
    shapes = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        if q.shape[2] < 200:  # the selective layer's chunks (the dense layers see all 200 queries)
            shapes.append((tuple(q.shape), None if attn_mask is None else tuple(attn_mask.shape)))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    ids = torch.randint(1, 128, (2, 200), generator=torch.Generator().manual_seed(5))
    kwargs = {}
    if padded:
        mask = torch.ones(2, 200, dtype=torch.long)
        mask[1, :23] = 0
        kwargs = {"attention_mask": mask}
    m(ids, use_cache=False, **kwargs)
    assert len(shapes) == 4
    for q_shape, m_shape in shapes:
        B, H, chunk, _ = q_shape
        assert H == 4 and m_shape is not None and m_shape[:3] == (B, 1, chunk), (q_shape, m_shape)


def test_chunked_prefill_with_cache_is_exact(monkeypatch):
    """A prompt fed in two chunks through the KV cache: the second chunk's sink lies in the cache."""
    monkeypatch.setattr(SelectiveLayer, "min_chunk_keys", 16)
    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.5))
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(1, 128, (2, 80), generator=g)
    first = m(ids[:, :40], use_cache=True)
    cache = first.past_key_values if hasattr(first, "past_key_values") else first.cache
    keep_first = selective(m.model.layers[2]).last_keep.clone()
    wrapper = m.model.layers[2]
    seen = {}
    handle = wrapper.register_forward_hook(
        lambda mod, a, k, o: seen.update(h=a[0], kw=k, o=o), with_kwargs=True)
    from orthorank.models.static_decode import cache_kwarg as _cache_kwarg

    m(ids[:, 40:], use_cache=True, **{_cache_kwarg(m): cache})
    handle.remove()
    keep = selective(wrapper).last_keep
    assert keep_first.shape == (2, 40) and keep.shape == (2, 40)
    assert (keep.sum(1) == 20).all()  # ceil(0.5 * 40); the sink (in the cache) cannot be chosen
    # Reference: the dense layer over the same chunk with the cache as it was before this layer's update.
    layer_cache = seen["kw"].get("cache", seen["kw"].get("past_key_values"))
    keys, values = layer_cache.layers[wrapper.self_attn.layer_idx].keys, \
        layer_cache.layers[wrapper.self_attn.layer_idx].values
    from transformers import DynamicCache

    ref_cache = DynamicCache(config=m.config)
    ref_cache.update(keys[:, :, :40], values[:, :, :40], wrapper.self_attn.layer_idx)
    kw = dict(seen["kw"])
    kw.pop("past_key_values", None)
    kw["cache" if "cache" in seen["kw"] else "past_key_values"] = ref_cache
    dense_out = selective(wrapper).inner(seen["h"], **kw)
    ref = torch.where(keep.unsqueeze(-1), dense_out, seen["h"])
    assert torch.allclose(seen["o"], ref, atol=ATOL), (seen["o"] - ref).abs().max()


def test_selective_layer_does_not_modify_its_input():
    m = tiny_model()
    apply_orthorank(m, [1], SelectionConfig(ratio=0.33))
    h = torch.randn(2, 20, 64)
    before = h.clone()
    pos = torch.arange(20).unsqueeze(0)
    out = m.model.layers[1](h, attention_mask=None, position_ids=pos,
                            position_embeddings=m.model.rotary_emb(h, pos), use_cache=False)
    assert torch.equal(h, before) and not torch.equal(out, h)


def test_gpu_script_tiny(tmp_path):
    """The GPU script's CPU dry run: every run it makes (shapes with Gemma's, policies, decode implementations) on
    4-layer shapes, one folder of JSON and the Markdown summary."""
    env = {**os.environ, "GPU_BENCH_TINY": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_bench.sh"), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    for shape in ("smollm2-135m-shape", "gemma3-270m-shape"):
        assert {f"prefill-{shape}.json", f"decode-{shape}.json", f"decode-threshold-{shape}.json"} <= set(files)
    assert {"prefill-policies-smollm2-135m-shape.json", "prefill-keep-recent-smollm2-135m-shape.json"} <= set(files)
    impls = {r["decode_impl"] for r in json.loads((tmp_path / "decode-gemma3-270m-shape.json").read_text())["runs"]}
    assert impls == {"eager", "static"} and "bandwidth bound" in (tmp_path / "summary.md").read_text()


def test_spread_hybrid_for_speed_measurements(tmp_path):
    """spread-hybrid (random shapes, no calibration): half of removal's layers removed, selection layers making up
    the other half's compute; timed beside dense, removal and OrthoRank, with its ideal speed-up."""
    from orthorank.harness.speed.specs import spread_hybrid_layers
    from orthorank.method.cost import Arch, removal_sparsity, hybrid_compute_sparsity

    cfg = shape_config("llama2-7b")
    arch = Arch.from_config(cfg, 32)
    removed, sel = spread_hybrid_layers(0.2, 32, 0.33, arch, 2048)
    assert len(removed) == 3 and not set(removed) & set(sel) and sel
    target = removal_sparsity(arch, 2048, 7)
    assert hybrid_compute_sparsity(arch, 2048, 3, [0.33] * len(sel)) >= target
    assert hybrid_compute_sparsity(arch, 2048, 3, [0.33] * (len(sel) - 1)) < target
    data = _bench(tmp_path, "--mode", "prefill", "--methods", "dense,spread-prune,spread-hybrid", "--num-layers", "8")
    rows = {m["method"]: m for m in data["runs"][0]["methods"]}
    h = rows["spread-hybrid"]
    assert h["kind"] == "hybrid" and h["removed_layers"] and h["layers"]
    assert h["ideal_speedup"] > 1 and h["speedup_vs_dense"] > 0 and h["sparsity"]["compute"] > 0


def test_decode_step_bytes_count_the_layers_that_run_and_the_cache():
    from orthorank.harness.runtime.bandwidth import decode_bound, decode_step_bytes

    model = tiny_model("llama", layers=4)
    cfg = model.config
    layer = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    head = model.lm_head.weight.numel() * 4
    kv_row = 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    dense = decode_step_bytes(model, (), batch=1, context=0)
    assert dense["weights"] == 4 * layer + head and dense["kv_cache"] == 0
    pruned = decode_step_bytes(model, [1, 2], batch=3, context=10)
    assert pruned["weights"] == 2 * layer + head and pruned["kv_cache"] == 3 * 10 * 2 * kv_row
    assert decode_bound(pruned, 3, 1e9) == pytest.approx(3e9 / pruned["total"])


def test_bench_threshold_decode_has_an_ideal_at_the_updated_share(tmp_path):
    """--policies +decode=threshold adds a row on the same layers; its ideal speed-up is the weights model's at the
    share of decoded tokens the selection layers updated (counted in an untimed run), so it has a % of ideal."""
    data = _bench(tmp_path, "--mode", "prefill,decode", "--batch-size", "1", "--new-tokens", "4",
                  "--methods", "dense,spread-orthorank", "--policies", "+decode=threshold")
    prefill, decode = data["runs"]
    assert [m["method"] for m in prefill["methods"]] == ["dense", "spread-orthorank"]  # the same prefill, once
    rows = {m["method"]: m for m in decode["methods"]}
    plain, thr = rows["spread-orthorank"], rows["spread-orthorank [+decode=threshold]"]
    assert plain["layers"] == thr["layers"] and thr["selection"]["decode"] == "threshold"
    assert plain["ideal_speedup"] == 1.0 and "decoded_tokens_updated" not in plain
    u, n, f = thr["decoded_tokens_updated"], len(thr["layers"]), data["f_kv"]
    assert 0.0 <= u <= 1.0
    from orthorank.harness.runtime.costmodel import with_fixed_share

    layers_only = 4 / (4 - n + n * selective_layer_cost(f, u))
    assert thr["ideal_speedup"] == pytest.approx(with_fixed_share(layers_only, decode["head_share"]))
    assert thr["pct_of_ideal"] > 0


def test_bench_policies_need_an_orthorank_row(tmp_path, capsys):
    assert main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--methods", "dense,spread-prune",
                 "--policies", "+decode=threshold"]) == 2
    assert main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--policies", "+decode=maybe"]) == 2


@pytest.mark.parametrize("B,H,Hkv,S,K,chunks", [(1, 9, 3, 700, 240, 4), (2, 4, 4, 300, 100, 3), (1, 8, 2, 2048, 600, 32),
                                                (1, 4, 1, 64, 64, 2), (2, 8, 2, 700, 240, 4)])
def test_split_attention_equals_the_masked_kernel(B, H, Hkv, S, K, chunks):
    """The prefix (unmasked) + diagonal (masked) split, merged by log-sum-exp, gives the masked SDPA's output for
    selected queries at their positions, grouped-query heads included; every query seeing only itself (K = S) too."""
    from orthorank.method import attention_split
    from orthorank.method.attention import _sdpa

    if not attention_split.available():
        pytest.skip("this torch has no CPU flash kernel returning the log-sum-exp")
    gen = torch.Generator().manual_seed(S + K)
    q = torch.randn(B, K, H, 16, generator=gen)
    k, v = torch.randn(B, Hkv, S, 16, generator=gen), torch.randn(B, Hkv, S, 16, generator=gen)
    pos = torch.stack([torch.sort(torch.randperm(S, generator=gen)[:K]).values for _ in range(B)])
    pos[:, 0] = 0  # the sink
    ref = _sdpa(q, pos, k, v, 0.25, 0, None, None, None, chunks, 8)
    got = attention_split.split_attention(q.transpose(1, 2), pos, k, v, 0.25, _chunks(K, S, chunks, 8))
    torch.testing.assert_close(got.transpose(1, 2).reshape(B, K, H * 16), ref, rtol=1e-5, atol=1e-5)


def test_split_attention_in_bfloat16_stays_in_bfloat16():
    """The diagonal's mask is built in the queries' dtype: a bfloat16 split equals the float32 one to bf16 rounding."""
    from orthorank.method import attention_split

    if not attention_split.available():
        pytest.skip("this torch has no CPU flash kernel returning the log-sum-exp")
    gen = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 8, 100, 16, generator=gen), torch.randn(1, 2, 300, 16, generator=gen), \
        torch.randn(1, 2, 300, 16, generator=gen)
    pos = torch.sort(torch.randperm(299, generator=gen)[:100] + 1).values[None]
    chunks = _chunks(100, 300, 4, 8)
    ref = attention_split.split_attention(q, pos, k, v, 0.25, chunks)
    got = attention_split.split_attention(q.bfloat16(), pos, k.bfloat16(), v.bfloat16(), 0.25, chunks)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("groups", [1, 3, 4, 8])
@pytest.mark.parametrize("K", [20, 338, 1352, 5407, 10813, 43000])
def test_split_chunks_fill_whole_query_blocks(groups, K):
    """The split cuts selected queries into 2..max_chunks chunks whose folded rows (queries x query heads per KV
    head) fit whole 256-row blocks of the CPU flash kernel, at least 4 blocks per chunk, more only where 32 chunks
    would not hold the queries otherwise."""
    from orthorank.method.attention import SPLIT_MIN_KEYS, SPLIT_ROW_BLOCK, query_chunks, split_chunk_count

    n = split_chunk_count(K, groups, 32)
    path, chunks = query_chunks(K, SPLIT_MIN_KEYS, groups, None, 32, 512, True)
    assert path == "split" and len(chunks) == n and chunks[0][0] == 0 and chunks[-1][1] == K
    assert 2 <= n <= 32
    rows = max(b - a for a, b in chunks) * groups
    blocks = -(-rows // SPLIT_ROW_BLOCK)
    per_chunk = 4 * SPLIT_ROW_BLOCK // groups
    if -(-K // per_chunk) <= 32 and n < K // 16:  # the fewest chunks whose rows fill at most 4 blocks each
        assert blocks <= 4 and (n == 2 or -(-K // (n - 1)) * groups > 4 * SPLIT_ROW_BLOCK)
    elif n < K // 16:  # 4 blocks would need more than 32 chunks: larger chunks, still whole blocks
        assert blocks > 4 and -(-K // (SPLIT_ROW_BLOCK * (blocks - 1) // groups)) > 32  # one block fewer: > 32
    assert query_chunks(K, SPLIT_MIN_KEYS - 1, groups, None, 32, 512, True)[0] == "masked"
    assert query_chunks(K, SPLIT_MIN_KEYS, groups, None, 1, 512, True) == ("masked", [(0, K)])


def test_bench_takes_several_lengths_and_times_attention_alone(tmp_path):
    data = _bench(tmp_path, "--mode", "layer,prefill", "--seq-len", "24,40", "--methods", "dense,spread-orthorank")
    runs = [(r["mode"], r["seq_len"]) for r in data["runs"]]
    assert runs == [("layer", 24), ("layer", 40), ("prefill", 24), ("prefill", 40)]
    assert set(data["ideal_selective_layer_cost_flops"]) == {"24", "40"}
    layer = data["runs"][0]["attention_alone"]
    assert layer["masked_fraction_of_causal"] > 0 and 0.3 < layer["query_fraction"] < 0.4
    from orthorank.method import attention_split

    assert (layer["split_fraction_of_causal"] > 0) == attention_split.available()


def test_decode_floor_script_tiny(tmp_path):
    """scripts/decode_floor.py on a 2-layer shape: the bound, the GEMV floors, the read rate and the eager step of
    one configuration in its JSON, and the folder's table rendered from every JSON there."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "decode_floor.py"), "--model",
                           "smollm2-135m-shape", "--num-layers", "2", "--batch", "1,2", "--rounds", "1", "--threads", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "smollm2-135m-shape-float32-1t.json").read_text())
    assert [r["batch"] for r in result["rows"]] == [1, 2] and result["environment"]["git_commit"]
    row = result["rows"][0]
    assert row["linear_calls"] == 2 * 7 + 1 and row["bound_tokens_s"] > 0
    assert all(row[f"{k}_tokens_s"] > 0 for k in ("gemv_floor", "gemv_transposed", "eager"))
    assert (tmp_path / "decode-floor.md").read_text().count("| smollm2-135m-shape |") == 2


def test_bench_rows_record_the_peak_above_the_loaded_model(tmp_path):
    """A timed run that reuses heap pages its warm-up left resident grows the resident set by nothing after the
    per-run reset (the 0 MB rows of Gemma's 1k prefill); each row also holds its peak above the model as loaded,
    which covers those pages, and the printed table shows that one."""
    out = tmp_path / "bench.json"  # a fresh process: this one's heap, grown by earlier tests, would hide the run's
    proc = subprocess.run([sys.executable, "-m", "orthorank.harness.cli.main", "bench", "--model", "smollm2-135m-shape",
                           "--num-layers", "4", "--device", "cpu", "--sparsity", "0.25", "--seq-len", "256", "--warmup",
                           "1", "--repeats", "2", "--mode", "prefill", "--methods", "dense,spread-prune", "--json",
                           str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    for m in data["runs"][0]["methods"]:
        mem = m["memory"]
        if "peak_above_start_mib" in mem:  # Linux: VmHWM can be reset
            assert mem["peak_above_model_mib"] >= mem["peak_above_start_mib"] and mem["peak_above_model_mib"] > 0


def test_decode_ideal_counts_the_lm_head_every_method_reads(tmp_path):
    """A decode step reads the whole LM head whatever the plan, so removing n of L layers cannot speed it up by
    L / (L - n): the ideal is Amdahl's with the head's share of the step's weight bytes (Gemma 3 270M: 63%)."""
    from orthorank.harness.runtime.bandwidth import decode_head_share
    from orthorank.harness.runtime.costmodel import with_fixed_share
    from orthorank.models.loading import load_model

    assert with_fixed_share(2.0, 0.0) == 2.0 and with_fixed_share(2.0, 1.0) == 1.0 and with_fixed_share(None, 0.5) is None
    assert with_fixed_share(4 / 3, 0.5) == pytest.approx(1 / (0.5 * 0.75 + 0.5))
    share = decode_head_share(load_model("smollm2-135m-shape", device="cpu", dtype="float32", num_layers=4).model)
    assert 0.5 < share < 0.9  # a 4-layer shape keeps the full 49k-word head
    data = _bench(tmp_path, "--mode", "prefill,decode", "--new-tokens", "2", "--methods", "dense,spread-prune")
    runs = {r["mode"]: {m["method"]: m for m in r["methods"]} for r in data["runs"]}
    assert runs["prefill"]["spread-prune"]["ideal_speedup"] == pytest.approx(4 / 3)
    assert runs["decode"]["spread-prune"]["ideal_speedup"] == pytest.approx(1 / ((1 - share) * 0.75 + share))
    assert runs["decode"]["dense"]["ideal_speedup"] == pytest.approx(1.0)


def test_decode_step_parts_script_tiny(tmp_path):
    """scripts/decode_step_parts.py on a 2-layer shape: every setup's step time against dense, and the ideals of
    the two forced outcomes, in its JSON."""
    out = tmp_path / "parts.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "decode_step_parts.py"), "--model",
                           "smollm2-135m-shape", "--num-layers", "2", "--layers", "1", "--context", "16", "--steps",
                           "2", "--rounds", "1", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["setup"]: r for r in result["rows"]}
    assert set(rows) == {"dense", "keep-all", "keep-none", "threshold", "keep-all/general", "keep-none/general",
                         "threshold/general"} and rows["dense"]["vs_dense"] == 1.0
    assert rows["keep-all"]["ideal_vs_dense"] == 1.0 and 0 < rows["keep-none"]["ideal_vs_dense"] < 1
    assert all(r["median_step_ms"] > 0 for r in rows.values()) and result["environment"]["git_commit"]


def test_split_chunks_script_tiny(tmp_path):
    """scripts/split_chunks.py at 512 tokens: each chunk count's split attention against causal, and the count
    the layer would choose, in its JSON."""
    from orthorank.method import attention_split

    if not attention_split.available():
        pytest.skip("this torch has no CPU flash kernel returning the log-sum-exp")
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "split_chunks.py"), "--shape", "smollm2",
                           "--seq-len", "512", "--chunks", "2,4", "--rounds", "1", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["split_of_causal"]) == {"2", "4"} and all(x > 0 for x in result["split_of_causal"].values())
    assert result["folded_rows_per_chunk"] == {"2": 255, "4": 129} and result["chosen_by_split_chunk_count"] == 2
    assert result["environment"]["git_commit"]


def test_decode_prompts_from_text_cycle_its_rows_to_the_batch():
    """--prompt-text: the workload's prompt rows are the text's windows, reused in turn, cut to the prompt length;
    without it, seeded random tokens as before."""
    from orthorank.harness.speed.runner import RunSettings, workload_ids

    text = torch.arange(30).view(3, 10)
    ids = workload_ids(RunSettings("decode", 5, 8, new_tokens=2, prompts=text), 1000, torch.device("cpu"))
    assert ids.tolist() == [text[r, :8].tolist() for r in (0, 1, 2, 0, 1)]
    rand = workload_ids(RunSettings("decode", 2, 8, new_tokens=2), 1000, torch.device("cpu"))
    assert rand.shape == (2, 8) and torch.equal(rand, workload_ids(RunSettings("decode", 2, 8, new_tokens=2), 1000,
                                                                   torch.device("cpu")))


def test_bench_prompt_text_needs_a_tokenizer_and_a_readable_source(tmp_path, capsys):
    text = tmp_path / "prompt.txt"
    text.write_text("a short text " * 50)
    assert main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--mode", "decode",
                 "--prompt-text", str(text)]) == 2
    assert "tokenizer" in capsys.readouterr().err
    assert main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--mode", "decode",
                 "--prompt-text", str(tmp_path / "none.txt")]) == 2
