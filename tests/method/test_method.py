"""Exactness of the OrthoRank layer against the dense layer and a naive reference."""

from __future__ import annotations

import pytest
import torch

from orthorank.method.apply import selective

from conftest import ids_for, left_pad, tiny_model
from orthorank.errors import UserError
from orthorank.method import SelectionConfig, apply_orthorank, prune_layers, restore_dense
from orthorank.method.selection import keep_to_indices, tokens_to_keep, topk_keep_mask

ATOL = 1e-5




@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_ratio_one_equals_dense(family, attn):
    m = tiny_model(family, attn=attn)
    ids = ids_for()
    dense = m(ids).logits
    apply_orthorank(m, [0, 1, 2, 3], SelectionConfig(ratio=1.0))
    assert all(selective(layer) is not None for layer in m.model.layers)
    out = m(ids).logits
    assert torch.allclose(out, dense, atol=ATOL), (out - dense).abs().max()
    assert bool(selective(m.model.layers[1]).last_keep.all())  # the selective path ran and kept every token


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("ratio", [0.1, 0.33, 0.5])
def test_selective_layer_matches_naive_reference(family, ratio):
    """Reference: run the full dense layer, then keep only the selected rows' updates."""
    m = tiny_model(family)
    ids = ids_for(length=30)
    apply_orthorank(m, [2], SelectionConfig(ratio=ratio))
    wrapper = m.model.layers[2]
    seen = {}

    def hook(module, args, kwargs, output):
        seen["h"], seen["kwargs"], seen["out"] = args[0], kwargs, output

    wrapper.register_forward_hook(hook, with_kwargs=True)
    m(ids, use_cache=False)
    keep = selective(wrapper).last_keep
    dense_out = selective(wrapper).inner(seen["h"], **seen["kwargs"])
    reference = torch.where(keep.unsqueeze(-1), dense_out, seen["h"])
    assert torch.allclose(seen["out"], reference, atol=ATOL)
    assert (keep.sum(1) == tokens_to_keep(torch.tensor([30, 30]), ratio)).all()
    assert not bool(keep[:, 0].any())  # the sink is not updated unless every token is


def test_selection_follows_orthogonality():
    x = torch.tensor([[[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.5, 0.5], [0.1, -0.9]]])
    from orthorank.method.orthogonality import sink_scores

    scores = sink_scores(x, x[:, 0])
    keep = topk_keep_mask(scores, torch.ones(1, 5, dtype=torch.bool), torch.tensor([0]), torch.tensor([2]))
    assert keep.tolist() == [[False, False, True, False, True]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_decode_sink_dot_equals_the_row_loop(dtype):
    """A [B, 1, D] decode step takes one product for all rows; it gives each row's float32 dot product, as the
    one-row path does (to float32 rounding)."""
    from orthorank.method.orthogonality import dot_float32

    g = torch.Generator().manual_seed(0)
    x, sink = torch.randn(32, 1, 96, generator=g).to(dtype), torch.randn(32, 96, generator=g).to(dtype)
    batched = dot_float32(x, sink)
    rows = torch.cat([dot_float32(x[b:b + 1], sink[b:b + 1]) for b in range(32)])
    assert batched.shape == (32, 1) and batched.dtype == torch.float32
    assert torch.allclose(batched, rows, rtol=1e-5, atol=1e-5)


def test_sink_only_when_all_and_pads_never():
    keys = torch.tensor([[0.0, 5.0, 1.0, 2.0, 3.0]])  # sink (pos 1 after a pad) has the "best" raw key
    valid = torch.tensor([[False, True, True, True, True]])
    sink = torch.tensor([1])
    for k in range(0, 4):
        keep = topk_keep_mask(-keys, valid, sink, torch.tensor([k]))
        assert not bool(keep[0, 0]) and not bool(keep[0, 1]) and int(keep.sum()) == k
    keep = topk_keep_mask(keys, valid, sink, torch.tensor([4]))
    assert keep.tolist() == [[False, True, True, True, True]]
    keep = topk_keep_mask(keys, valid, sink, torch.tensor([9]))  # more than there are: pads still never
    assert keep.tolist() == [[False, True, True, True, True]]


def test_keep_to_indices_keeps_original_order():
    keep = torch.tensor([[False, True, False, True], [True, False, False, False]])
    idx, real = keep_to_indices(keep)
    assert idx[0].tolist() == [1, 3] and real[0].tolist() == [True, True]
    assert idx[1, 0].item() == 0 and real[1].tolist() == [True, False]


def test_ceil_rounding():
    assert tokens_to_keep(torch.tensor([100, 1, 3, 2048]), 0.33).tolist() == [33, 1, 1, 676]




@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_left_padded_batch_equals_single_rows(family):
    m = tiny_model(family)
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33))
    rows = [ids_for(1, 20, seed=3)[0].tolist(), ids_for(1, 13, seed=4)[0].tolist(), ids_for(1, 7, seed=5)[0].tolist()]
    ids, mask = left_pad(rows)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    batched = m(ids, attention_mask=mask, position_ids=pos).logits
    for i, r in enumerate(rows):
        single = m(torch.tensor([r])).logits[0]
        assert torch.allclose(batched[i, -len(r):], single, atol=ATOL), (i, (batched[i, -len(r):] - single).abs().max())


