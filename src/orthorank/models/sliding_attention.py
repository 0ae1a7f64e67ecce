"""Exact blocked sliding-window attention: a sliding layer's prefill reads only the keys its window can reach.

transformers' SDPA path runs a sliding-window layer (Gemma 2/3, Mistral, Qwen 2 with layer types, Phi-3-small...) as
masked attention over every key: at 8k tokens a Gemma 3 270M sliding layer took 1.82 s against 2.99 s for a
full-attention layer on this CPU, though each query reads at most 512 keys. This splits a prefill's queries into
blocks and gives each block only the keys from `window` before its first query to its last, with the model's own
mask sliced to them. A key outside that range is masked for every query of the block, and a masked key adds exactly
0 to the softmax, so the output equals the masked call's up to the kernel's rounding. It changes the dense model's
arithmetic order, not its maths: a kernel, not a method.

    from orthorank.models.sliding_attention import use_blocked_sliding
    use_blocked_sliding(model)                    # every sliding layer of a loaded model; returns the undo
    AutoModelForCausalLM.from_pretrained(path, attn_implementation="orthorank_sliding")   # or pick it by name

Decoding steps, prompts continued from a cache, static-cache slots, full-attention layers and maskless calls go to
transformers' own SDPA function, which also runs every block, so padding, grouped heads and soft-capping checks stay
its own.
"""

from __future__ import annotations

import copy

import torch

IMPLEMENTATION = "orthorank_sliding"
BLOCK = 256  # queries per call: a block reads at most window + BLOCK keys
_CONFIG = "_orthorank_sliding"  # on a module switched by use_blocked_sliding: the model's implementation


def _window(module, kwargs) -> int | None:
    w = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    return int(w) if w else None


def blocked_sliding_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An attention function (transformers' AttentionInterface signature): query [B, H, q, d], key/value
    [B, Hkv, k, d] -> ([B, q, H, d], None)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    window = _window(module, kwargs)
    n = query.shape[2]
    if (window is None or attention_mask is None or n != key.shape[2] or n <= window + BLOCK
            or attention_mask.dim() != 4 or attention_mask.shape[-2] != n):
        return sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    outs = []
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK)
        lo = max(0, a - window)  # a superset of the band: keys more than `window` back are masked for every query
        o, _ = sdpa(module, query[:, :, a:b], key[:, :, lo:b], value[:, :, lo:b],
                    attention_mask[:, :, a:b, lo:b], scaling=scaling, dropout=dropout, **kwargs)
        outs.append(o)
    return torch.cat(outs, 1), None


def register() -> None:
    """Make `attn_implementation="orthorank_sliding"` a name transformers knows: this kernel for attention, SDPA's
    masks (the band and the padding, materialised as SDPA gets them)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, blocked_sliding_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def sliding_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention modules of a model's sliding-window layers (those with a window set)."""
    out = []
    for m in model.modules():
        if getattr(m, "sliding_window", None) and hasattr(m, "config") and hasattr(m, "layer_idx"):
            out.append(m)
    if not out and getattr(getattr(model, "config", None), "sliding_window", None) and not getattr(
            model.config, "layer_types", None):  # Mistral-style: one window for every layer
        out = [m for m in model.modules() if hasattr(m, "config") and hasattr(m, "layer_idx")
               and hasattr(m, "q_proj")]
    return out


def use_blocked_sliding(model: torch.nn.Module):
    """Switch every sliding-window layer of a loaded model (sdpa attention) to the blocked kernel; returns the undo.
    Each switched module gets a shallow copy of the config naming this kernel, so the model's masks, its other
    layers and its fingerprint stay as they were. A model without sliding layers is left unchanged."""
    register()
    undo = []
    for attn in sliding_modules(model):
        original = attn.config._attn_implementation or "sdpa"
        if original != "sdpa" or hasattr(attn, _CONFIG):
            continue
        shared = attn.config
        own = copy.copy(shared)
        own.__dict__["_attn_implementation_internal"] = IMPLEMENTATION
        attn.config = own
        setattr(attn, _CONFIG, original)
        undo.append((attn, shared))

    def restore() -> None:
        for attn, shared in undo:
            attn.config = shared
            delattr(attn, _CONFIG)
    return restore


def kernel_key(model: torch.nn.Module) -> dict[str, str]:
    """What a result-store key adds for this kernel: nothing under the model's own (old keys stay valid), the kernel
    where it runs (its rounding differs, so its results are kept apart)."""
    return {"sliding_kernel": "blocked"} if kernel_name(model) == "blocked" else {}


def kernel_name(model: torch.nn.Module) -> str:
    """Which kernel runs the sliding layers' prefill: "blocked", the model's own implementation ("sdpa", "eager")
    or "none" (no sliding layer)."""
    mods = sliding_modules(model)
    if not mods:
        return "none"
    impls = {m.config._attn_implementation or "sdpa" for m in mods}
    return "blocked" if IMPLEMENTATION in impls else sorted(impls)[0]
