"""HF-native behaviour and hard inputs: hooks, output_hidden_states/attentions, state_dict keys, accelerate
dispatch with offload, odd shapes and paddings, errors, StaticCache, and property tests against the reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tiny_model
from orthorank.errors import UserError
from orthorank.method.apply import apply_orthorank, prune_layers, restore_dense, selective
from orthorank.method.layer import NonFiniteHiddenStates
from orthorank.method.selection import SelectionConfig, tokens_to_keep

ATOL = 2e-5


def _ids(B, T, seed=1):
    return torch.randint(3, 128, (B, T), generator=torch.Generator().manual_seed(seed))


def test_hooks_fire_and_hidden_state_count():
    m = tiny_model()
    calls = {"layer": 0, "attn": 0}
    m.model.layers[1].register_forward_hook(lambda *a: calls.__setitem__("layer", calls["layer"] + 1))
    m.model.layers[1].self_attn.register_forward_hook(lambda *a: calls.__setitem__("attn", calls["attn"] + 1))
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33))
    out = m(_ids(1, 20), output_hidden_states=True)
    assert len(out.hidden_states) == 5 and calls == {"layer": 1, "attn": 1}
    assert torch.equal(out.hidden_states[2], out.hidden_states[2])  # layer 1's output is recorded
    restore_dense(m)
    assert "forward" not in m.model.layers[1].__dict__ and selective(m.model.layers[1]) is None


def test_output_attentions_report_selected_rows():
    m = tiny_model(attn="eager")
    ids = _ids(1, 20)
    dense = m(ids, output_attentions=True).attentions[1]
    apply_orthorank(m, [1], SelectionConfig(ratio=0.4))
    att = m(ids, output_attentions=True).attentions[1]
    keep = selective(m.model.layers[1]).last_keep[0]
    assert att.shape == dense.shape
    torch.testing.assert_close(att[0, :, keep], dense[0, :, keep], atol=ATOL, rtol=1e-4)
    assert not att[0, :, ~keep].any()  # bypassed rows ran no attention: zeros


def test_accelerate_dispatch_with_offload_equals_undispatched(tmp_path):
    from accelerate import dispatch_model

    ref = tiny_model()
    ids = _ids(2, 24)
    cfg = SelectionConfig(ratio=0.4)
    apply_orthorank(ref, [1, 2], cfg)
    expected = ref(ids).logits
    m = tiny_model()
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
                  "model.layers.2": "disk", "model.layers.3": "cpu", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    dispatch_model(m, device_map=device_map, offload_dir=str(tmp_path), main_device="cpu")
    assert hasattr(m.model.layers[2], "_hf_hook")
    apply_orthorank(m, [1, 2], cfg)  # installs inside accelerate's hook
    torch.testing.assert_close(m(ids).logits, expected, atol=ATOL, rtol=1e-4)
    restore_dense(m)
    apply_orthorank(ref, [], cfg)
    torch.testing.assert_close(m(ids).logits, ref(ids).logits, atol=ATOL, rtol=1e-4)


def test_plan_applied_before_dispatch_also_works(tmp_path):
    from accelerate import cpu_offload

    ref = tiny_model()
    ids = _ids(1, 24)
    cfg = SelectionConfig(ratio=0.4)
    apply_orthorank(ref, [2], cfg)
    m = tiny_model()
    apply_orthorank(m, [2], cfg)
    cpu_offload(m, execution_device=torch.device("cpu"))
    torch.testing.assert_close(m(ids).logits, ref(ids).logits, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("T", [1, 2, 3])
def test_tiny_inputs(T):
    """A single token, and inputs shorter than K = ceil(r T): the layer runs (every token or the sink alone)."""
    m = tiny_model()
    ids = _ids(1, T)
    dense = m(ids).logits
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.5))
    out = m(ids).logits
    assert torch.isfinite(out).all()
    if T == 1:
        torch.testing.assert_close(out, dense, atol=ATOL, rtol=1e-4)


def test_all_padding_row_and_one_real_token():
    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33))
    ids = _ids(3, 16)
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1] = 0  # all padding
    mask[2, :-1] = 0  # one real token, many pads
    out = m(ids, attention_mask=mask).logits
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[2, -1]).all()
    single = m(ids[2:, -1:]).logits[0, -1]
    torch.testing.assert_close(out[2, -1], single, atol=ATOL, rtol=1e-4)
    alone = m(ids[:1]).logits[0]
    torch.testing.assert_close(out[0], alone, atol=ATOL, rtol=1e-4)


def test_input_longer_than_context_is_a_clear_error():
    from orthorank.models.loading import check_context

    m = tiny_model(max_position_embeddings=32)
    with pytest.raises(UserError, match="context"):
        check_context(m, 40)
    check_context(m, 32)


def test_bad_layers_and_ratios():
    m = tiny_model()
    with pytest.raises(UserError, match="out of range"):
        apply_orthorank(m, [4], SelectionConfig())
    with pytest.raises(UserError, match="out of range"):
        prune_layers(m, [-1])
    with pytest.raises(UserError):
        SelectionConfig(ratio=0.0)
    ids = _ids(1, 10)
    dense = m(ids).logits
    apply_orthorank(m, [0, 1, 2, 3], SelectionConfig(ratio=1.0))
    torch.testing.assert_close(m(ids).logits, dense, atol=ATOL, rtol=1e-4)


def test_unsupported_attention_implementation():
    m = tiny_model()
    m.config._attn_implementation = "paged|sdpa"
    with pytest.raises(UserError, match="attention implementation"):
        apply_orthorank(m, [1], SelectionConfig())


def test_nan_hidden_states_are_a_clear_error():
    m = tiny_model()
    apply_orthorank(m, [2], SelectionConfig(ratio=0.33))
    with torch.no_grad():
        m.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteHiddenStates, match="layer 2"):
        m(_ids(1, 12))


def test_two_plans_on_two_instances_used_alternately():
    a, b = tiny_model(seed=0), tiny_model(seed=0)
    ids = _ids(2, 20)
    apply_orthorank(a, [1], SelectionConfig(ratio=0.33))
    apply_orthorank(b, [2], SelectionConfig(ratio=0.5, policy="inverse"))
    ra, rb = a(ids).logits, b(ids).logits
    for _ in range(2):
        torch.testing.assert_close(b(ids).logits, rb, atol=0, rtol=0)
        torch.testing.assert_close(a(ids).logits, ra, atol=0, rtol=0)
    assert not torch.allclose(ra, rb)


def test_static_cache_generation_equals_dynamic():
    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.5, decode="dense"))
    ids = _ids(1, 12)
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    dynamic = m.generate(ids, **kw)
    static = m.generate(ids, cache_implementation="static", **kw)
    assert torch.equal(dynamic, static)


def test_prefill_compiles_without_graph_breaks():
    """An unpadded prefill through selection layers is one graph (no host reads: chunking and the finite check
    step aside under compile) and gives the eager logits."""
    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.5))
    ids = _ids(2, 40)
    ref = m(ids, use_cache=False).logits
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: m(x, use_cache=False).logits, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(ids), ref, atol=1e-5, rtol=1e-5)


def test_dense_decode_step_with_static_cache_compiles_without_graph_breaks():
    """The dense decode policy's step on a StaticCache is one graph (what CUDA-graph capture needs)."""
    from transformers import StaticCache

    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.5, decode="dense"))
    ids = _ids(1, 12)
    cache = StaticCache(config=m.config, max_cache_len=16)
    out = m(ids, past_key_values=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    pos = torch.tensor([12])
    eager_cache = __import__("copy").deepcopy(cache)
    ref = m(nxt, past_key_values=eager_cache, cache_position=pos, position_ids=pos[None], use_cache=True).logits
    torch._dynamo.reset()
    step = torch.compile(lambda t, c, p: m(t, past_key_values=c, cache_position=p, position_ids=p[None],
                                           use_cache=True).logits, fullgraph=True, backend="eager")
    torch.testing.assert_close(step(nxt, cache, pos), ref, atol=1e-5, rtol=1e-5)


# -- properties against the naive reference -----------------------------------------------------------------------

_MODELS: dict[int, torch.nn.Module] = {}


def _model_with_kv(kv_heads: int):
    if kv_heads not in _MODELS:
        _MODELS[kv_heads] = tiny_model(num_key_value_heads=kv_heads, layers=2)
    return _MODELS[kv_heads]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kv_heads=st.sampled_from([1, 2, 4]), B=st.integers(1, 3), T=st.integers(1, 48),
       ratio=st.floats(0.05, 1.0), pads=st.lists(st.integers(0, 47), min_size=3, max_size=3),
       seed=st.integers(0, 2**16))
