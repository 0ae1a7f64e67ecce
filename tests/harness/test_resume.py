"""Searches resume: every greedy step is checkpointed in the result store as it is chosen; a rerun after an
interruption (an exception, Ctrl-C, or kill -9 at a random moment) finishes with the plan an uninterrupted run
writes, and no half-written file is left behind."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from orthorank.harness.search.checkpoint import Checkpoint
from orthorank.harness.search.registry import SEARCH_METHODS
from orthorank.harness.search.layer_search import StackRunner
from orthorank.method import SelectionConfig
from orthorank.harness.store import ResultStore


class Stop(Exception):
    pass


def _search(method, store, steps=4, stop_after=None, seed=0):
    m = tiny_model(layers=8, seed=seed)
    windows = torch.randint(1, 128, (6, 32), generator=torch.Generator().manual_seed(seed))
    runner = StackRunner(m, windows, 2)
    search = SEARCH_METHODS[method]
    sel = SelectionConfig(ratio=0.33)
    ck = Checkpoint.open(store, runner, method, search.settings(sel, None, 3))
    if stop_after is not None:  # interrupt once `stop_after` steps are stored
        put = ck.put

        def put_then_stop(index, value):
            put(index, value)
            if index >= stop_after:
                raise Stop
        ck.put = put_then_stop
    return search.run(runner, steps, sel, False, checkpoint=ck), ck


@pytest.mark.parametrize("method", ["orthorank", "sleb", "shortened-ppl"])
def test_interrupted_search_resumes_to_the_same_result(method, tmp_path):
    full, _ = _search(method, None)
    store = ResultStore(tmp_path / "store")
    with pytest.raises(Stop):
        _search(method, store, stop_after=2)
    resumed, ck = _search(method, store)
    assert ck.resumed == 2 and resumed.order == full.order and resumed.losses == full.losses
    assert resumed.dense_loss == full.dense_loss and resumed.evaluations == full.evaluations
    # a third run replays everything and computes nothing new
    again, ck = _search(method, store)
    assert ck.written == 0 and again.order == full.order


def test_fewer_steps_take_the_stored_prefix_and_more_steps_go_on(tmp_path):
    store = ResultStore(tmp_path / "store")
    full, _ = _search("sleb", None, steps=5)
    short, _ = _search("sleb", store, steps=2)
    assert short.order == full.order[:2]
    longer, ck = _search("sleb", store, steps=5)
    assert ck.resumed == 2 and longer.order == full.order and longer.losses == full.losses


def test_a_resumed_search_states_the_seconds_of_all_its_runs(tmp_path, monkeypatch):
    """Each step stores the search's seconds up to it, summed over runs, so a plan written by a resumed hybrid search
    states the whole search's time; steps stored before per-step timing make it unknown (None), never one run's."""
    import orthorank.harness.search.checkpoint as checkpoint

    clock = iter([100.0, 100.0, 130.0, 150.0,    # run 1: started, loaded, steps 1 and 2 at 30 s and 50 s
                  500.0, 500.0, 520.0])          # run 2 (resumed after step 2): step 3 20 s later
    monkeypatch.setattr(checkpoint.time, "perf_counter", lambda: next(clock))
    store = ResultStore(tmp_path / "store")
    ck = Checkpoint(store.namespace("search", {"k": 1}))
    ck.load()
    ck.put(1, {"loss": 1.0})
    ck.put(2, {"loss": 2.0})
    again = Checkpoint(store.namespace("search", {"k": 1}))
    again.load()
    again.put(3, {"loss": 3.0})
    assert (again.seconds_at(2), again.seconds_at(3)) == (50.0, 70.0)
    # steps stored by an older version, without seconds: the whole search's time is unknown
    store.namespace("search", {"k": 2}).put({1: {"loss": 1.0}})
    monkeypatch.setattr(checkpoint.time, "perf_counter", lambda: 0.0)
    old = Checkpoint(store.namespace("search", {"k": 2}))
    old.load()
    old.put(2, {"loss": 2.0})
    assert old.earlier_seconds is None and old.seconds_at(2) is None
    assert "seconds" not in store.namespace("search", {"k": 2}).load()[2]


def test_checkpoint_key_separates_settings(tmp_path):
    """Another selection ratio or other calibration windows is another search, never mixed up with this one."""
    store = ResultStore(tmp_path / "store")
    _search("orthorank", store, steps=2)
    m = tiny_model(layers=8)
    windows = torch.randint(1, 128, (6, 32), generator=torch.Generator().manual_seed(0))
    runner = StackRunner(m, windows, 2)
    search = SEARCH_METHODS["orthorank"]
    other = Checkpoint.open(store, runner, "orthorank", search.settings(SelectionConfig(ratio=0.5), None, 3))
    assert other.load() == {}
    runner2 = StackRunner(m, windows[:4], 2)
    same_sel = Checkpoint.open(store, runner2, "orthorank", search.settings(SelectionConfig(ratio=0.33), None, 3))
    assert same_sel.load() == {}


# -- a real `calibrate` process killed with SIGKILL at random moments ---------------------------------------------


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")


@pytest.fixture(scope="module")
def slow_setup(tmp_path_factory):
    """A tiny 10-layer model with the real tokenizer and a calibration file: a search of several seconds."""
    from orthorank.models.loading import embedded_gguf_path
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    root = tmp_path_factory.mktemp("resume")
    folder = root / "tiny10"
    m = tiny_model(layers=10, vocab_size=len(tok), pad_token_id=tok.eos_token_id, hidden_size=128,
                   intermediate_size=512)
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    text = root / "calib.txt"
    text.write_text(" ".join(f"Sentence {i} of the calibration text, about topic {i % 17}." for i in range(3000)))
    return folder, text


def _calibrate(folder, text, cwd, out, method="orthorank", extra=()):
    return [sys.executable, "-m", "orthorank.harness.cli.main", "calibrate", "--model", str(folder), "--method", method,
            "--sparsity", "0.3", "--calib-data", str(text), "--calib-samples", "8", "--seq-len", "64",
            "--threads", "1", "--measure-speed", "0", "--store", "store", "--json", out, *extra]


def _plan_body(path: Path) -> dict:
    plan = json.loads(path.read_text())
    for k in ("search_seconds", "search_resumed_steps"):
        plan["provenance"].pop(k)
    return plan


def _no_partial_files(folder: Path) -> None:
    """Every visible file is whole: plans and store entries parse (and entries match their checksum). A SIGKILL
    during a write can leave only a temporary `.part` file, which nothing reads."""
    from orthorank.harness.store import digest

    for p in folder.rglob("*.json"):
        body = json.loads(p.read_text())
        if p.name.startswith("e-"):
            assert body["sha256"] == digest(body["entries"], 64), p


def _kill_trials(slow_setup, tmp_path, trials, method):
    """`trials` times: start the command, SIGKILL it at a moment drawn uniformly over an uninterrupted run's wall
    time (imports, loading, the search, writing), then run it again; the plan must equal the uninterrupted one."""
    folder, text = slow_setup
    started = time.perf_counter()
    ref = subprocess.run(_calibrate(folder, text, tmp_path, "ref.json", method, ["--no-store"]), cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = _plan_body(tmp_path / "ref.json")
    rng = random.Random(1234)
    outcomes = []
    for trial in range(trials):
        work = tmp_path / f"t{trial}"
        work.mkdir()
        proc = subprocess.Popen(_calibrate(folder, text, work, "plan.json", method), cwd=work, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 1.0) * wall)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        stored = sorted(p.name for p in (work / "store").rglob("e-*.json")) if (work / "store").exists() else []
        _no_partial_files(work)
        if (work / "plan.json").exists():  # written whole or not at all
            json.loads((work / "plan.json").read_text())
        done = subprocess.run(_calibrate(folder, text, work, "plan.json", method, ["--overwrite"]), cwd=work,
                              env=_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert _plan_body(work / "plan.json") == expected, f"trial {trial}: resumed plan differs"
        _no_partial_files(work)
        outcomes.append({"killed": killed, "entries_kept": len(stored)})
    return outcomes


@pytest.mark.parametrize("method", ["orthorank"])
def test_calibrate_killed_at_random_moments_resumes_to_the_same_plan(slow_setup, tmp_path, method):
    _kill_trials(slow_setup, tmp_path, 3, method)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["orthorank", "sleb", "shortened-ppl"])
def test_calibrate_killed_ten_times(slow_setup, tmp_path, method):
    _kill_trials(slow_setup, tmp_path, 10, method)


def test_ctrl_c_says_what_was_kept_and_how_to_resume(slow_setup, tmp_path):
    folder, text = slow_setup
    # enough calibration windows that the search is still running when the signal arrives, however loaded the host
    # SIGINT at its default in the child: a suite started in the background (`cmd &`) hands its children an
    # ignored SIGINT, which Python then keeps ignoring
    proc = subprocess.Popen(_calibrate(folder, text, tmp_path, "plan.json", extra=["--calib-samples", "64"]),
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    store = tmp_path / "store" / "search"
    deadline = time.time() + 120
    while time.time() < deadline and not list(store.rglob("e-0000001-*.json")):  # wait for the first step
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.strip().splitlines() if "interrupted" in line]
    assert len(lines) == 1 and "run the same command again to resume" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "plan.json").exists()


# -- the store across code versions and concurrent processes (orthorank.harness.store.fill) ---------------------------------

def _square(log: list | None = None):
    def compute(idx):
        if log is not None:
            log.append(list(idx))
        return {i: {"v": float(i * i) + 0.5} for i in idx}
    return compute


def values_old(store):
    from orthorank.harness.store import fill

    return fill(store.namespace("perplexity", {"model": "m", "data": "d", "code": "old"}), range(10), _square(),
                chunk=2)


def test_refactor_keeps_stored_results_only_when_a_recomputed_sample_agrees(tmp_path):
    import warnings

    from orthorank.harness.store import ResultStore, fill

    store = ResultStore(tmp_path / "store")
    old = store.namespace("perplexity", {"model": "m", "data": "d", "code": "old"})
    fill(old, range(10), _square(), chunk=2)
    # same key, new code, same numbers: only the first and last chunks are recomputed, the rest carried over
    log: list = []
    new = store.namespace("perplexity", {"model": "m", "data": "d", "code": "new"})
    values = fill(new, range(10), _square(log), chunk=2)
    assert log == [[0, 1], [8, 9]] and values == fill(old, range(10), _square(), chunk=2)
    carried = json.loads((new.folder / "carried.json").read_text())
    assert carried["from_code"] == "old" and carried["checked"] == [0, 1, 8, 9] and carried["entries"] == 6
    assert fill(new, range(10), _square(log), chunk=2) == values and len(log) == 2  # read back, nothing computed
    # new code that changes the numbers: everything is recomputed, nothing carried
    log.clear()

    def changed(idx):
        log.append(list(idx))
        return {i: {"v": float(i * i) + 0.75} for i in idx}

    other = store.namespace("perplexity", {"model": "m", "data": "d", "code": "newer"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = fill(other, range(10), changed, chunk=2)
    assert any("differ" in str(w.message) for w in caught)  # from both earlier versions
    assert sorted(map(tuple, log)) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)] and values[4] == {"v": 16.75}
    assert not (other.folder / "carried.json").exists()
    # a key that already computed some chunks checks against those and computes nothing more
    log.clear()
    part = store.namespace("perplexity", {"model": "m", "data": "d", "code": "newest"})
    fill(part, range(4), _square(log), chunk=2)  # carried too: its two chunks are the checks
    assert fill(part, range(10), _square(log), chunk=2) == values_old(store) and len(log) == 2
    # another key (other data) never borrows
    log.clear()
    fill(store.namespace("perplexity", {"model": "m", "data": "e", "code": "new"}), range(4), _square(log), chunk=2)
    assert len(log) == 2


def test_a_claimed_chunk_is_left_to_its_live_holder_and_taken_over_from_a_dead_one(tmp_path):
    import os

    from orthorank.harness.store import ResultStore, fill

    ns = ResultStore(tmp_path / "store").namespace("perplexity", {"model": "m"})
    held = ns.claim([0, 1])
    assert held is not None and ns.claim([0, 1]) is None  # this process is alive: held
    held.unlink()
    # a claim written by a process that is gone (a pid that does not exist here)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (ns.folder / "c-0000000-0000001.claim").write_text(json.dumps(
        {"pid": int(dead.stdout), "host": __import__("socket").gethostname(), "time": 0}))
    log: list = []
    assert fill(ns, range(4), _square(log), chunk=2)[1] == {"v": 1.5} and sorted(map(tuple, log)) == [(0, 1), (2, 3)]
    assert not list(ns.folder.glob("*.claim")) and os.path.isdir(ns.folder)


_CONCURRENT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from orthorank.harness.store import ResultStore, fill
log = open(sys.argv[3], "a")
def compute(idx):
    log.write(json.dumps(idx) + "\n"); log.flush()
    time.sleep(0.15)
    return {i: {"v": float(i * i)} for i in idx}
ns = ResultStore(sys.argv[2]).namespace("perplexity", {"model": "shared"})
print(json.dumps(fill(ns, range(24), compute, chunk=2)))
"""


