"""The command line: results on good input, one-line errors with exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cli_helpers import assert_user_error, run_cli

TEXT = ("The quick brown fox jumps over the lazy dog. " * 40).strip()


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "text.txt"
    p.write_text(TEXT)
    return p


def test_ppl_dense_and_orthorank_write_json(capsys, tiny_hf_folder, text_file, tmp_path):
    out_json = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "ppl", "--model", tiny_hf_folder, "--dataset", text_file, "--seq-len", 32,
                           "--json", out_json)
    assert code == 0 and "perplexity" in out
    data = json.loads(out_json.read_text())
    assert data["result"]["windows"] >= 1 and data["result"]["perplexity"] > 1
    for key in ("torch", "transformers", "device", "git_commit", "python"):
        assert key in data["environment"]
    assert data["environment"]["command_line"].startswith("orthorank ppl --model ")  # how to reproduce it
    assert data["seed"] == 0 and data["plan"]["method"] == "dense"
    code, out, _ = run_cli(capsys, "ppl", "--model", tiny_hf_folder, "--dataset", text_file, "--seq-len", 32,
                           "--method", "orthorank", "--layers", "1,2", "--ratio", "0.5", "--max-windows", 2)
    assert code == 0 and "orthorank" in out


def test_existing_json_is_not_overwritten(capsys, tiny_hf_folder, text_file, tmp_path):
    out_json = tmp_path / "mine.json"
    out_json.write_text("precious")
    assert_user_error(capsys, "--overwrite", "ppl", "--model", tiny_hf_folder, "--dataset", text_file,
                      "--seq-len", 32, "--json", out_json)
    assert out_json.read_text() == "precious"


@pytest.mark.parametrize("ratio", ["0", "1.5", "-0.2"])
def test_ratio_out_of_range(capsys, tiny_hf_folder, text_file, ratio):
    assert_user_error(capsys, "ratio must be in (0, 1]", "ppl", "--model", tiny_hf_folder, "--dataset", text_file,
                      "--seq-len", 32, "--method", "orthorank", "--layers", "1", "--ratio", ratio)


def test_empty_and_short_text(capsys, tiny_hf_folder, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert_user_error(capsys, "is empty", "ppl", "--model", tiny_hf_folder, "--dataset", empty)
    short = tmp_path / "short.txt"
    short.write_text("just a few words")
    assert_user_error(capsys, "fewer than one window", "ppl", "--model", tiny_hf_folder, "--dataset", short,
                      "--seq-len", 2048)


def test_unknown_dataset_and_missing_files(capsys, tiny_hf_folder, tmp_path):
    assert_user_error(capsys, "unknown dataset", "ppl", "--model", tiny_hf_folder, "--dataset", "imagenet")
    assert_user_error(capsys, "does not exist", "ppl", "--model", tiny_hf_folder, "--dataset", tmp_path / "no.txt")
    assert_user_error(capsys, "does not exist", "ppl", "--model", tiny_hf_folder, "--data-dir", tmp_path / "nope")
    empty_dir = tmp_path / "data"
    empty_dir.mkdir()
    assert_user_error(capsys, "missing data file", "ppl", "--model", tiny_hf_folder, "--data-dir", empty_dir)


def test_unknown_model_and_family(capsys, tmp_path, text_file):
    from transformers import GPT2Config

    folder = tmp_path / "gpt2"
    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(folder)
    assert_user_error(capsys, "not supported; supported families: gemma, gemma2", "ppl",
                      "--model", folder, "--dataset", text_file)
    assert_user_error(capsys, "unknown model", "ppl", "--model", "no-such-model", "--dataset", text_file)


def test_layers_out_of_range(capsys, tiny_hf_folder, text_file):
    assert_user_error(capsys, "out of range", "ppl", "--model", tiny_hf_folder, "--dataset", text_file,
                      "--method", "orthorank", "--layers", "1,9")
    assert_user_error(capsys, "integers", "ppl", "--model", tiny_hf_folder, "--dataset", text_file,
                      "--method", "orthorank", "--layers", "a,b")


def test_plan_files(capsys, tiny_hf_folder, text_file, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_user_error(capsys, "not valid JSON", "ppl", "--model", tiny_hf_folder, "--dataset", text_file,
                      "--plan", bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": "orthorank-plan/1", "method": "orthorank", "layers": [1]}))
    assert_user_error(capsys, "malformed", "ppl", "--model", tiny_hf_folder, "--dataset", text_file, "--plan", wrong)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({
        "format": "orthorank-plan/1", "method": "orthorank", "layers": [3, 5], "model": "smollm2-135m",
        "signature": {"model_type": "llama", "num_layers": 30, "hidden_size": 576, "vocab_size": 49152},
    }))
    assert_user_error(capsys, "this plan was made for model 'smollm2-135m'", "ppl", "--model", tiny_hf_folder,
                      "--dataset", text_file, "--plan", other)
    assert_user_error(capsys, "does not exist", "ppl", "--model", tiny_hf_folder, "--dataset", text_file,
                      "--plan", tmp_path / "missing.json")


def test_console_script_exit_code(tmp_path):
    """Through a real process: exit status 2 and no traceback."""
    proc = subprocess.run([sys.executable, "-m", "orthorank.harness.cli.main", "ppl", "--dataset", tmp_path / "none.txt"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("orthorank ppl: error:")