def test_property_selective_layer_equals_reference(kv_heads, B, T, ratio, pads, seed):
    m = _model_with_kv(kv_heads)
    restore_dense(m)
    ids = _ids(B, T, seed)
    mask = torch.ones(B, T, dtype=torch.long)
    for b in range(B):
        mask[b, : min(pads[b], T - 1)] = 0  # left padding, at least one real token per row
    apply_orthorank(m, [1], SelectionConfig(ratio=ratio))
    seen = {}

    def grab(module, args, kwargs, output):
        seen.update(h=args[0] if args else kwargs["hidden_states"], kw=kwargs, out=output)

    handle = m.model.layers[1].register_forward_hook(grab, with_kwargs=True)
    try:
        m(ids, attention_mask=mask, use_cache=False)
    finally:
        handle.remove()
    sel = selective(m.model.layers[1])
    keep = sel.last_keep
    if keep is None:
        return
    dense_out = sel.inner(seen["h"], **seen["kw"])
    ref = torch.where(keep.unsqueeze(-1), dense_out, seen["h"])
    real = mask.bool()
    torch.testing.assert_close(seen["out"][real], ref[real], atol=5e-5, rtol=1e-4)
    n = real.sum(1)
    assert torch.equal(keep.sum(1), tokens_to_keep(n, ratio)) and not keep[~real].any()
    assert all(math.ceil(ratio * int(c) - 1e-9) >= 1 for c in n)


