"""The library's typed options (orthorank.harness.api.options) against the CLI's parsers: same names, same defaults, and a
command line written from options parses back to the same options. The study builds these options from its budget
and calls the library with them; the CLI fills them from a command line."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from orthorank.harness.api import JOBS, job
from orthorank.harness.api.options import BY_COMMAND, CompareOptions, FitRouterOptions, BenchOptions
from orthorank.harness.cli.main import COMMANDS, OPTIONS, build_parser
from orthorank.harness.cli.parser import DeprecatedAlias
from orthorank.harness.study.options import StudyOptions


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _minimal(sp: argparse.ArgumentParser) -> list[str]:
    argv = []
    for a in sp._actions:
        if a.required:
            argv += [a.option_strings[0], a.choices[0] if a.choices else "X"]
    for g in sp._mutually_exclusive_groups:
        if g.required:
            argv += [g._group_actions[0].option_strings[0], "X"]
    return argv


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_options_have_the_parsers_names_and_defaults(command):
    sp = _subparsers()[command]
    actions = [a for a in sp._actions if not isinstance(a, (argparse._HelpAction, DeprecatedAlias))]
    kind = OPTIONS[command]
    assert {f.name for f in dataclasses.fields(kind)} == {a.dest for a in actions}, command
    minimal = _minimal(sp)
    namespace = sp.parse_args(minimal)
    given = {a.dest for a in actions if a.option_strings[0] in minimal}
    for f in dataclasses.fields(kind):
        if f.name in given:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert default == getattr(namespace, f.name), (command, f.name)
        flag = next(s for s in next(a for a in actions if a.dest == f.name).option_strings if s.startswith("--"))
        assert f.metadata["flag"] == flag, (command, f.name)
    assert command in COMMANDS and callable(job(command, COMMANDS))


@pytest.mark.parametrize("options", [
    CompareOptions(model="llama-tiny", dtype="bfloat16", threads=2, methods="dense,sleb", sparsity="0.2",
                   seq_len=64, max_windows=2, ablations=True, no_store=True, out="x", overwrite=True),
    FitRouterOptions(plan="p.json", json_out="r.json", targets="update", iterations=1, calib_samples=4),
    BenchOptions(methods=["dense", "sleb"], mode=["prefill", "decode"], seq_len=[64, 128], plan=["a", "b"],
                 sparsity=0.1, json_out="b.json"),
    StudyOptions(out="s", summary=["a", "b"], budget="test"),
])
def test_options_write_the_command_line_that_parses_back_to_them(options):
    argv = options.argv()
    namespace = build_parser().parse_args(argv)
    assert namespace.command == options.command
    assert type(options).from_namespace(namespace) == options


def test_every_library_job_is_one_the_cli_dispatches():
    assert set(JOBS) == set(BY_COMMAND) and set(COMMANDS) == set(OPTIONS) == {*BY_COMMAND, "study"}


def test_the_study_calls_the_library_not_the_cli(monkeypatch, tmp_path):
    """A stage hands typed options to orthorank.harness.api.call (no command line is built or parsed between them), and a
    bad input inside a stage stops the stage with the command's one-line reason."""
    from orthorank.harness import api
    from orthorank.errors import UserError
    from orthorank.harness.study.budgets import get_budget
    from orthorank.harness.study.context import StudyContext
    from orthorank.harness.study.stages import STAGES, run_stage

    seen = []

    def fake_call(options):
        seen.append(options)
        raise UserError("no such plan")

    monkeypatch.setattr(api, "call", fake_call)
    ctx = StudyContext("m", "m", tmp_path / "s", get_budget("test"), {"model": "m", "dtype": "float32"}, None,
                       None, tmp_path, log=lambda m: None)
    sink = next(s for s in STAGES if s.name == "sink")
    with pytest.raises(UserError, match="stage sink stopped: orthorank analyze: no such plan"):
        run_stage(ctx, sink)
    assert [type(o).__name__ for o in seen] == ["AnalyzeOptions"] and seen[0].model == "m"
