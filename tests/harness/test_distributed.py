"""torchrun with 2 CPU processes (gloo) gives the same numbers and the same plans as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.data


def _run(args, cwd, nproc):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if nproc == 1:
        cmd = [sys.executable, "-m", "orthorank.harness.cli.main", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "orthorank.harness.cli.main", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_two_processes_equal_one(tiny_hf_folder, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text("Calibration text about many different things, and some more of it. " * 300)
    common = ["--model", str(tiny_hf_folder), "--threads", "1"]
    plans = {}
    for n in (1, 2):
        for method in ("orthorank", "sleb", "shortened-ppl"):
            _run(["calibrate", *common, "--method", method, "--sparsity", "0.2,0.3", "--calib-data", str(text),
                  "--calib-samples", "6", "--seq-len", "32", "--match", "nominal", "--no-store", "--measure-speed", "0",
                  "--out", f"run{n}/plans/{tiny_hf_folder.name}"], tmp_path, n)
        plans[n] = {p.name: json.loads(p.read_text()) for p in (tmp_path / f"run{n}/plans").rglob("*.json")}
    assert plans[1].keys() == plans[2].keys() and len(plans[1]) == 6
    for name in plans[1]:
        a, b = plans[1][name], plans[2][name]
        assert a["layers"] == b["layers"] and a["provenance"]["losses"] == b["provenance"]["losses"], name

    results = {}
    for n in (1, 2):
        out = _run(["compare", *common, "--methods", "dense,sleb,orthorank", "--match", "nominal",
                    "--sparsity", "0.2", "--datasets", "wikitext2", "--seq-len", "48", "--max-windows", "5",
                    "--ablations", "--ablation-levels", "0.2", "--zeroshot", "--tasks", "piqa,winogrande",
                    "--limit", "7", "--out", "out", "--store", "store", "--zeroshot-batch-size", "3"],
                   tmp_path / f"run{n}", n)
        assert out.count("| dense |") >= 1  # only rank 0 printed its tables once
        results[n] = json.loads((tmp_path / f"run{n}/out/compare.json").read_text())
    assert results[2]["world_size"] == 2 and results[1]["world_size"] == 1
    # every result file says how many processes made it
    assert results[2]["environment"]["processes"] == 2 and results[1]["environment"]["processes"] == 1
    ppl = {}
    for n in (1, 2):  # ppl shards its windows too, and its JSON says so
        _run(["ppl", *common, "--dataset", "wikitext2", "--seq-len", "48", "--max-windows", "5", "--json", "ppl.json"],
             tmp_path / f"run{n}", n)
        ppl[n] = json.loads((tmp_path / f"run{n}/ppl.json").read_text())
    assert ppl[2]["environment"]["processes"] == 2 and ppl[1]["environment"]["processes"] == 1
    assert ppl[1]["result"]["window_nll"] == pytest.approx(ppl[2]["result"]["window_nll"], rel=1e-6)
    for key in ("rows", "comparisons", "zeroshot"):
        assert results[1][key] == results[2][key], key
    # zero-shot command under torchrun too
    z = {}
    for n in (1, 2):
        _run(["zeroshot", *common, "--tasks", "arc_easy", "--limit", "9", "--batch-size", "4", "--json",
              f"z{n}.json", "--no-store"], tmp_path, n)
        z[n] = json.loads((tmp_path / f"z{n}.json").read_text())
    assert z[1]["outcomes"] == z[2]["outcomes"] and z[2]["world_size"] == 2


def test_harness_data_parallel_launch_with_the_orthorank_backend(tiny_hf_folder, tmp_path):
    """`torchrun -m orthorank.harness.evaluation.zeroshot --model orthorank ...` (the harness's own CLI) splits requests
    across processes and reports the numbers of a single process, once."""
    outs = {}
    for n in (1, 2):
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                   HF_DATASETS_OFFLINE="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
               "-m", "orthorank.harness.evaluation.zeroshot", "--model", "orthorank",
               "--device", "cpu", "--model_args", f"model={tiny_hf_folder}", "--tasks", "orthorank_arc_easy",
               "--limit", "6", "--output_path", str(tmp_path / f"h{n}")]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.count("|arc_easy|") == 1
        outs[n] = [line for line in proc.stdout.splitlines() if "acc" in line and "|" in line]
    assert outs[1] == outs[2] and outs[1]


def test_offloaded_model_under_torchrun_equals_one_process(tiny_hf_folder, tmp_path):
    """A model that does not fit its memory budget (layers offloaded to disk by accelerate): the search and the
    evaluation under torchrun give the single-process, undispatched results."""
    text = tmp_path / "calib.txt"
    text.write_text("Calibration text about many different things, and some more of it. " * 300)
    base = ["--model", str(tiny_hf_folder), "--threads", "1"]
    offload = ["--max-memory", "cpu=25400KB", "--offload-dir", str(tmp_path / "offload")]
    plans = {}
    for n, extra in ((1, []), (2, offload)):
        _run(["calibrate", *base, *extra, "--method", "sleb", "--sparsity", "0.25", "--calib-data", str(text),
              "--calib-samples", "4", "--seq-len", "32", "--json", f"sleb{n}.json"], tmp_path, n)
        plans[n] = json.loads((tmp_path / f"sleb{n}.json").read_text())
    assert plans[1]["layers"] == plans[2]["layers"]
    assert plans[1]["provenance"]["losses"] == pytest.approx(plans[2]["provenance"]["losses"], rel=1e-5)
    z = {}
    for n, extra in ((1, []), (2, offload)):
        _run(["zeroshot", *base, *extra, "--plan", f"sleb{n}.json", "--tasks", "arc_easy", "--limit", "6",
              "--batch-size", "3", "--json", f"z{n}.json", "--no-store"], tmp_path, n)
        z[n] = json.loads((tmp_path / f"z{n}.json").read_text())
    assert z[1]["outcomes"] == z[2]["outcomes"]
