"""Intervals, the FLOP cost model and compute matching, the result store: each against a known answer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from orthorank.errors import UserError
from orthorank.harness.evaluation.stats import (
    accuracy_interval, mean_stderr, paired_difference, paired_perplexity_ratio, perplexity_interval,
)
from orthorank.method.cost import Arch, removal_sparsity, selection_sparsity, layer_flops, selection_layers_to_match
from orthorank.method.plan import Plan, layers_for_sparsity
from orthorank.method.selection import SelectionConfig
from orthorank.harness.store import ResultStore, StoreError, fill

SMOLLM2 = Arch(num_layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)
LLAMA2_7B = Arch(num_layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008, vocab=32000)


# -- intervals ----------------------------------------------------------------------------------------------------

def test_constant_windows_give_a_point_interval():
    ci = perplexity_interval([2.0 * 100] * 20, 100)
    assert ci.value == pytest.approx(math.exp(2.0)) and ci.low == pytest.approx(ci.value) == ci.high


def test_identical_methods_have_ratio_one_and_a_constant_shift_is_exact():
    rng = np.random.default_rng(0)
    a = rng.normal(300, 30, size=50)
    same = paired_perplexity_ratio(a, a, 100)
    assert same.value == same.low == same.high == 1.0 and not same.excludes(1.0)
    shifted = paired_perplexity_ratio(a + 5.0, a, 100)  # every window 5 nats worse over 100 tokens
    assert shifted.low == pytest.approx(math.exp(0.05)) and shifted.high == pytest.approx(math.exp(0.05))
    assert shifted.excludes(1.0)


def test_bootstrap_matches_the_normal_interval_for_a_large_sample():
    rng = np.random.default_rng(1)
    n, tokens = 2000, 1000
    per_token = rng.normal(3.0, 0.2, size=n)
    ci = perplexity_interval(per_token * tokens, tokens, iters=4000)
    half = 1.96 * per_token.std(ddof=1) / math.sqrt(n)
    m = per_token.mean()
    assert math.log(ci.low) == pytest.approx(m - half, abs=0.1 * half)
    assert math.log(ci.high) == pytest.approx(m + half, abs=0.1 * half)


def test_paired_interval_is_tighter_than_unpaired_when_windows_vary():
    rng = np.random.default_rng(2)
    difficulty = rng.normal(400, 80, size=40)
    a, b = difficulty + rng.normal(0, 1, 40), difficulty + 4 + rng.normal(0, 1, 40)
    paired = paired_perplexity_ratio(a, b, 128)
    ia, ib = perplexity_interval(a, 128), perplexity_interval(b, 128)
    assert paired.high < 1.0  # a is better on every window: the paired interval says so
    assert ia.high > ib.low  # while the two separate intervals overlap


def test_accuracy_stderr_and_paired_difference():
    x = [1, 0] * 50
    assert mean_stderr(x) == pytest.approx(math.sqrt(0.25 * 100 / 99 / 100))
    assert accuracy_interval([1] * 30).low == 1.0
    d = paired_difference([1] * 40, [0] * 40)
    assert d.value == d.low == d.high == 1.0 and d.excludes(0.0)
    same = paired_difference(x, x)
    assert same.low == same.high == 0.0 and not same.excludes(0.0)
    with pytest.raises(ValueError):
        paired_difference([1, 0], [1])


def test_intervals_are_deterministic_for_a_seed():
    a = np.random.default_rng(3).normal(100, 10, 30)
    assert perplexity_interval(a, 50, seed=4) == perplexity_interval(a, 50, seed=4)


# -- cost model ---------------------------------------------------------------------------------------------------

def test_kv_share_and_layer_flops():
    f = layer_flops(LLAMA2_7B, 1)
    kv = 2 * 2 * 4096 * 4096
    assert kv / f.dense == pytest.approx(0.166, abs=0.002)  # notes: K/V are 16.6% of a Llama-2-7B layer
    f_s = layer_flops(SMOLLM2, 1)
    assert 2 * 2 * 576 * 192 / f_s.dense == pytest.approx(0.0625, abs=0.001)


def test_sparsity_measures():
    assert Plan("orthorank", list(range(1, 10)), "m", {"num_layers": 30},
                selection=SelectionConfig(ratio=0.33)).nominal_sparsity == pytest.approx(0.201)
    assert Plan("prune", list(range(1, 7)), "m", {"num_layers": 30}).nominal_sparsity == pytest.approx(0.2)
    head = 2 * 576 * 49152
    dense = 30 * layer_flops(SMOLLM2, 2048).dense + head + 4 * 576
    assert removal_sparsity(SMOLLM2, 2048, 6) == pytest.approx(6 * layer_flops(SMOLLM2, 2048).dense / dense)
    # a selection layer at ratio 1 skips nothing and pays the scoring
    assert selection_sparsity(SMOLLM2, 2048, 5, 1.0) < 0
    # bypassed tokens still pay K/V: 9 selection layers skip less than 6 removed layers (the 0.192 vs 0.2
    # counts decoder layers only; here the LM head is in the denominator too)
    assert selection_sparsity(SMOLLM2, 2048, 9, 0.33) < removal_sparsity(SMOLLM2, 2048, 6)


def test_compute_matched_layer_counts():
    assert layers_for_sparsity(0.2, 30, "orthorank", 0.33, match="nominal") == 9
    n = layers_for_sparsity(0.2, 30, "orthorank", 0.33, match="compute", arch=SMOLLM2, seq_len=2048)
    target = removal_sparsity(SMOLLM2, 2048, 6)
    assert selection_sparsity(SMOLLM2, 2048, n, 0.33) >= target
    assert selection_sparsity(SMOLLM2, 2048, n - 1, 0.33) < target
    assert n == 10
    assert layers_for_sparsity(0.1, 30, "orthorank", 0.33, match="compute", arch=SMOLLM2) == 5
    assert selection_layers_to_match(SMOLLM2, 2048, 0.0, 0.33) == 0
    with pytest.raises(UserError, match="inner layers"):
        layers_for_sparsity(0.6, 30, "orthorank", 0.33, match="compute", arch=SMOLLM2)
    with pytest.raises(UserError, match="matching rule"):
        layers_for_sparsity(0.2, 30, "orthorank", 0.33, match="flops")


# -- result store -------------------------------------------------------------------------------------------------

def test_store_resumes_and_never_recomputes(tmp_path):
    store = ResultStore(tmp_path)
    ns = store.namespace("perplexity", {"model": "m", "plan": "p"})
    calls = []

    def compute(idx):
        calls.append(list(idx))
        return {i: {"nll": float(i)} for i in idx}

    assert fill(ns, range(5), compute, chunk=2) == {i: {"nll": float(i)} for i in range(5)}
    assert calls == [[0, 1], [2, 3], [4]]
    calls.clear()
    again = store.namespace("perplexity", {"model": "m", "plan": "p"})
    assert fill(again, range(7), compute, chunk=2)[6] == {"nll": 6.0}
    assert calls == [[4, 5], [6]]  # chunks are fixed by index: only unfinished ones run


def test_store_keys_keep_results_apart(tmp_path):
    store = ResultStore(tmp_path)
    a = store.namespace("perplexity", {"model": "m", "plan": "p", "code": "v1"})
    a.put({0: {"nll": 1.0}})
    b = store.namespace("perplexity", {"model": "m", "plan": "p", "code": "v2"})
    assert b.load() == {} and a.load() == {0: {"nll": 1.0}}
    assert a.folder != b.folder


def test_store_corrupt_entry_is_named_or_recomputed(tmp_path):
    store = ResultStore(tmp_path)
    ns = store.namespace("zeroshot", {"k": 1})
    path = ns.put({3: {"acc": 1.0}})
    body = json.loads(path.read_text())
    body["entries"]["3"]["acc"] = 0.0  # checksum no longer matches
    path.write_text(json.dumps(body))
    with pytest.raises(StoreError, match=path.name):
        ns.load()
    lenient = ResultStore(tmp_path, recompute_corrupt=True).namespace("zeroshot", {"k": 1})
    with pytest.warns(UserWarning, match="corrupt"):
        assert lenient.load() == {}
    path2 = lenient.put({3: {"acc": 1.0}})
    path2.write_text("{not json")
    with pytest.raises(StoreError, match="corrupt"):
        ResultStore(tmp_path).namespace("zeroshot", {"k": 1}).load()


def test_store_write_is_atomic(tmp_path, monkeypatch):
    """A crash while writing leaves no partial entry behind, only what was finished before."""
    store = ResultStore(tmp_path)
    ns = store.namespace("perplexity", {"k": 2})
    ns.put({0: {"nll": 1.0}})
    import os

    real = os.replace

    def crash(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        ns.put({1: {"nll": 2.0}})
    monkeypatch.setattr(os, "replace", real)
    assert ns.load() == {0: {"nll": 1.0}}
    assert not list(ns.folder.glob(".tmp-*"))


def test_store_merges_shards(tmp_path):
    key = {"model": "m"}
    one = ResultStore(tmp_path / "one")
    two = ResultStore(tmp_path / "two")
    one.namespace("perplexity", key).put({0: {"nll": 1.0}})
    two.namespace("perplexity", key).put({1: {"nll": 2.0}})
    two.namespace("perplexity", {"model": "other"}).put({0: {"nll": 9.0}})
    assert one.merge(tmp_path / "two") == 2
    assert one.namespace("perplexity", key).load() == {0: {"nll": 1.0}, 1: {"nll": 2.0}}
    assert one.namespace("perplexity", {"model": "other"}).load() == {0: {"nll": 9.0}}
    with pytest.raises(UserError):
        one.merge(tmp_path / "missing")


def test_model_fingerprint_sees_weights():
    from conftest import tiny_model
    from orthorank.harness.store import model_fingerprint

    a, b = tiny_model(seed=0), tiny_model(seed=0)
    assert model_fingerprint(a) == model_fingerprint(b)
    with torch.no_grad():
        b.model.layers[1].mlp.down_proj.weight[0, 0] += 1.0
    assert model_fingerprint(a) != model_fingerprint(b)


def test_model_fingerprint_ignores_where_the_weights_were_loaded_from():
    from conftest import tiny_model
    from orthorank.harness.store import model_fingerprint

    a, b = tiny_model(seed=0), tiny_model(seed=0)
    a.config._name_or_path, b.config._name_or_path = "/checkout-a/.venv/model", "/checkout-b/.venv/model"
    assert model_fingerprint(a) == model_fingerprint(b)
    b.config.rms_norm_eps = 0.5
    assert model_fingerprint(a) != model_fingerprint(b)


def test_rekey_model_moves_results_to_the_new_fingerprint(tmp_path):
    store = ResultStore(tmp_path)
    key = {"model": "old-a", "dataset": "d"}
    store.namespace("perplexity", key).put({0: {"nll": 1.0}})
    store.namespace("perplexity", {**key, "model": "old-b"}).put({1: {"nll": 2.0}})
    store.namespace("perplexity", {**key, "model": "other"}).put({0: {"nll": 9.0}})
    assert store.rekey_model({"old-a", "old-b"}, "new") == 2
    assert store.namespace("perplexity", {**key, "model": "new"}).load() == {0: {"nll": 1.0}, 1: {"nll": 2.0}}
    assert store.namespace("perplexity", key).load() == {}
    assert store.namespace("perplexity", {**key, "model": "other"}).load() == {0: {"nll": 9.0}}
    assert store.rekey_model({"new"}, "new") == 0  # rekeying onto itself keeps everything
    assert store.namespace("perplexity", {**key, "model": "new"}).load() == {0: {"nll": 1.0}, 1: {"nll": 2.0}}
    store.namespace("perplexity", {**key, "model": "old-c"}).put({0: {"nll": 5.0}})
    with pytest.warns(UserWarning, match="differs"):
        assert store.rekey_model({"old-c"}, "new") == 0
    assert store.namespace("perplexity", {**key, "model": "new"}).load()[0] == {"nll": 1.0}


class _Tok:
    """A tokenizer stub: one id per character, optionally with a BOS in front (as Llama tokenizers add)."""

    def __init__(self, bos: bool):
        self.bos_token_id = 1 if bos else None
        self.bos = bos

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [2 + (ord(c) % 50) for c in text]
        if add_special_tokens and self.bos:
            ids = [1] + ids
        out = type("Enc", (), {})()
        out.input_ids = torch.tensor([ids]) if return_tensors == "pt" else ids
        return out


def test_bos_once_at_the_start_of_the_stream():
    from orthorank.harness.evaluation.perplexity import eval_stream, make_windows, tokenize_text

    with_bos = tokenize_text(_Tok(True), "abcdefgh" * 4)
    without = tokenize_text(_Tok(False), "abcdefgh" * 4)
    assert with_bos[0].item() == 1 and (with_bos[1:] != 1).all() and torch.equal(with_bos[1:], without)
    windows = make_windows(with_bos, 8)
    assert windows[0, 0].item() == 1 and (windows[1:, 0] != 1).all()  # later windows get no BOS of their own
    assert eval_stream(_Tok(False), "c4", "x" * 5000, 8).numel() == 256 * 8  # C4: 256 x seq-len tokens


def test_perplexity_key_changes_with_plan_data_and_dtype():
    from conftest import tiny_model
    from orthorank.harness.evaluation.perplexity import perplexity_key
    from orthorank.method.plan import Plan

    m = tiny_model()
    sig = {"num_layers": 4}
    stream = torch.arange(100)
    dense = Plan("dense", [], "tiny", sig)
    base = perplexity_key(m, dense, "wikitext2", stream, 16)
    assert perplexity_key(m, dense, "wikitext2", stream, 16) == base
    assert perplexity_key(m, Plan("prune", [1], "tiny", sig), "wikitext2", stream, 16)["plan"] != base["plan"]
    assert perplexity_key(m, dense, "wikitext2", stream + 1, 16)["stream"] != base["stream"]
    assert perplexity_key(m.to(torch.bfloat16), dense, "wikitext2", stream, 16)["dtype"] != base["dtype"]


def test_one_window_or_item_has_no_interval():
    """A bootstrap over one window is a point: it is reported as n/a, never as [v, v], and decides no claim."""
    import math

    from orthorank.harness.evaluation.stats import (accuracy_interval, paired_difference, paired_perplexity_ratio,
                                            perplexity_interval, worst_ratio)

    one = perplexity_interval([1000.0], 511)
    assert math.isnan(one.low) and one.n == 1 and not one.excludes(1.0)
    assert one.text(".4f") == f"{math.exp(1000 / 511):.4f} [n/a: 1 window]"
    assert not paired_perplexity_ratio([1000.0], [900.0], 511).excludes(1.0)
    assert paired_difference([1.0], [0.0]).text("+.2f", 100, "item") == "+100.00 [n/a: 1 item]"
    assert math.isnan(accuracy_interval([1.0]).high)
    worst, _ = worst_ratio([([1000.0, 990.0], [900.0, 905.0], 511), ([1000.0], [900.0], 511)])
    assert worst.n == 1 and not worst.known
    two = perplexity_interval([1000.0, 1100.0], 511)
    assert two.known and two.n == 2 and "n/a" not in two.text()
