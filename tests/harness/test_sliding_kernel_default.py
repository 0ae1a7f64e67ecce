"""Which kernel runs sliding-window layers when a user passes nothing (issue 57): the exact blocked kernel on a CPU,
the model's own on a GPU, and every result file says which ran."""

from __future__ import annotations

import json

import pytest
import torch

from cli_helpers import run_cli
from conftest import tiny_model
from orthorank.harness.api.common import sliding_kernel_choice


def test_auto_is_blocked_on_cpu_and_the_models_own_elsewhere():
    assert sliding_kernel_choice("auto", torch.device("cpu")) == "blocked"
    assert sliding_kernel_choice("auto", torch.device("cuda")) == "model"
    assert sliding_kernel_choice("model", torch.device("cpu")) == "model"


@pytest.fixture(scope="module")
def tiny_sliding_folder(tmp_path_factory):
    from transformers import AutoTokenizer

    from orthorank.models.gguf import converted_folder
    from orthorank.models.loading import embedded_gguf_path

    tok = AutoTokenizer.from_pretrained(str(converted_folder(embedded_gguf_path())))
    folder = tmp_path_factory.mktemp("tiny-mistral")
    tiny_model("mistral", layers=2, sliding_window=16, vocab_size=len(tok),
               pad_token_id=tok.eos_token_id).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("flag, kernel", [((), "blocked"), (("--sliding-kernel", "model"), "sdpa")])
def test_result_files_record_the_sliding_kernel_that_ran(capsys, tmp_path, tiny_sliding_folder, flag, kernel):
    out = tmp_path / "bench.json"
    code, _, err = run_cli(capsys, "bench", "--model", tiny_sliding_folder, "--methods", "dense", "--seq-len", "64",
                           "--repeats", "1", "--warmup", "0", "--json", out, *flag)
    assert code == 0, err
    assert f"sliding-window layers: {kernel} kernel" in err
    assert json.loads(out.read_text())["environment"]["kernels"] == {"sliding_window": kernel}


def test_a_model_without_sliding_layers_records_no_kernel(capsys, tmp_path, tiny_sliding_folder, tiny_hf_folder):
    run_cli(capsys, "bench", "--model", tiny_sliding_folder, "--methods", "dense", "--seq-len", "32", "--repeats", "1",
            "--warmup", "0", "--json", tmp_path / "a.json")
    code, _, err = run_cli(capsys, "bench", "--model", tiny_hf_folder, "--methods", "dense", "--seq-len", "32",
                           "--repeats", "1", "--warmup", "0", "--json", tmp_path / "b.json")
    assert code == 0, err
    assert "kernels" not in json.loads((tmp_path / "b.json").read_text())["environment"]
