"""Recording what selection layers compute, with gradients: the loss-oracle's dense pass and the router's fit.

While a recorder is set on a plan's `SequenceContext`, every selection layer runs its dense update for every token,
keeps either all of it (`select=False`: the dense model, as the loss-oracle needs) or what its own policy selects
(`select=True`: the plan as it runs, as the router's fit needs), and hands the recorder its input, score input,
dense output and kept output (SelectiveLayer._recorded). Autograd stays on, so a recorder can take the loss's
gradient at every selection layer's output from one backward pass:

    effect_i = <dL/dh_out_i, f(x)_i - x_i>

is, to first order, how much token i's update changes the loss L (negative: the update lowers it).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn


class Recorder:
    """Collects each selection layer's tensors of one forward, in layer order."""

    def __init__(self, select: bool) -> None:
        self.select = select
        self.layers: dict[int, dict[str, Any]] = {}

    def add(self, layer: Any, *, hidden_states: torch.Tensor, src: torch.Tensor, dense_out: torch.Tensor,
            out: torch.Tensor, keep: torch.Tensor | None) -> None:
        self.layers[layer.layer_index] = {"layer": layer, "hidden": hidden_states, "src": src,
                                          "dense_out": dense_out, "out": out, "keep": keep}


@contextmanager
def recording(context: Any, recorder: Recorder) -> Iterator[Recorder]:
    """Set `recorder` on a plan's SequenceContext for the forwards inside the block."""
    previous, context.recorder = context.recorder, recorder
    try:
        yield recorder
    finally:
        context.recorder = previous


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None) -> torch.Tensor:
    """Summed next-token NLL of [B, T] ids under logits [B, T, V] (labels: other targets [B, T - 1], e.g. sampled
    from the model; valid: [B, T] real tokens, a pad neither predicts nor is predicted)."""
    target = ids[:, 1:] if labels is None else labels
    nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                          reduction="none").view(target.shape)
    if valid is not None:
        nll = nll * (valid[:, 1:] & valid[:, :-1])
    return nll.sum()


def update_effects(rec: Recorder, loss: torch.Tensor, retain_graph: bool = False) -> dict[int, torch.Tensor]:
    """layer -> [B, T] float32: <dL/dh_out_i, f(x)_i - x_i> for every recorded selection layer, from one backward."""
    items = sorted(rec.layers.items())
    outs = [item["out"] for _, item in items]
    grads = torch.autograd.grad(loss, outs, retain_graph=retain_graph, allow_unused=True)
    effects = {}
    for (index, item), g in zip(items, grads):
        update = (item["dense_out"] - item["hidden"]).detach().float()
        effects[index] = (torch.zeros(update.shape[:2], device=update.device) if g is None
                          else (g.float() * update).sum(-1)).detach()
    return effects


def loss_effect_hook(model: nn.Module, logits_of: Any):
    # logits_of(model, h): the head on the decoder's *output* (already final-normed), e.g. adapter.head_logits
    """A SequenceContext before-forward hook for the loss-oracle policy: before each forward under the plan, one
    dense forward (the plan's removed layers stay removed) and one backward on the input's own next tokens give
    every selection layer's per-token loss effects, handed to the layers as `context.given`."""

    def hook(context: Any, kwargs: dict) -> None:
        ids = context.input_ids
        if ids is None or ids.shape[1] < 2:
            return  # no labels to read (one decoded token, inputs_embeds): the layers refuse to rank
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if cache is not None and int(cache.get_seq_length()) > 0:
            return
        mask = context.attention_mask
        valid = mask[:, -ids.shape[1]:].bool() if mask is not None else None
        rec = Recorder(select=False)
        saved = (context.attention_mask, context.input_ids, context.record_states)
        try:
            with recording(context, rec), torch.enable_grad():
                hidden = context.decoder(input_ids=ids, attention_mask=mask, position_ids=kwargs.get("position_ids"),
                                         use_cache=False).last_hidden_state
                loss = next_token_loss(logits_of(model, hidden), ids, valid)
                given = update_effects(rec, loss)
        finally:  # the nested forward's capture must not change what the outer forward's layers read
            context.attention_mask, context.input_ids, context.record_states = saved
            context._facts, context._row_hashes = None, None
        context.given = given

    return hook