def test_cli_offload_to_disk_equals_in_memory(tiny_hf_folder, tmp_path):
    from orthorank.models.loading import load_model

    a = load_model(str(tiny_hf_folder), device="cpu")
    b = load_model(str(tiny_hf_folder), device="cpu", max_memory="cpu=25400KB", offload_dir=str(tmp_path))
    assert "disk" in set(b.model.hf_device_map.values())
    ids = _ids(2, 16)
    for lm in (a, b):
        apply_orthorank(lm.model, [1, 2], SelectionConfig(ratio=0.4))
    torch.testing.assert_close(b.model(ids).logits, a.model(ids).logits, atol=ATOL, rtol=1e-4)
    with pytest.raises(UserError, match="offload-dir"):
        load_model(str(tiny_hf_folder), device="cpu", max_memory="cpu=25400KB")
    with pytest.raises(UserError, match="device=size"):
        load_model(str(tiny_hf_folder), device="cpu", max_memory="lots")


def test_threshold_decode_skips_tokens_but_keeps_the_cache_complete():
    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.3, decode="threshold"))
    ids = _ids(2, 24)
    skipped = []
    sel = selective(m.model.layers[2])
    orig = sel._select

    def spy(*a, **k):
        out = orig(*a, **k)
        if out is not None and out[0].shape[1] == 0:
            skipped.append(1)
        return out

    sel._select = spy
    out = m.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else out.cache
    assert all(cache.get_seq_length(i) == 24 + 11 for i in range(4))
    assert torch.isfinite(out.sequences.float()).all() and skipped  # some new tokens bypassed layer 2