def test_two_processes_on_one_store_split_the_work_and_agree(tmp_path):
    src = str(Path(__file__).resolve().parents[2] / "src")
    script = tmp_path / "worker.py"
    script.write_text(_CONCURRENT)
    procs = [subprocess.Popen([sys.executable, str(script), src, str(tmp_path / "store"), str(tmp_path / f"log{k}")],
                              stdout=subprocess.PIPE, text=True) for k in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert json.loads(outs[0]) == json.loads(outs[1]) and len(json.loads(outs[0])) == 24
    computed = [tuple(json.loads(line)) for k in range(2) for line in (tmp_path / f"log{k}").read_text().splitlines()]
    assert sorted(computed) == [(i, i + 1) for i in range(0, 24, 2)]  # every chunk once, by one of the two
    assert all((tmp_path / f"log{k}").read_text() for k in range(2))  # and both did some of it
    assert not list((tmp_path / "store").rglob("*.claim")) and not list((tmp_path / "store").rglob("*.part"))


# -- `compare` and `longctx` killed with SIGKILL at random moments --------------------------------------------------

def _plans_for(folder: Path, work: Path) -> Path:
    from orthorank.method.plan import Plan

    plans = work / "plans"
    plans.mkdir(exist_ok=True)
    sig = {"num_layers": 10}
    Plan("prune", [4, 7], folder.name, sig).save(plans / "sleb-0.2.json", overwrite=True)
    Plan("orthorank", [3, 5, 7], folder.name, sig, selection=SelectionConfig(ratio=0.4)).save(
        plans / "orthorank-0.2.json", overwrite=True)
    return plans


def _compare_cmd(folder, text, work):
    return [sys.executable, "-m", "orthorank.harness.cli.main", "compare", "--model", str(folder), "--methods",
            "dense,sleb,orthorank", "--sparsity", "0.2", "--plans-dir", str(_plans_for(folder, work)), "--datasets",
            str(text), "--seq-len", "64", "--max-windows", "24", "--threads", "1", "--store", "store", "--out", "out",
            "--overwrite"]


def _compare_result(work):
    rows = json.loads((work / "out" / "compare.json").read_text())["rows"]
    return [(r["method"], next(v["window_nll"] for k, v in r.items() if isinstance(v, dict) and "window_nll" in v))
            for r in rows]


def _longctx_cmd(folder, text, work):
    return [sys.executable, "-m", "orthorank.harness.cli.main", "longctx", "--model", str(folder), "--methods",
            "dense,sleb,orthorank", "--sparsity", "0.2", "--plans-dir", str(_plans_for(folder, work)), "--decode-modes",
            "dense", "--tasks", "niah_single", "--lengths", "256", "--samples", "8", "--batch-size", "2",
            "--threads", "1", "--store", "store", "--out", "out", "--overwrite"]


def _longctx_result(work):
    return json.loads((work / "out" / "longctx.json").read_text())["items"]


def _kill_command_trials(slow_setup, tmp_path, trials, command, result):
    """As _kill_trials, for an evaluation command: SIGKILL at a uniform moment of an uninterrupted run, rerun,
    and the results must equal the uninterrupted run's; nothing visible is half-written."""
    folder, text = slow_setup
    ref = tmp_path / "ref"
    ref.mkdir()
    started = time.perf_counter()
    done = subprocess.run(command(folder, text, ref), cwd=ref, env=_env(), capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    expected = result(ref)
    rng = random.Random(4321)
    outcomes = []
    for trial in range(trials):
        work = tmp_path / f"t{trial}"
        work.mkdir()
        proc = subprocess.Popen(command(folder, text, work), cwd=work, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 1.0) * wall)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        _no_partial_files(work)
        kept = len(list((work / "store").rglob("e-*.json"))) if (work / "store").exists() else 0
        again = subprocess.run(command(folder, text, work), cwd=work, env=_env(), capture_output=True, text=True,
                               timeout=600)
        assert again.returncode == 0, again.stderr[-2000:]
        assert result(work) == expected, f"trial {trial}: resumed results differ"
        _no_partial_files(work)
        assert not list(work.rglob("*.claim")), "a claim outlived its run"
        outcomes.append({"killed": killed, "entries_kept": kept})
    return outcomes


@pytest.mark.data
@pytest.mark.parametrize("command", ["compare", "longctx"])
def test_evaluations_killed_at_random_moments_resume_to_the_same_results(slow_setup, tmp_path, command):
    cmd, res = {"compare": (_compare_cmd, _compare_result), "longctx": (_longctx_cmd, _longctx_result)}[command]
    _kill_command_trials(slow_setup, tmp_path, 3, cmd, res)


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.parametrize("command", ["compare", "longctx"])
def test_evaluations_killed_ten_times(slow_setup, tmp_path, command):
    cmd, res = {"compare": (_compare_cmd, _compare_result), "longctx": (_longctx_cmd, _longctx_result)}[command]
    outcomes = _kill_command_trials(slow_setup, tmp_path, 10, cmd, res)
    print(f"{command}: {sum(o['killed'] for o in outcomes)} of 10 runs killed, all resumed to the same results")


# -- writes that are all or nothing ----------------------------------------------------------------------------------

def test_a_full_disk_or_an_unwritable_folder_is_one_line_and_keeps_the_earlier_file(tmp_path, monkeypatch):
    import errno

    from orthorank.errors import UserError
    from orthorank.harness.results import atomic_write_text, write_json

    target = tmp_path / "r.json"
    write_json(target, {"v": 1})
    before = target.read_text()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(UserError, match=f"cannot write {target}: No space left on device"):
        write_json(target, {"v": 2}, overwrite=True)
    monkeypatch.undo()
    assert target.read_text() == before and not list(tmp_path.glob("*.part"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match=f"cannot write {blocker / 'sub' / 'r.md'}"):
        atomic_write_text(blocker / "sub" / "r.md", "text")


def test_an_unwritable_output_folder_stops_a_command_with_one_line(tiny_hf_folder, tmp_path, capsys):
    from cli_helpers import assert_user_error

    text = tmp_path / "t.txt"
    text.write_text("Words to score, again and again. " * 100)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_user_error(capsys, "cannot write", "ppl", "--model", str(tiny_hf_folder), "--dataset", str(text),
                      "--seq-len", "32", "--max-windows", "1", "--json", str(blocker / "r.json"))
