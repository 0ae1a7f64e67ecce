"""Static-cache decoding (models/static_decode.py): greedy outputs equal transformers' eager generation with its
dynamic cache, for dense, pruned and OrthoRank models of several families, eagerly and compiled; one warning line
and an eager static-cache loop where compile cannot run; bench's decode rows through it."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_model
from orthorank.method import SelectionConfig, apply_orthorank
from orthorank.method.apply import prune_layers, restore_dense
from orthorank.models import static_decode
from orthorank.models.static_decode import StaticDecoder

NEW = 6


def _ids(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (B, T), generator=torch.Generator().manual_seed(seed))


def _reference(model, ids) -> torch.Tensor:
    model.generation_config.eos_token_id = None  # no stop (forcing a length would suppress EOS, changing argmaxes)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                         pad_token_id=0)
    return out[:, ids.shape[1]:]


def _plans(model):
    yield "dense", lambda m: None
    yield "pruned", lambda m: prune_layers(m, [1])
    yield "orthorank", lambda m: apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.5, decode="dense"))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "mistral"])
def test_static_cache_greedy_equals_eager_generation(family):
    model = tiny_model(family)
    ids = _ids(2, 20)  # crosses the sliding windows (16) of gemma3 and mistral
    for name, apply in _plans(model):
        apply(model)
        try:
            want = _reference(model, ids)
            got = StaticDecoder(model, 2, ids.shape[1] + NEW, "static").greedy(ids, NEW)
            assert torch.equal(got, want), (family, name)
        finally:
            restore_dense(model)


def test_compiled_step_equals_eager_generation_for_each_plan():
    torch._dynamo.reset()
    model = tiny_model("llama")
    ids = _ids(1, 12)
    for name, apply in _plans(model):
        apply(model)
        try:
            want = _reference(model, ids)
            dec = StaticDecoder(model, 1, ids.shape[1] + NEW, "compile")
            assert dec.impl == "compile"
            assert torch.equal(dec.greedy(ids, NEW), want), name
            assert torch.equal(dec.greedy(ids, NEW), want), name  # a second pass reuses the compiled step
        finally:
            restore_dense(model)


def test_no_compiler_is_one_warning_and_an_eager_static_loop(monkeypatch, capsys):
    monkeypatch.setattr(static_decode, "compile_available", lambda device: "no C++ compiler on PATH")
    monkeypatch.setattr(static_decode, "_WARNED", set())
    model = tiny_model("llama")
    ids = _ids(1, 10)
    want = _reference(model, ids)
    for _ in range(2):
        dec = StaticDecoder(model, 1, ids.shape[1] + NEW, "compile")
        assert dec.impl == "static" and torch.equal(dec.greedy(ids, NEW), want)
    err = capsys.readouterr().err
    assert err.count("warning: no C++ compiler on PATH; decoding eagerly on the static cache") == 1


def test_full_static_cache_is_refused():
    model = tiny_model("llama")
    dec = StaticDecoder(model, 1, 8, "static")
    with pytest.raises(ValueError, match="no room"):
        dec.prefill(_ids(1, 8))


def test_bench_decode_on_a_static_cache(tmp_path):
    from orthorank.harness.cli.main import main

    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", "smollm2-135m-shape", "--num-layers", "4", "--device", "cpu", "--sparsity", "0.25",
               "--seq-len", "16", "--mode", "decode", "--new-tokens", "3", "--repeats", "2", "--decode-impl", "eager,static",
               "--methods", "dense,spread-prune,spread-orthorank", "--json", str(out)])
    assert rc == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["decode_impl"] for r in runs] == ["eager", "static"]
    for run in runs:
        assert len(run["methods"]) == 3
        assert all(len(m["timing"]["times_s"]) == 2 and m["pct_of_bandwidth_bound"] > 0 for m in run["methods"])


def test_bench_refuses_an_unknown_decode_impl(capsys):
    from cli_helpers import assert_user_error

    assert_user_error(capsys, "unknown --decode-impl 'jit'", "bench", "--model", "smollm2-135m-shape", "--num-layers",
                      "2", "--mode", "decode", "--decode-impl", "eager,jit")
