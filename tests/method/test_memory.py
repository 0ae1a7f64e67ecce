"""Memory: the guard's estimate and its one-line refusal, the peak recorded in result files."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cli_helpers import assert_user_error
from conftest import tiny_model
from orthorank.harness.runtime.memory import Shape, check_fits, estimate_bytes
from orthorank.method.cost import Arch
from orthorank.errors import UserError


def test_estimate_grows_with_batch_length_and_cache():
    shape = Shape(Arch(num_layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152),
                  eager=False, value_bytes=4)  # SmolLM2-135M
    assert Shape.of(tiny_model(layers=2)).arch.num_layers == 2
    base = estimate_bytes(shape, 1, 512)
    assert estimate_bytes(shape, 2, 512) > base and estimate_bytes(shape, 1, 1024) > base
    assert estimate_bytes(shape, 1, 512, loss=True) > base  # the cross-entropy's log-probabilities
    assert estimate_bytes(shape, 1, 512, cache_tokens=600, all_logits=False) < base  # generation: last logits only
    eager = dataclasses.replace(shape, eager=True)
    assert estimate_bytes(eager, 1, 4096) >= 2 * shape.arch.heads * 4096 ** 2 * 4 > estimate_bytes(shape, 1, 4096)


def test_guard_refuses_with_what_fits():
    model = tiny_model(layers=2)
    need = check_fits(model, 4, 256, what="ppl", loss=True, available=1 << 40)
    with pytest.raises(UserError, match=r"ppl: batch 4 x 256 tokens needs about .* GiB above the loaded model, but "
                                        r"only .* is available; batch [123] fits at 256 tokens"):
        check_fits(model, 4, 256, what="ppl", loss=True, available=int(need / 2))
    with pytest.raises(UserError, match="at batch 1 at most [0-9]+ tokens fit"):
        check_fits(model, 1, 4096, what="ppl", loss=True, available=need)


def test_guard_counts_only_the_logits_a_forward_computes():
    """bench's prefill computes the last position's logits: a length the all-positions estimate refuses (the
    262k-vocabulary logits of a long Gemma prompt) is let through when only the last position's count."""
    model = tiny_model(layers=2, vocab_size=50000)  # logits large enough to be the peak
    last = check_fits(model, 1, 4096, what="bench", available=1 << 40, all_logits=False)
    everywhere = check_fits(model, 1, 4096, what="bench", available=1 << 40)
    assert everywhere > last
    between = int((last + everywhere) / 2 / 0.9)  # the guard keeps 10% headroom
    assert check_fits(model, 1, 4096, what="bench", available=between, all_logits=False) == last
    with pytest.raises(UserError, match="bench: batch 1 x 4096 tokens"):
        check_fits(model, 1, 4096, what="bench", available=between)


def test_peak_meter_sees_an_allocation_after_start():
    """In a fresh process, as a command uses it (in a long-lived one, memory freed earlier and kept by the
    allocator can be reused without raising the resident set)."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, json, torch; sys.path.insert(0, sys.argv[1]);"
        "from orthorank.harness.peak_memory import PeakMeter;"
        "m = PeakMeter('cpu').start(); b = torch.ones(64 * 2**20 // 4); b.add_(1);"
        "print(json.dumps(m.to_dict()))")
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code, src], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["peak_above_model_mib"] >= 60 and "high-water" in d["how"]


def test_commands_refuse_what_does_not_fit_and_record_their_peak(tiny_hf_folder, tmp_path, capsys, monkeypatch):
    text = tmp_path / "t.txt"
    text.write_text("Some words to score, over and over again. " * 300)
    monkeypatch.setenv("ORTHORANK_MEMORY_LIMIT", "100KiB")
    assert_user_error(capsys, "is available; ", "ppl", "--model", str(tiny_hf_folder), "--dataset", str(text),
                      "--seq-len", "256", "--batch-size", "4")
    assert_user_error(capsys, "is available; ", "generate", "--model", str(tiny_hf_folder), "--prompt",
                      "hello there", "--max-new-tokens", "200")
    monkeypatch.delenv("ORTHORANK_MEMORY_LIMIT")
    from orthorank.harness.cli.main import main

    assert main(["ppl", "--model", str(tiny_hf_folder), "--dataset", str(text), "--seq-len", "64",
                 "--max-windows", "2", "--json", str(tmp_path / "r.json")]) == 0
    memory = json.loads((tmp_path / "r.json").read_text())["memory"]
    assert memory["peak_above_model_mib"] >= 0 and memory["model_resident_mib"] > 0 and memory["how"]
