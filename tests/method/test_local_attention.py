"""Local prefill attention with a global tail (method/local_attention.py): the blocked kernel equals the masked
reference, a window reaching every key equals dense, padded batches equal single prompts, cached generation equals
the uncached reference, and the cost model counts the keys each query reads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import model_signature, prompt_ids, tiny_model
from orthorank.errors import UserError
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.cost import Arch, removal_sparsity
from orthorank.method.local_attention import LocalAttention, keys_read, local_allowed, local_attention
from orthorank.method.local_kernel import KERNELS
from orthorank.method.plan import Plan
from orthorank.method.schedules import schedule_plan

ATOL = 1e-5


def _plan(m, layers, cfg):
    return Plan("local", layers, "tiny", model_signature(m), attention=cfg,
                arch=dataclasses.asdict(Arch.from_config(m.config, m.config.num_hidden_layers)))


def _masked_forward(m, ids, layers, cfg, prompt_len=None):
    """The reference: the dense model with its local layers' 4-D mask replaced by local_allowed (one unpadded
    prompt; the other layers keep the model's own masks)."""
    allowed = local_allowed(torch.ones_like(ids, dtype=torch.bool), cfg, prompt_len)
    hooks = []
    for i in layers:
        def pre(module, args, kwargs):
            kwargs["attention_mask"] = allowed
            return args, kwargs
        hooks.append(m.model.layers[i].register_forward_pre_hook(pre, with_kwargs=True))
    try:
        return m(ids, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("n,cfg", [
    (200, LocalAttention(window=32, sinks=4, tail=16, block=32)),
    (200, LocalAttention(window=40, sinks=2, tail=0, block=24)),
    (37, LocalAttention(window=8, sinks=0, tail=5, block=8)),
    (64, LocalAttention(window=256, sinks=4, tail=64, block=256)),
    (200, LocalAttention(window=16, sinks=4, tail=8, block=16, head=40)),  # a head past the first block
    (200, LocalAttention(window=16, sinks=4, tail=70, block=16, head=3)),  # a head inside the sinks
])
@pytest.mark.parametrize("kernel", ["auto", *KERNELS])
@pytest.mark.parametrize("heads", [(4, 2), (3, 1), (2, 2)])
def test_the_blocked_kernels_equal_the_masked_reference(n, cfg, kernel, heads):
    g = torch.Generator().manual_seed(0)
    # the attention module's layout ([B, N, heads, d] seen as [B, heads, N, d]) and a contiguous one
    q = torch.randn(2, n, heads[0], 16, generator=g).transpose(1, 2)
    k, v = (torch.randn(2, heads[1], n, 16, generator=g) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=local_allowed(torch.ones(2, n, dtype=torch.bool), cfg),
                                         scale=0.25, enable_gqa=heads[0] != heads[1])
    assert torch.allclose(local_attention(q, k, v, scale=0.25, cfg=cfg, kernel=kernel), ref, atol=ATOL)


BF16_ATOL = 3e-2  # tests/method/test_sliding_attention.py's bfloat16 tolerance


@pytest.mark.parametrize("n,cfg", [(1100, LocalAttention()), (700, LocalAttention(head=192)),
                                   (300, LocalAttention(window=32, block=32, tail=100))])
def test_the_split_kernel_rounds_as_the_first_kernel_in_bfloat16(n, cfg):
    """Issue 57: the split kernel merges two partial softmaxes, so in bfloat16 it rounds differently from the
    placeholder kernel the long-prompt preset was measured with; it must stay within the bfloat16 tolerance."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, n, 9, 64, generator=g).bfloat16().transpose(1, 2)
    k, v = (torch.randn(1, n, 3, 64, generator=g).bfloat16().transpose(1, 2) for _ in range(2))
    split = local_attention(q, k, v, scale=0.125, cfg=cfg, kernel="split")
    first = local_attention(q, k, v, scale=0.125, cfg=cfg, kernel="placeholder")
    assert split.dtype == torch.bfloat16 and (split.float() - first.float()).abs().max() <= BF16_ATOL


def test_the_pattern_reads_sinks_a_block_aligned_window_and_a_global_tail():
    cfg = LocalAttention(window=8, sinks=2, tail=4, block=4)
    allowed = local_allowed(torch.ones(1, 30, dtype=torch.bool), cfg)[0, 0]
    assert allowed[17].nonzero().ravel().tolist() == [0, 1, *range(8, 18)]  # block 16-19 reads from 16 - 8
    assert allowed[29].sum() == 30 and allowed[26].sum() == 27  # the last 4 queries: every key
    assert allowed[3].sum() == 4  # early queries: causal
    assert np.array_equal(keys_read(30, cfg), allowed.sum(-1).numpy())


def test_the_head_is_global_keys_and_changes_nothing_else():
    cfg = LocalAttention(window=8, sinks=2, tail=4, block=4, head=6)
    allowed = local_allowed(torch.ones(1, 30, dtype=torch.bool), cfg)[0, 0]
    assert allowed[17].nonzero().ravel().tolist() == [0, 1, 2, 3, 4, 5, *range(8, 18)]  # head 0-5, window 8-17
    assert allowed[25].nonzero().ravel().tolist() == [*range(6), *range(16, 26)]  # block 24-27 reads from 16
    assert np.array_equal(keys_read(30, cfg), allowed.sum(-1).numpy())
    assert keys_read(30, cfg).sum() > keys_read(30, dataclasses.replace(cfg, head=0)).sum()
    # a plan without a head keeps its file and its result-store key; one with a head round-trips
    assert "head" not in LocalAttention().to_dict()
    assert LocalAttention.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_a_window_over_every_key_equals_dense(family):
    m = tiny_model(family)
    ids = prompt_ids()
    dense = m(ids).logits
    types = getattr(m.config, "layer_types", None)
    layers = [i for i in range(4) if types is None or types[i] == "full_attention"]
    apply_plan(m, _plan(m, layers, LocalAttention(window=64, tail=0, block=16)))
    assert torch.allclose(m(ids).logits, dense, atol=ATOL)
    restore_dense(m)
    assert m.model.layers[layers[0]].self_attn.config is m.config


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_local_layers_equal_the_masked_reference_and_change_the_output(family):
    m = tiny_model(family)
    ids = prompt_ids(length=60)
    cfg = LocalAttention(window=8, sinks=2, tail=6, block=8)
    types = getattr(m.config, "layer_types", None)
    layers = [i for i in (1, 2, 3) if types is None or types[i] == "full_attention"]
    dense = m(ids).logits
    ref = _masked_forward(m, ids, layers, cfg)
    apply_plan(m, _plan(m, layers, cfg))
    out = m(ids).logits
    restore_dense(m)
    assert torch.allclose(out, ref, atol=1e-4)
    assert not torch.allclose(out, dense, atol=1e-3)


@pytest.mark.parametrize("head", [0, 12])  # 12: an instruction head past the sinks (issue 55's global spans)
def test_left_padded_batches_equal_single_prompts(head):
    m = tiny_model("llama")
    cfg = LocalAttention(window=8, sinks=2, tail=6, block=8, head=head)
    apply_plan(m, _plan(m, [1, 2, 3], cfg))
    long, short = prompt_ids(length=50, seed=1)[0], prompt_ids(length=33, seed=2)[0]
    batch = torch.zeros(2, 50, dtype=torch.long)
    batch[0], batch[1, 17:] = long, short
    valid = batch != 0
    out = m(batch, attention_mask=valid.long(), position_ids=(valid.long().cumsum(-1) - 1).clamp(min=0)).logits
    for row, ids in ((0, long), (1, short)):
        single = m(ids[None]).logits[0]
        assert torch.allclose(out[row, -len(ids):], single, atol=1e-4)
    if head:
        ref = _masked_forward(m, long[None], [1, 2, 3], cfg)
        restore_dense(m)
        assert torch.allclose(out[0], ref[0], atol=1e-4)


def test_cached_generation_equals_the_uncached_reference():
    m = tiny_model("llama")
    cfg = LocalAttention(window=8, sinks=2, tail=6, block=8)
    ids = prompt_ids(length=45)
    apply_plan(m, _plan(m, [1, 2, 3], cfg))
    out = m.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    restore_dense(m)
    seq = ids
    for _ in range(6):  # greedy, each step an uncached forward whose tail reaches to the prompt's end
        logits = _masked_forward(m, seq, [1, 2, 3], cfg, prompt_len=torch.tensor([ids.shape[1]]))
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


def test_the_cost_model_counts_the_keys_read():
    m = tiny_model("llama", layers=6)
    arch = Arch.from_config(m.config, 6)
    cfg = LocalAttention(window=256, sinks=4, tail=64, block=256)
    plan = _plan(m, [3, 4, 5], cfg)
    assert plan.compute_sparsity(arch, 512) < plan.compute_sparsity(arch, 4096) < plan.compute_sparsity(arch, 8192)
    assert plan.compute_sparsity(arch, 256) == pytest.approx(0.0)  # every key is within reach
    assert Plan.from_dict(plan.to_dict()).attention == cfg
    assert Plan.from_dict(plan.to_dict()).content_hash() == plan.content_hash()


def test_the_local_schedule_fills_full_attention_layers_from_the_top_for_the_target():
    m = tiny_model("gemma3", layers=6)
    arch = Arch.from_config(m.config, 6)
    types = m.config.layer_types
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    target = removal_sparsity(arch, 4096, 1) / 4
    plan = schedule_plan("local", "tiny", model_signature(m), arch, target, 4096, layer_types=types)
    assert plan.method == "local" and set(plan.layers) <= set(full) and plan.layers == full[-len(plan.layers):]
    assert plan.compute_sparsity(arch, 4096) >= target
    with pytest.raises(UserError, match="cannot skip"):
        schedule_plan("local", "tiny", model_signature(m), arch, 0.9, 4096, layer_types=types)


def test_a_local_preset_past_its_reach_uses_every_full_attention_layer_and_a_short_prompt_runs_dense():
    from orthorank.method.presets import Preset, preset_plan

    m = tiny_model("gemma3", layers=6)
    arch = Arch.from_config(m.config, 6)
    types = m.config.layer_types
    full = [i for i, t in enumerate(types) if t == "full_attention" and i >= 1]
    most = schedule_plan("local", "tiny", model_signature(m), arch, 0.9, 4096, layer_types=types, at_most_reach=True)
    assert most.layers == full and most.provenance["at_most_reach"]
    preset = Preset("long-prompt", "local", 0.4)
    plan = preset_plan(preset, "tiny", model_signature(m), arch, 4096, layer_types=types)
    assert plan.method == "local" and plan.layers == full and plan.provenance["preset"] == "long-prompt"
    short = preset_plan(preset, "tiny", model_signature(m), arch, 200, layer_types=types)  # within the 256-token window
    assert short.method == "dense" and not short.layers
    measured_from = dataclasses.replace(preset, min_length=4096)  # unmeasured below: dense
    assert preset_plan(measured_from, "tiny", model_signature(m), arch, 4095, layer_types=types).method == "dense"
    assert preset_plan(measured_from, "tiny", model_signature(m), arch, 4096, layer_types=types).layers == full


def test_bad_local_settings_are_one_line_errors():
    with pytest.raises(UserError, match="window"):
        LocalAttention(window=0)
    with pytest.raises(UserError, match="unknown local attention fields"):
        LocalAttention.from_dict({"windw": 3})
    m = tiny_model("gemma3")
    sliding = m.config.layer_types.index("sliding_attention")
    with pytest.raises(UserError, match="sliding window"):
        apply_plan(m, _plan(m, [sliding], LocalAttention()))
    with pytest.raises(UserError, match="local plans"):
        Plan("orthorank", [1], "tiny", model_signature(m), attention=LocalAttention())


def test_the_frontier_adds_local_attention_at_its_reach_once():
    from types import SimpleNamespace

    from orthorank.harness.api.frontier_rows import level_rows as _rows
    from orthorank.harness.api.options import FrontierOptions

    m = tiny_model("gemma3", layers=6)
    full = [i for i, t in enumerate(m.config.layer_types) if t == "full_attention" and i >= 1]
    lm = SimpleNamespace(config=m.config, num_layers=6, name="tiny", signature=lambda: model_signature(m))
    logged = []
    opts = FrontierOptions(model="tiny", methods="dense,local", out="unused")
    rows = _rows(opts, lm, 4096, [0.3, 0.6, 0.9], logged.append)
    local = [r for r in rows if r.method == "local"]
    # every level past the reach would be the same plan: one row at the reach, the others left out and logged
    assert [r.plan.layers for r in local][-1] == full and len({tuple(r.plan.layers) for r in local}) == len(local)
    assert any("past its reach" in line for line in logged)