def test_inplace_write_back_only_where_nothing_holds_the_input(monkeypatch):
    """Inference without recorded hidden states writes selected rows into the residual stream in place; with
    output_hidden_states, hooks or autograd it copies. Logits and every recorded state agree either way."""
    from orthorank.method import layer as layer_mod

    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.5))
    ids = _ids(2, 40)
    calls = {"inplace": 0, "copy": 0}
    real_ok = layer_mod.SequenceContext.inplace_ok

    def spy(self):
        ok = real_ok(self)
        calls["inplace" if ok else "copy"] += 1
        return ok

    monkeypatch.setattr(layer_mod.SequenceContext, "inplace_ok", spy)
    with torch.no_grad():
        fast = m(ids, use_cache=False).logits
    assert calls == {"inplace": 2, "copy": 0}
    with torch.no_grad():
        out = m(ids, use_cache=False, output_hidden_states=True)
    assert calls["copy"] == 2
    torch.testing.assert_close(out.logits, fast, atol=0, rtol=0)
    # the recorded states are those of a copying run layer by layer: state i+1 is layer i's output, unchanged
    monkeypatch.setattr(layer_mod.SequenceContext, "inplace_ok", lambda self: False)
    with torch.no_grad():
        ref = m(ids, use_cache=False, output_hidden_states=True)
    for a, b in zip(out.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    monkeypatch.setattr(layer_mod.SequenceContext, "inplace_ok", spy)
    handle = m.model.layers[0].register_forward_hook(lambda *a: None)
    with torch.no_grad():
        torch.testing.assert_close(m(ids, use_cache=False).logits, fast, atol=0, rtol=0)
    handle.remove()
    assert calls["copy"] == 4
    m(ids, use_cache=False)  # autograd on
    assert calls["copy"] == 6


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_threshold_decode_compacts_rows_exactly(monkeypatch, padded, attn):
    """Threshold decode steps where some rows keep their token and some do not run the layer on the kept rows
    only; the logits of every step equal those of running every row and discarding the bypassed rows' updates."""
    from orthorank.models.static_decode import cache_kwarg as _cache_kwarg, output_cache as _output_cache
    from orthorank.method.layer import SelectiveLayer

    m = tiny_model(attn=attn)
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.3, decode="threshold"))
    ids = _ids(6, 24)
    kwargs = {}
    if padded:
        mask = torch.ones(6, 24, dtype=torch.long)
        mask[1, :5] = 0
        mask[4, :9] = 0
        kwargs["attention_mask"] = mask
    compacted = []
    real_compacted = SelectiveLayer._compacted

    def spy(self, h, kw, call, rows):
        compacted.append(rows.numel())
        return real_compacted(self, h, kw, call, rows)

    monkeypatch.setattr(SelectiveLayer, "_compacted", spy)

    def run(compact: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(SelectiveLayer, "compact_decode_rows", compact)
        out = m(ids, use_cache=True, **kwargs)
        cache, kw = _output_cache(out), _cache_kwarg(m)
        steps, nxt, mask = [], out.logits[:, -1:].argmax(-1), kwargs.get("attention_mask")
        for _ in range(6):
            extra = {}
            if mask is not None:
                mask = torch.cat([mask, torch.ones(6, 1, dtype=torch.long)], 1)
                extra = {"attention_mask": mask, "position_ids": mask.sum(1, keepdim=True) - 1}
            out = m(nxt, use_cache=True, **{kw: cache}, **extra)
            cache = _output_cache(out)
            steps.append(out.logits[:, -1])
            nxt = out.logits[:, -1:].argmax(-1)
        return steps

    fast = run(True)
    assert compacted and all(0 < n < 6 for n in compacted)  # some steps mixed kept and bypassed rows
    n_fast = len(compacted)
    ref = run(False)
    assert len(compacted) == n_fast
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_one_sequence_threshold_step_equals_the_general_path(monkeypatch, family, attn):
    """At batch 1 a threshold decode step decides its token with one comparison and runs the dense layer or only
    its K/V; the kept/bypassed decisions, every step's logits and the cache equal the general selective path's."""
    from orthorank.models.static_decode import cache_kwarg as _cache_kwarg, output_cache as _output_cache
    from orthorank.method.layer import SelectiveLayer

    m = tiny_model(family, attn=attn)
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.3, decode="threshold"))
    ids = _ids(1, 24)
    taken = []
    real_step = SelectiveLayer._threshold_step

    def spy(self, *a, **k):
        out = real_step(self, *a, **k)
        taken.append(int(self.last_keep.sum()))
        return out

    monkeypatch.setattr(SelectiveLayer, "_threshold_step", spy)

    def run(fast: bool):
        monkeypatch.setattr(SelectiveLayer, "fast_threshold_step", fast)
        out = m(ids, use_cache=True)
        cache, kw = _output_cache(out), _cache_kwarg(m)
        steps, keeps, nxt = [], [], out.logits[:, -1:].argmax(-1)
        for _ in range(10):
            out = m(nxt, use_cache=True, **{kw: cache})
            cache = _output_cache(out)
            steps.append(out.logits[:, -1])
            keeps.append([int(selective(m.model.layers[i]).last_keep.sum()) for i in (1, 2)])
            nxt = out.logits[:, -1:].argmax(-1)
        return steps, keeps, cache

    fast, fast_keeps, fast_cache = run(True)
    assert len(taken) == 20 and 0 < sum(taken) < 20  # every step took the fast path; some kept, some bypassed
    ref, ref_keeps, ref_cache = run(False)
    assert len(taken) == 20 and fast_keeps == ref_keeps
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for i in range(4):
        assert fast_cache.get_seq_length(i) == ref_cache.get_seq_length(i) == 34
