"""Load a model: a shipped model by name (the embedded default), a .gguf file, an installed model package, a local
Hugging Face folder, a hub id, or a random shape."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from orthorank.errors import UserError
from orthorank.models.adapters import _ADAPTERS, get_adapter, supported_families
from orthorank.models.catalog import SHIPPED, package_gguf, shipped_by_file, shipped_by_package
from orthorank.models.gguf import converted_folder
from orthorank.models.shapes import SHAPES, shape_config

EMBEDDED_MODEL = "smollm2-135m"


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any | None  # None for random-weight shapes
    name: str  # what plans record and are checked against
    device: torch.device
    source: str = "random weights"  # where the weights came from, in words

    def description(self) -> str:
        """One line: what was loaded (family, layers, parameters, dtype, source, context length)."""
        c = self.model.config
        params = sum(p.numel() for p in self.model.parameters())
        dtype = str(next(self.model.parameters()).dtype).replace("torch.", "")
        ctx = getattr(c, "max_position_embeddings", None)
        return (f"loaded {self.name}: {c.model_type}, {self.num_layers} layers, {params / 1e6:.1f}M parameters, "
                f"{dtype}, context {ctx if ctx else 'unknown'} tokens, from {self.source}")

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
    shipped = SHIPPED[EMBEDDED_MODEL]
    return shipped.locate(shipped)


@dataclass(frozen=True)
class ModelSource:
    name: str  # what plans record
    gguf: Path | None  # the GGUF file to load, where the spec names one


def resolve_source(spec: str) -> ModelSource:
    """A shipped model by name or package, a .gguf path, or any installed package holding one GGUF file; for
    other specs (folders, hub ids) gguf is None. A GGUF path that is a shipped model's file gets its name, so its
    plans are found."""
    if spec in SHIPPED:
        return ModelSource(spec, SHIPPED[spec].locate(SHIPPED[spec]))
    by_package = shipped_by_package(spec)
    if by_package is not None:
        return ModelSource(by_package.name, by_package.locate(by_package))
    if spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UserError(f"GGUF file {spec} does not exist")
        path = path.resolve()
        return ModelSource(gguf_model_name(path), path)
    if not Path(spec).exists() and "/" not in spec:
        found = package_gguf(spec)
        if found is not None:
            return ModelSource(package_model_name(spec), found)
    return ModelSource(spec, None)


def gguf_model_name(path: str | Path) -> str:
    """What plans record for a GGUF file: the shipped model's name where the file is one, else the file's stem."""
    path = Path(path).expanduser().resolve()
    shipped = shipped_by_file(path)
    return shipped.name if shipped else path.stem


def package_model_name(package: str) -> str:
    return package.strip().lower().replace("_", "-")


def _finish(model: nn.Module, device: torch.device, max_memory: dict[str, str] | None = None,
            offload_dir: str | None = None) -> nn.Module:
    get_adapter(model)  # unsupported families fail here, before any work
    model.eval()
    model.requires_grad_(False)
    if max_memory:
        return dispatch(model, device, max_memory, offload_dir)
    model.to(device)
    return model


def parse_max_memory(text: str | None, device: torch.device) -> dict[str, str] | None:
    """"cuda=10GiB,cpu=20GiB" -> accelerate's max_memory ({device index or "cpu"/"disk": size}); "cuda" is this
    process's GPU (under torchrun, each rank's own)."""
    if not text:
        return None
    out: dict = {}
    for part in text.split(","):
        key, sep, size = part.partition("=")
        key, size = key.strip(), size.strip()
        if not sep or not size:
            raise UserError(f"--max-memory takes device=size pairs such as cuda=10GiB,cpu=20GiB; got {part!r}")
        if key == "cuda":
            key = device.index if device.type == "cuda" and device.index is not None else 0
        elif key not in ("cpu", "disk") and not key.isdigit():
            raise UserError(f"--max-memory: unknown device {key!r} (use cuda, cpu or disk)")
        out[int(key) if isinstance(key, str) and key.isdigit() else key] = size
    return out


def _bytes(size: str) -> int:
    # lazily: optional on a bare GPU machine (tests/harness/test_bench.py)
    from accelerate.utils import convert_file_size_to_int

    try:
        return int(convert_file_size_to_int(size))
    except (ValueError, TypeError):
        raise UserError(f"--max-memory: cannot read the size {size!r} (e.g. 10GiB, 500MB)") from None


def layer_device_map(model: nn.Module, device: torch.device, max_memory: dict) -> dict[str, Any]:
    """Whole decoder layers in order on the GPU (this process's), then the CPU, then disk, within the budgets;
    embeddings, final norm and head stay on the first device."""
    adapter = get_adapter(model)
    names = {id(m): n for n, m in model.named_modules()}
    layers = list(adapter.layers(model))
    layer_names = [names[id(layer)] for layer in layers]  # e.g. model.layers.3
    tiers: list[tuple[Any, int]] = []
    if device.type == "cuda":
        tiers.append((device.index or 0, _bytes(max_memory.get(device.index or 0, "0"))))
    tiers.append(("cpu", _bytes(max_memory["cpu"]) if "cpu" in max_memory else (0 if device.type == "cuda" else 1 << 62)))
    first = tiers[0][0]
    device_map: dict[str, Any] = {}

    def size(mod: nn.Module) -> int:
        return sum(t.numel() * t.element_size() for t in mod.state_dict().values())

    used = {k: 0 for k, _ in tiers}
    decoder, layer_list = adapter.decoder(model), adapter.layers(model)
    rest = [(n, c) for n, c in model.named_children() if c is not decoder]
    rest += [(f"{names[id(decoder)]}.{n}", c) for n, c in decoder.named_children() if c is not layer_list]
    for n, child in rest:
        device_map[n] = first
        used[first] += size(child)
    for n, layer in zip(layer_names, layers):
        need = size(layer)
        for key, budget in tiers:
            if used[key] + need <= budget:
                device_map[n], used[key] = key, used[key] + need
                break
        else:
            device_map[n] = "disk"
    return device_map


def dispatch(model: nn.Module, device: torch.device, max_memory: dict, offload_dir: str | None) -> nn.Module:
    """Spread the model over GPU, CPU and disk with accelerate, whole decoder layers at a time."""
    from accelerate import dispatch_model  # lazily: optional on a bare GPU machine (tests/harness/test_bench.py)

    device_map = layer_device_map(model, device, max_memory)
    if "disk" in device_map.values() and not offload_dir:
        raise UserError("the model does not fit --max-memory without disk offload; pass --offload-dir FOLDER")
    if offload_dir and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # each torchrun process writes its own copy
        offload_dir = os.path.join(offload_dir, f"rank{os.environ.get('RANK', '0')}")
    return dispatch_model(model, device_map=device_map, offload_dir=offload_dir,
                          main_device=str(device) if device.type == "cuda" else "cpu")


def load_model(
    spec: str = EMBEDDED_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    num_layers: int | None = None,
    seed: int = 0,
    max_memory: str | dict | None = None,
    offload_dir: str | None = None,
) -> LoadedModel:
    """`spec`: a shipped model ("smollm2-135m", "gemma3-270m"), a shape name (random weights), a .gguf path, an
    installed model package, a local folder, or a hub id."""
    hf_logging.set_verbosity_error()
    dev = torch.device(device) if device is not None else default_device()
    torch_dtype = resolve_dtype(dtype, dev)
    if isinstance(max_memory, str):
        max_memory = parse_max_memory(max_memory, dev)

    if spec in SHAPES:
        torch.manual_seed(seed)
        config = shape_config(spec, num_layers)
        config._attn_implementation = "sdpa"
        with dev:
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        return LoadedModel(_finish(model, dev, max_memory, offload_dir), None, spec, dev)

    if num_layers is not None:
        raise UserError("--num-layers applies only to random-weight shapes: " + ", ".join(SHAPES))

    kwargs = dict(dtype=torch_dtype, attn_implementation="sdpa")
    source = resolve_source(spec)
    if source.gguf is not None:
        folder = str(converted_folder(source.gguf, check_config=lambda config: check_family(config, spec)))
        name, tok_kwargs, model_kwargs = source.name, {}, {}
    elif Path(spec).is_dir():
        folder, name, tok_kwargs, model_kwargs = str(Path(spec).resolve()), Path(spec).resolve().name, {}, {}
        if not (Path(spec) / "config.json").is_file():
            raise UserError(f"{spec} is a folder but holds no config.json; is it a Hugging Face model folder?")
    elif "/" in spec and not Path(spec).exists() and not spec.startswith((".", "/")):
        folder, name, tok_kwargs, model_kwargs = spec, spec, {}, {}
    else:
        raise UserError(
            f"unknown model {spec!r}: give a shipped model ({', '.join(SHIPPED)}), a shape ({', '.join(SHAPES)}), "
            "a .gguf file, an installed model package, a local Hugging Face model folder, or a hub id like org/name"
        )

    try:
        check_family(AutoConfig.from_pretrained(folder, **model_kwargs), spec)
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
    where = f"{source.gguf} (GGUF, dequantized; cached as {folder})" if source.gguf else folder
    return LoadedModel(_finish(model, dev, max_memory, offload_dir), tokenizer, name, dev, where)


def check_family(config, spec: str) -> None:
    """Refuse a model family without an adapter before its weights are loaded."""
    if config.model_type not in _ADAPTERS:
        raise UserError(f"model family {config.model_type!r} of {spec!r} is not supported; supported families: "
                        f"{', '.join(supported_families())}")


def check_context(model: nn.Module, n_tokens: int) -> None:
    """A clear error for inputs longer than the model's context (positions beyond it are untrained)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is not None and n_tokens > limit:
        raise UserError(f"{n_tokens} tokens exceed the model's context of {limit} tokens; use a shorter "
                        "--seq-len or input")


def input_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: its parameters' device, or for a model dispatched by accelerate the device of
    its embedding (CPU when that is offloaded: the hooks move inputs and weights)."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        first = next(iter(device_map.values()))
        if isinstance(first, int):
            return torch.device("cuda", first)
        return torch.device(first) if first not in ("disk", "meta") else torch.device("cpu")
    return next(model.parameters()).device
