"""Exact blocked sliding-window attention (models/sliding_attention.py) equals transformers' masked SDPA on every
family of the zoo with sliding-window layers: float32 and bfloat16, padded and unpadded prompts, prefill and cached
greedy generation; registered by name it loads like any attention implementation."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from orthorank.models import sliding_attention as sa

# family -> overrides: small windows so that 60-token prompts cross them several times
SLIDING = {"mistral": {"sliding_window": 8}, "mixtral": {"sliding_window": 8}, "qwen2.5": {"sliding_window": 8},
           "gemma3": {"sliding_window": 8}}  # Gemma 2 runs eager (soft-capping): see the last test
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(sa, "BLOCK", 8)  # blocks of 8 queries, so a 60-token prompt runs 8 blocked calls


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 120, (1, n), generator=torch.Generator().manual_seed(seed))


def _model(family: str, dtype: torch.dtype):
    return tiny_model(family, **SLIDING[family]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", sorted(SLIDING))
def test_blocked_sliding_prefill_equals_masked_sdpa(family, dtype):
    m = _model(family, dtype)
    ids = _ids(60)
    ref = m(ids).logits.float()
    calls = []
    original = sa.blocked_sliding_attention

    def counted(*args, **kwargs):
        calls.append(args[1].shape[2])
        return original(*args, **kwargs)

    from transformers import AttentionInterface

    undo = sa.use_blocked_sliding(m)
    AttentionInterface.register(sa.IMPLEMENTATION, counted)  # after the switch, which registers the kernel itself
    try:
        assert sa.kernel_name(m) == "blocked"
        out = m(ids).logits.float()
        undo()
    finally:
        sa.register()
    assert calls and max(calls) == 60  # the sliding layers went through the kernel
    assert sa.kernel_name(m) == "sdpa"
    assert torch.allclose(out, ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("family", ["gemma3", "mistral", "qwen2.5"])
def test_left_padded_batches_equal_the_masked_reference(family):
    m = _model(family, torch.float32)
    long, short = _ids(60, 1)[0], _ids(37, 2)[0]
    batch = torch.zeros(2, 60, dtype=torch.long)
    batch[0], batch[1, 23:] = long, short
    mask = (batch != 0).long()
    ref = m(batch, attention_mask=mask).logits
    undo = sa.use_blocked_sliding(m)
    out = m(batch, attention_mask=mask).logits
    undo()
    assert torch.allclose(out[0], ref[0], atol=1e-5)
    assert torch.allclose(out[1, 23:], ref[1, 23:], atol=1e-5)  # the real tokens


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_cached_generation_equals_sdpa(family):
    m = _model(family, torch.float32)
    ids = _ids(50, 3)
    ref = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    undo = sa.use_blocked_sliding(m)
    out = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    undo()
    assert torch.equal(out, ref)


def test_picked_by_name_and_left_alone_without_sliding_layers():
    sa.register()
    m = tiny_model("gemma3", attn=sa.IMPLEMENTATION, sliding_window=8)
    ref = tiny_model("gemma3", sliding_window=8)
    ids = _ids(60, 4)
    assert torch.allclose(m(ids).logits, ref(ids).logits, atol=1e-5)
    llama = tiny_model("llama")
    undo = sa.use_blocked_sliding(llama)
    assert sa.kernel_name(llama) == "none"
    undo()
    gemma2 = tiny_model("gemma2", attn="eager", sliding_window=8)  # not an SDPA model: left to its own kernel
    undo = sa.use_blocked_sliding(gemma2)
    assert sa.kernel_name(gemma2) == "eager"
    undo()


def test_the_kernel_runs_one_call_per_block_on_the_band_it_needs(monkeypatch):
    from types import SimpleNamespace

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    seen = []

    def spy(module, q, k, v, mask, **kw):
        seen.append((q.shape[2], k.shape[2]))
        return sdpa(module, q, k, v, mask, **kw)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 60, 16, generator=g) for h in (4, 2, 2))
    i = torch.arange(60)
    band = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 8))[None, None]
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, sliding_window=8, training=False)
    ref, _ = sdpa(module, q, k, v, band, scaling=0.25)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", spy)
    out, _ = sa.blocked_sliding_attention(module, q, k, v, band, scaling=0.25)
    assert torch.allclose(out, ref, atol=1e-6)
    assert seen[0] == (8, 8) and seen[-1] == (4, 12) and len(seen) == 8  # blocks of 8 queries, at most 16 keys


def _plan_under_both_kernels(m, method: str, layers: list[int], ids: torch.Tensor, **fields):
    """(dense logits, the plan's under the model's SDPA, the plan's under the blocked kernel)."""
    import dataclasses

    from conftest import model_signature
    from orthorank.method.apply import apply_plan, restore_dense
    from orthorank.method.cost import Arch
    from orthorank.method.plan import Plan

    plan = Plan(method, layers, "tiny", model_signature(m),
                arch=dataclasses.asdict(Arch.from_config(m.config, m.config.num_hidden_layers)), **fields)
    dense = m(ids).logits
    apply_plan(m, plan)
    ref = m(ids).logits
    undo = sa.use_blocked_sliding(m)
    assert sa.kernel_name(m) == "blocked"
    out = m(ids).logits
    undo()
    restore_dense(m)
    return dense, ref, out


def test_a_local_plan_on_blocked_sliding_layers_equals_it_on_the_models_kernel():
    """Gemma 3's long-prompt rows (issue 55) run local attention in its full-attention layers beside the blocked
    kernel in its sliding ones: the two compose, and the result equals the local plan under the model's own kernel."""
    from orthorank.method.local_attention import LocalAttention

    m = _model("gemma3", torch.float32)
    full = [i for i, t in enumerate(m.config.layer_types) if t == "full_attention"]
    assert full and len(full) < m.config.num_hidden_layers
    dense, ref, out = _plan_under_both_kernels(m, "local", full, _ids(60, 5),
                                               attention=LocalAttention(window=8, block=8, tail=6))
    assert torch.allclose(out, ref, atol=1e-5)
    assert not torch.allclose(ref, dense, atol=1e-3)  # the local layers changed the result


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_a_selective_plan_on_blocked_sliding_layers_equals_it_on_the_models_kernel(family):
    """The blocked kernel is the CPU default (--sliding-kernel auto): OrthoRank's selective layers in sliding layers
    run under it (fit-thresholds on Gemma 3 once stopped on 'orthorank_sliding'), and give what they give under SDPA."""
    from orthorank.method.selection import SelectionConfig

    m = _model(family, torch.float32)
    layers = list(range(1, m.config.num_hidden_layers))
    dense, ref, out = _plan_under_both_kernels(m, "orthorank", layers, _ids(60, 7),
                                               selection=SelectionConfig(ratio=0.4))
    assert torch.allclose(out, ref, atol=1e-5)
    assert not torch.allclose(ref, dense, atol=1e-3)  # the selective layers changed the result
