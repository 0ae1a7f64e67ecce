"""lm-evaluation-harness model backend `orthorank`: the harness's own HF backend (HFLM) around a model with a plan
applied. All scoring (log-likelihoods, batching, caching of one-token continuations) is HFLM's.

    lm_eval --model orthorank --model_args model=smollm2-135m,plan=plans/smollm2-135m/orthorank-0.2.json ...
    lm_eval.simple_evaluate(model="orthorank", model_args={"model": "smollm2-135m", "plan": "..."}, ...)

model_args: model (as `orthorank --model`), plan (a plan file) or method + sparsity (a saved plan, see
orthorank.method.plan_store.find_plan), dtype, seed, data_dir (read by the offline tasks, ignored here); other
keys go to HFLM (max_length, add_bos_token, ...).

lm_eval 0.4.13 does not read the `lm_eval.models` entry point that pyproject.toml declares; importing this module
registers the backend (see `register()`), and `python -m orthorank.harness.evaluation.zeroshot` runs the lm_eval CLI
with it and our offline tasks available.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import lm_eval.models.huggingface as hf
import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM  # also registers the harness's own models first

from orthorank.errors import UserError
from orthorank.method.apply import apply_plan, restore_dense
from orthorank.method.plan import Plan
from orthorank.method.plan_store import find_plan
from orthorank.method.registry import is_reference
from orthorank.models.loading import LoadedModel, load_model

log = logging.getLogger(__name__)
BACKEND_NAME = "orthorank"


def effective_batch_size(plan: Plan, requested: int | str | None) -> int | str:
    """The batch size to give HFLM. OrthoRank plans batch too: HFLM right-pads rows and calls the model without an
    attention mask, so OrthoRankLM records each row's length while HFLM pads (see `_loglikelihood_tokens`) and
    passes the matching mask, so padding never counts towards a row's K or gets selected."""
    if requested is None:
        return 1
    if isinstance(requested, str) and not requested.startswith("auto"):
        try:
            requested = int(requested)
        except ValueError:
            raise UserError(f"batch size must be a positive integer or 'auto', got {requested!r}") from None
    if isinstance(requested, int) and requested < 1:
        raise UserError(f"batch size must be at least 1, got {requested}")
    return requested


def _device(device: str | torch.device | None) -> torch.device | None:
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        # lm_eval's CLI passes device=cuda:0 unless told otherwise; on a CPU-only machine that means the CPU.
        log.warning("CUDA is not available; using the CPU")
        return torch.device("cpu")
    return dev


class OrthoRankLM(HFLM):
    """HFLM over an orthorank LoadedModel with a Plan applied in place."""

    def __init__(
        self,
        model: str | LoadedModel = "smollm2-135m",
        plan: str | Plan | None = None,
        method: str | None = None,
        sparsity: float | None = None,
        device: str | torch.device | None = None,
        dtype: str | None = "auto",
        seed: int = 0,
        batch_size: int | str | None = 1,
        data_dir: str | None = None,  # read by the offline tasks (through the run's metadata), not here
        **kwargs: Any,
    ) -> None:
        if isinstance(model, LoadedModel):
            lm = model
        else:
            torch.manual_seed(int(seed))
            lm = load_model(str(model), device=_device(device), dtype=dtype, seed=int(seed))
        if lm.tokenizer is None:
            raise UserError(f"{lm.name} is a random-weight shape without a tokenizer; zero-shot needs a real model")
        restore_dense(lm.model)  # a plan is checked against, and applied to, the dense model
        self.plan = resolve_plan(lm, plan, method, sparsity)
        self.loaded = lm
        apply_plan(lm.model, self.plan)
        for key in ("pretrained", "tokenizer", "backend"):
            if key in kwargs:
                raise UserError(f"model_args {key}= is set by the orthorank backend; give model= (and plan=)")
        super().__init__(
            pretrained=lm.model,
            tokenizer=lm.tokenizer,
            backend="causal",
            batch_size=effective_batch_size(self.plan, batch_size),
            **kwargs,
        )

        self._row_lengths: list[int] | None = None
        self._join_data_parallel()

    def _join_data_parallel(self) -> None:
        """Under the harness's own data-parallel launch (`accelerate launch -m lm_eval` or torchrun), HFLM treats an
        already-built model as single-process; take the rank and world size from accelerate so that requests are
        split across processes and gathered on rank 0."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return
        from accelerate import Accelerator  # lazily: only a data-parallel harness launch needs accelerate

        acc = Accelerator()
        self.accelerator = acc
        self._rank = acc.process_index
        self._world_size = acc.num_processes

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        original = hf.pad_and_concat

        def recording(max_length, tensors, padding_side="right"):
            self._row_lengths = [int(t.shape[-1]) for t in tensors] if padding_side == "right" else None
            return original(max_length, tensors, padding_side=padding_side)

        hf.pad_and_concat = recording
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        finally:
            hf.pad_and_concat = original
            self._row_lengths = None

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None) -> torch.Tensor:
        lengths, self._row_lengths = self._row_lengths, None
        if (bool(self.plan.selection_layers) and attn_mask is None and lengths is not None
                and len(lengths) == inps.shape[0] and min(lengths) < inps.shape[1]):
            mask = (torch.arange(inps.shape[1], device=inps.device)[None, :]
                    < torch.tensor(lengths, device=inps.device)[:, None]).long()
            with torch.no_grad():
                return self.model(inps, attention_mask=mask).logits
        return super()._model_call(inps, attn_mask, labels)

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info.update({"orthorank_model": self.loaded.name, "orthorank_plan": self.plan.to_dict()})
        return info


def resolve_plan(lm: LoadedModel, plan: str | Plan | None, method: str | None, sparsity: float | None) -> Plan:
    """A Plan object, a plan file, a saved plan (method + sparsity), or dense; checked against the model."""
    dense = method is None or is_reference(method)
    if plan is not None and (not dense or sparsity is not None):
        raise UserError("give either plan= or method= with sparsity=, not both")
    if isinstance(plan, Plan):
        result = plan
    elif plan:
        result = Plan.load(plan)
    elif dense:
        if sparsity not in (None, 0, 0.0):
            raise UserError("method dense takes no sparsity")
        return Plan("dense", [], lm.name, lm.signature())
    else:
        if sparsity is None:
            raise UserError(f"method {method} needs sparsity= (or give plan=FILE)")

        result = Plan.load(find_plan(lm.name, method, float(sparsity)))
    result.check_model(lm.name, lm.signature())
    return result


def register() -> None:
    """Make `--model orthorank` known to lm_eval's model registry (idempotent; a version of the harness that
    loads the package's entry point may already have registered it)."""
    try:
        register_model(BACKEND_NAME)(OrthoRankLM)
    except (ValueError, AssertionError):  # already registered (through the entry point)
        pass


register()
