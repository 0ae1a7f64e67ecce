"""Random argument combinations for every subcommand (hypothesis): the only outcomes allowed are exit 0, or exit 2
with a one-line error as the last line of stderr. Never a traceback, never another exception.

Values are drawn from small pools mixing valid and invalid ones (negative and zero counts, words for numbers,
missing files, unknown names), on a tiny random model, so each run takes about a second. `--slow` draws more.
"""

from __future__ import annotations

import contextlib
import io
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orthorank.harness.cli.main import main

NUM = ["0", "1", "2", "-1", "abc", "1.5", "nan", ""]
SMALL = ["1", "2", "0", "-3", "x"]
RATIO = ["0.3", "1.0", "0", "1.5", "-0.2", "nan", "a"]
SPARSITY = ["0.2", "0.1,0.2", "0.9", "1.0", "-0.1", "x", ""]
POLICY = ["orthogonal", "norm", "oracle", "random", "nope", "prev-update"]
VARIANTS = ["norm", "orthogonal+recent=4", "oracle", "nope", "norm+recent", "+first=2"]

# per subcommand: flags that are always there (with {tmp} and {model} filled in) and flags drawn from pools
COMMANDS: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "ppl": (["--model", "{model}", "--dataset", "{text}"], {
        "--seq-len": ["32", "1", "0", "-5", "abc"], "--max-windows": SMALL, "--batch-size": SMALL,
        "--method": ["dense", "orthorank", "prune", "sleb", "bogus"], "--layers": ["1", "1,2", "9", "a", ""],
        "--sparsity": SPARSITY, "--ratio": RATIO, "--policy": POLICY, "--keep-recent": SMALL,
        "--plan": ["{tmp}/none.json", "{text}"],
        "--dataset": ["{text}", "{tmp}/none.txt", "nope"], "--dtype": ["float32", "float64", "x"]}),
    "bench": (["--model", "{model}", "--repeats", "1", "--warmup", "0"], {
        "--seq-len": ["16", "0", "-1", "x"], "--batch-size": ["1", "1,2", "0", "x"],
        "--methods": ["dense", "dense,spread-prune", "bogus", ""], "--sparsity": SPARSITY, "--ratio": RATIO,
        "--mode": ["prefill", "decode", "layer", "bogus"], "--json": ["{tmp}/b.json", "{tmp}"]}),
    "analyze": (["--model", "{model}", "--out", "{tmp}/a"], {
        "--text": ["some words here and there", "", "  ", "x"], "--seq-len": ["16", "1", "0", "x"],
        "--samples": SMALL, "--ratio": RATIO, "--sample-tokens": SMALL,
        "--selection-map": ["{tmp}/none.json", "{text}"], "--compare-json": ["{tmp}/none.json", "{text}"]}),
    "selection-map": (["--model", "{model}", "--out", "{tmp}/m"], {
        "--plan": ["{plan}", "{tmp}/none.json", "{text}"], "--prompts": ["needle:256", "needle:x", "bogus:1",
                                                                         "needle:256:0-1", "needle:256:3-1", ""],
        "--policies": VARIANTS, "--method": ["orthorank", "hybrid"], "--sparsity": SPARSITY}),
    "calibrate": (["--model", "{model}", "--calib-data", "{text}", "--calib-samples", "2", "--seq-len", "16"], {
        "--method": ["sleb", "orthorank", "shortgpt", "orthorank-ratios", "hybrid", "bogus"],
        "--sparsity": SPARSITY, "--out": ["{tmp}/p"], "--json": ["{tmp}/p.json"], "--ratio": RATIO,
        "--ratios": ["0.25,0.5", "0", "x"], "--policy": POLICY, "--calib-tokens": ["32", "8K", "0", "x"],
        "--calib-data": ["{text}", "{tmp}/none.txt", "mix:nope", "bogus"], "--screen-fraction": RATIO}),
    "fit-router": (["--model", "{model}", "--plan", "{plan}", "--json", "{tmp}/r.json", "--calib-data", "{text}",
                    "--calib-samples", "4", "--seq-len", "16", "--no-store"], {
        "--plan": ["{plan}", "{tmp}/none.json", "{text}"], "--targets": ["update", "nope", "", "update,fisher"],
        "--alphas": ["1,10", "0", "x", ""], "--iterations": SMALL, "--layers": ["inner", "1", "x", "9"],
        "--match-compute-of": ["{plan}", "{tmp}/none.json"], "--calib-samples": SMALL, "--cost-seq-len": SMALL}),
    "fit-thresholds": (["--model", "{model}", "--plan", "{plan}", "--out", "{tmp}/t.json", "--calib-data", "{text}",
                        "--calib-samples", "2", "--seq-len", "16"], {
        "--plan": ["{plan}", "{tmp}/none.json", "{text}"], "--calib-data": ["{text}", "{tmp}/none.txt", "bogus"],
        "--calib-samples": SMALL, "--seq-len": ["16", "0", "x"], "--batch-size": SMALL, "--keep": RATIO}),
    "match-speed": (["--model", "{model}", "--plan", "{plan}", "--to", "{plan}", "--out", "{tmp}/s.json",
                     "--seq-len", "16", "--repeats", "1", "--max-probes", "2"], {
        "--plan": ["{plan}", "{tmp}/none.json", "{text}"], "--to": ["{plan}", "{tmp}/none.json", "{text}"],
        "--min-ratio": RATIO, "--repeats": SMALL, "--max-probes": SMALL, "--seq-len": ["16", "0", "x"]}),
    "compare": (["--model", "{model}", "--out", "{tmp}/c", "--seq-len", "32", "--max-windows", "2", "--no-store"], {
        "--methods": ["dense", "dense,sleb", "bogus", ""], "--sparsity": SPARSITY,
        "--datasets": ["{text}", "{tmp}/none.txt", "bogus"], "--plans-dir": ["{tmp}", "{tmp}/none"],
        "--policies": VARIANTS, "--batch-size": SMALL, "--seq-len": ["32", "1", "0"]}),
    "zeroshot": (["--model", "{model}", "--limit", "2"], {
        "--tasks": ["piqa", "bogus", ""], "--method": ["dense", "orthorank", "bogus"], "--layers": ["1", "x"],
        "--limit": SMALL, "--batch-size": SMALL, "--sparsity": SPARSITY}),
    "generate": (["--model", "{model}", "--max-new-tokens", "2"], {
        "--prompt": ["hello", "", "a b c"], "--file": ["{text}", "{tmp}/none.txt"],
        "--max-new-tokens": ["2", "0", "-1", "x"], "--method": ["dense", "orthorank", "prune"],
        "--layers": ["1", "1,2", "9", "x"], "--ratio": RATIO, "--batch-size": SMALL, "--decode": ["dense", "bogus"]}),
    "longctx": (["--model", "{model}", "--out", "{tmp}/l", "--samples", "1", "--lengths", "256", "--no-store",
                 "--tasks", "niah_single", "--methods", "dense"], {
        "--methods": ["dense", "dense,sleb", "bogus"], "--lengths": ["256", "1k", "x", "10"],
        "--tasks": ["niah_single", "bogus", ""], "--samples": SMALL, "--policies": VARIANTS,
        "--plans-dir": ["{tmp}/none"], "--decode-modes": ["dense", "threshold", "bogus"]}),
    "longbench": (["--model", "{model}", "--out", "{tmp}/lb", "--limit", "1", "--no-store", "--methods", "dense",
                   "--tasks", "multi_news"], {
        "--tasks": ["multi_news", "bogus"], "--limit": SMALL, "--data-dir": ["{tmp}/none", "{tmp}"],
        "--max-length": ["64", "0", "x"], "--policies": VARIANTS}),
    "frontier": (["--model", "{model}", "--out", "{tmp}/f", "--samples", "1", "--lengths", "256", "--no-store",
                  "--tasks", "niah_single", "--methods", "dense", "--repeats", "2"], {
        "--methods": ["dense", "dense,progressive", "dense,sleb", "bogus", "dense,hybrid"],
        "--levels": ["0.2", "0.1,0.2", "x", "1.5", ""], "--lengths": ["256", "x", "10"],
        "--tails": ["0,8", "x", "5", ""], "--policies": VARIANTS, "--repeats": ["2", "1", "0", "x"],
        "--schedule-start": ["0.5", "1.5", "x"], "--plans-dir": ["{tmp}/none"]}),
    "study": (["--model", "{model}", "--out", "{tmp}/s"], {
        "--budget": ["bogus", "quick"], "--stages": ["bogus", "sink,bogus", ""], "--summary": ["{tmp}/none"]}),
}

