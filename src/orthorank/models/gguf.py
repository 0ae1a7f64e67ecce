"""GGUF files (the format llama.cpp and Ollama users hold): checked before transformers dequantizes them.

transformers' GGUF loader reads the file's metadata into a config and dequantizes every tensor to the chosen dtype.
What it cannot do fails deep inside it with a traceback, or (a truncated file) with a reshape error; these checks
turn each case into one line before any work: not a GGUF file, truncated or corrupt, a quantization type the
`gguf` package cannot dequantize, an architecture transformers cannot read (the family check against our adapters
follows in loading.py, once the config is known).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import transformers
from safetensors.torch import save_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from orthorank.errors import UserError
from orthorank.models.catalog import cache_dir

MAGIC = b"GGUF"
# Stored without quantization; everything else must be dequantizable by gguf.quants.
_PLAIN_TYPES = {"F32", "F16", "BF16", "F64"}


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    tensor_types: tuple[str, ...]  # sorted names, e.g. ("F32", "Q4_1", "Q8_0")
    context_length: int | None


def check_gguf(path: str | Path) -> GGUFInfo:
    """The file's architecture and tensor types, or a one-line UserError saying why it cannot be loaded."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"GGUF file {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise UserError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        import gguf  # lazily: optional on a bare GPU machine (tests/harness/test_bench.py)
        from gguf import GGUFReader  # lazily: optional on a bare GPU machine (tests/harness/test_bench.py)
    except ImportError:
        raise UserError("loading GGUF files needs the gguf package: pip install gguf") from None
    try:
        reader = GGUFReader(path)
        fields = reader.fields
        architecture = str(fields["general.architecture"].contents())
        types = sorted({t.tensor_type.name for t in reader.tensors})
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, OSError, AssertionError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path} is truncated or corrupt: its GGUF header or tensors cannot be read ({first})") \
            from None
    if end > path.stat().st_size:
        raise UserError(f"{path} is truncated: its tensors end at byte {end}, the file has {path.stat().st_size}")
    dequantizable = _PLAIN_TYPES | {t.name for t in gguf.quants._type_traits}
    bad = [t for t in types if t not in dequantizable]
    if bad:
        raise UserError(f"{path} holds tensors of quantization type {', '.join(bad)}, which the gguf package "
                        f"{getattr(gguf, '__version__', '')} cannot dequantize for transformers".replace("  ", " "))
    # lazily: only a .gguf file needs transformers' GGUF reader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise UserError(f"{path} is a GGUF of architecture {architecture!r}, which transformers "
                        f"{transformers.__version__} cannot load from GGUF")
    ctx = fields.get(f"{architecture}.context_length")
    return GGUFInfo(path, architecture, tuple(types), int(ctx.contents()) if ctx is not None else None)


def _gguf_step(what: str, path: Path, step: Callable[[], Any]) -> Any:
    """transformers' GGUF reading, with its failures (unmapped fields, tensors it cannot place) as one line."""
    try:
        return step()
    except (ValueError, KeyError, RuntimeError, NotImplementedError, OSError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"transformers could not {what} {path.name}: {first[:300]}") from None


def converted_folder(path: str | Path, check_config: Callable[[Any], None] | None = None) -> Path:
    """A Hugging Face folder (config, float32 safetensors, tokenizer) holding the GGUF file's dequantized model,
    made once per file and transformers version in the cache folder.

    Why: transformers re-parses the GGUF metadata for the config, the tokenizer and the weights (for a 262k-token
    vocabulary each parse takes tens of seconds in Python) and dequantizes every tensor on every load; a converted
    folder loads in seconds. Dequantized values are exact in float32, so loading the folder in any dtype gives what
    loading the GGUF in that dtype gives. The folder is written under a temporary name and renamed into place."""
    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}".encode()).hexdigest()
    folder = cache_dir() / "converted" / f"{path.stem}-{key[:16]}"
    if (folder / "config.json").is_file():
        return folder
    check_gguf(path)
    if check_config is not None:  # e.g. a family we have no adapter for: refused before the slow conversion
        check_config(_gguf_step("read the config of", path,
                                lambda: AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)))
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        for stale in folder.parent.glob(".*"):  # temporary folders of conversions killed more than a day ago
            if stale.is_dir() and time.time() - stale.stat().st_mtime > 86400:
                shutil.rmtree(stale, ignore_errors=True)
        if folder.exists():  # a folder without config.json is no conversion of ours: replaced
            shutil.rmtree(folder)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as exc:
        raise UserError(f"cannot write the model cache {folder.parent}: {exc.strerror or exc}; set ORTHORANK_CACHE "
                        "to a writable folder") from None
    try:
        print(f"converting {path.name} to a cached float32 model folder (once per file): {folder}",
              file=sys.stderr, flush=True)
        model = _gguf_step("dequantize", path, lambda: AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32))
        tokenizer = _gguf_step("read the tokenizer of", path,
                               lambda: AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
        # save_pretrained refuses a model loaded from GGUF ("quantized with gguf"), though its weights are plain
        # tensors by now: write the config without the quantizer's mark, and the weights with safetensors.
        try:
            model.config.__dict__.pop("quantization_config", None)
            model.config.save_pretrained(tmp)
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save_pretrained(tmp)
            (tmp / "orthorank-source.json").write_text(json.dumps(
                {"gguf": str(path), "size": st.st_size, "transformers": transformers.__version__}) + "\n")
            tmp.chmod(0o755)
            for f in tmp.iterdir():
                f.chmod(0o644)
        except OSError as exc:
            raise UserError(f"cannot write the converted model to {tmp}: {exc.strerror or exc}") from None
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished first: its folder is as good
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