def test_left_padded_generation_equals_single_rows():
    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33))
    rows = [ids_for(1, 16, seed=6)[0].tolist(), ids_for(1, 9, seed=7)[0].tolist()]
    ids, mask = left_pad(rows)
    batched = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for i, r in enumerate(rows):
        single = m.generate(torch.tensor([r]), max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert batched[i, -6:].tolist() == single[0, -6:].tolist()


@pytest.mark.parametrize("ratio", [1.0])
def test_generation_with_cache_equals_without(ratio):
    m = tiny_model()
    ids = ids_for(2, 12)
    dense_cached = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=ratio))
    cached = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    uncached = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, dense_cached)


def test_cached_decode_step_matches_prefix_consistent_reference():
    """With decode='dense', each cached decoding step equals a full forward in which the prompt keeps its prefill
    selection and every generated token is updated: the cache changes nothing but the cost."""
    m = tiny_model()
    ids = ids_for(1, 20)
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33))
    out = m(ids, use_cache=True)
    keep_prompt = {i: selective(m.model.layers[i]).last_keep.clone() for i in (1, 2)}
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    from orthorank.models.static_decode import cache_kwarg as _cache_kwarg, output_cache as _output_cache

    step = m(nxt, **{_cache_kwarg(m): _output_cache(out)}, use_cache=True).logits[:, -1]
    # Reference: dense model, but in layers 1 and 2 the prompt tokens not kept at prefill bypass the layer.
    restore_dense(m)
    full = torch.cat([ids, nxt], dim=1)
    hooks = []
    for i in (1, 2):
        keep = torch.cat([keep_prompt[i], torch.ones(1, 1, dtype=torch.bool)], dim=1)

        def fwd(module, args, kwargs, output, keep=keep):
            return torch.where(keep.unsqueeze(-1), output, args[0])

        hooks.append(m.model.layers[i].register_forward_hook(fwd, with_kwargs=True))
    ref = m(full, use_cache=False).logits[:, -1]
    for h in hooks:
        h.remove()
    assert torch.allclose(step, ref, atol=ATOL)


def test_restore_and_prune():
    m = tiny_model()
    ids = ids_for()
    dense = m(ids).logits
    apply_orthorank(m, [1], SelectionConfig())
    restore_dense(m)
    assert torch.equal(m(ids).logits, dense)
    prune_layers(m, [1, 2])
    assert len(m.model.layers) == 2 and m.config.num_hidden_layers == 2
    pruned = m(ids).logits
    assert not torch.allclose(pruned, dense)
    g = m.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    g2 = m.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(g, g2)
    restore_dense(m)
    assert len(m.model.layers) == 4 and [l.self_attn.layer_idx for l in m.model.layers] == [0, 1, 2, 3]
    assert torch.equal(m(ids).logits, dense)


@pytest.mark.parametrize("cfg", [
    SelectionConfig(policy="random"), SelectionConfig(policy="inverse"), SelectionConfig(source="raw"),
    SelectionConfig(criterion="cos"), SelectionConfig(bypass_kv=False), SelectionConfig(decode="threshold"),
])
def test_variants_run_and_are_deterministic(cfg):
    m = tiny_model()
    ids = ids_for()
    dense = m(ids).logits
    apply_orthorank(m, [1, 2], cfg)
    a, b = m(ids).logits, m(ids).logits
    assert torch.equal(a, b) and torch.isfinite(a).all()
    assert not torch.allclose(a, dense)
    g = m.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert g.shape == (2, 28)