# study runs whole stages: only its argument checks are fuzzed (every draw has a bad --stages or --summary)
STUDY_REQUIRES = ("--stages", "--summary")


def _fill(value: str, paths: dict[str, str]) -> str:
    for k, v in paths.items():
        value = value.replace("{" + k + "}", v)
    return value


@st.composite
def argvs(draw, command: str):
    fixed, pools = COMMANDS[command]
    names = draw(st.lists(st.sampled_from(sorted(pools)), max_size=4, unique=True))
    if command == "study" and not any(n in STUDY_REQUIRES for n in names):
        names.append("--stages")
    argv = list(fixed)
    for name in names:
        argv += [name, draw(st.sampled_from(pools[name]))]
    if command == "study" and "--summary" not in names:
        i = argv.index("--stages")
        if argv[i + 1] not in ("bogus", "sink,bogus"):
            argv[i + 1] = "bogus"
    return argv


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


@pytest.fixture(scope="module")
def fuzz_paths(tiny_hf_folder, tmp_path_factory):
    from orthorank.method.plan import Plan
    from orthorank.method.selection import SelectionConfig

    root = tmp_path_factory.mktemp("fuzz")
    text = root / "text.txt"
    text.write_text("Plain words for scoring and calibrating, again and again. " * 100)
    plan = root / "plan.json"
    Plan("orthorank", [1, 2], tiny_hf_folder.name, {"num_layers": 4}, selection=SelectionConfig(ratio=0.4)).save(plan)
    return {"model": str(tiny_hf_folder), "text": str(text), "plan": str(plan)}


def _check(command: str, argv: list[str], paths: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        full = [command] + [_fill(a, {**paths, "tmp": tmp}) for a in argv] + ["--threads", "1"]
        code, err = _run(full)
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("Loading", "loaded "))]
        assert "Traceback" not in err, (full, err[-3000:])
        assert code in (0, 2), (full, code, err[-3000:])
        if code == 2:
            assert lines and "error" in lines[-1], (full, err[-2000:])


def _fuzz(command: str, fuzz_paths, draws: int) -> None:
    @settings(max_examples=draws, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(argv=argvs(command))
    def check(argv):
        _check(command, argv, fuzz_paths)

    check()


@pytest.mark.data
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_arguments_give_exit_0_or_a_one_line_error(command, fuzz_paths):
    _fuzz(command, fuzz_paths, 5)


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_arguments_many(command, fuzz_paths):
    _fuzz(command, fuzz_paths, 40)


def test_every_subcommand_is_fuzzed():
    from orthorank.harness.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS), set(sub.choices) ^ set(COMMANDS)