def test_no_bypass_kv_drops_bypassed_keys():
    """With bypass_kv=False a selected query sees only selected keys: equal to a dense layer run on the
    selected tokens alone (at their true positions)."""
    m = tiny_model()
    ids = ids_for(1, 20)
    apply_orthorank(m, [0], SelectionConfig(bypass_kv=False))
    out = m.model.layers[0]
    seen = {}
    out.register_forward_hook(lambda mod, a, k, o: seen.update(h=a[0], kw=k, o=o), with_kwargs=True)
    m(ids, use_cache=False)
    keep = selective(out).last_keep[0]
    idx = keep.nonzero().squeeze(-1)
    cos, sin = seen["kw"]["position_embeddings"]
    kw = dict(seen["kw"], position_embeddings=(cos[:, idx], sin[:, idx]), attention_mask=None)
    sub = selective(out).inner(seen["h"][:, idx], **kw)
    assert torch.allclose(seen["o"][0, idx], sub[0], atol=ATOL)


def test_bad_ratio_and_options():
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(UserError):
            SelectionConfig(ratio=bad)
    with pytest.raises(UserError):
        SelectionConfig(policy="sideways")
    with pytest.raises(UserError):
        apply_orthorank(tiny_model(), [7], SelectionConfig())


def test_unsupported_family():
    from transformers import GPT2Config, GPT2LMHeadModel

    m = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UserError, match="supported families: gemma, gemma2"):
        apply_orthorank(m, [0], SelectionConfig())


def _right_pad(rows, pad_id=0):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


@pytest.mark.parametrize("order", ["orthogonal", "random"])
def test_right_padded_batch_equals_single_rows(order):
    """Scoring batches (zero-shot) right-pad with a mask: pads never count towards K or get selected."""
    m = tiny_model()
    apply_orthorank(m, [1, 2], SelectionConfig(ratio=0.33, policy=order))
    rows = [ids_for(1, 21, seed=8)[0].tolist(), ids_for(1, 9, seed=9)[0].tolist(), ids_for(1, 2, seed=10)[0].tolist()]
    ids, mask = _right_pad(rows)
    batched = m(ids, attention_mask=mask).logits
    keeps = selective(m.model.layers[1]).last_keep
    for i, r in enumerate(rows):
        single = m(torch.tensor([r])).logits[0]
        assert torch.allclose(batched[i, : len(r)], single, atol=ATOL), (i, (batched[i, : len(r)] - single).abs().max())
        assert torch.equal(keeps[i, : len(r)], selective(m.model.layers[1]).last_keep[0]) and not keeps[i, len(r):].any()


def test_random_order_is_per_sequence_and_batch_independent():
    """A fresh pattern per sequence, the same whatever the batch size or the row's place in the batch."""
    m = tiny_model()
    apply_orthorank(m, [1], SelectionConfig(ratio=0.33, policy="random", seed=5))
    a, b = ids_for(1, 24, seed=11), ids_for(1, 24, seed=12)
    keep = lambda ids: (m(ids, use_cache=False), selective(m.model.layers[1]).last_keep)[1]  # noqa: E731
    ka, kb = keep(a)[0], keep(b)[0]
    both = keep(torch.cat([b, a]))
    assert torch.equal(both[1], ka) and torch.equal(both[0], kb)
    assert not torch.equal(ka, kb)  # two sequences, two patterns (24 tokens: a collision is vanishingly rare)
    logits_1 = torch.cat([m(a).logits, m(b).logits])
    logits_2 = m(torch.cat([a, b])).logits
    assert torch.allclose(logits_1, logits_2, atol=ATOL)
    apply_orthorank(m, [1], SelectionConfig(ratio=0.33, policy="random", seed=6))
    assert not torch.equal(keep(a)[0], ka)  # another seed, another pattern


@pytest.mark.parametrize("visible", [False, True])
def test_no_bypass_kv_sink_variant(visible):
    """The no-KV ablation with the sink's keys/values hidden or kept visible: equal to a dense layer run on the
    selected tokens (plus the sink when it stays visible), at their true positions."""
    m = tiny_model()
    ids = ids_for(1, 20)
    apply_orthorank(m, [0], SelectionConfig(bypass_kv=False, sink_kv_visible=visible))
    out = m.model.layers[0]
    seen = {}
    out.register_forward_hook(lambda mod, a, k, o: seen.update(h=a[0], kw=k, o=o), with_kwargs=True)
    m(ids, use_cache=False)
    keep = selective(out).last_keep[0].clone()
    assert not keep[0]
    if visible:
        keep[0] = True
    idx = keep.nonzero().squeeze(-1)
    cos, sin = seen["kw"]["position_embeddings"]
    kw = dict(seen["kw"], position_embeddings=(cos[:, idx], sin[:, idx]), attention_mask=None)
    sub = selective(out).inner(seen["h"][:, idx], **kw)
    sel = selective(out).last_keep[0].nonzero().squeeze(-1)
    pos_in_sub = torch.searchsorted(idx, sel)
    assert torch.allclose(seen["o"][0, sel], sub[0, pos_in_sub], atol=ATOL)
