"""One dialect across the subcommands: every option states its default in --help, every --help renders, old
spellings keep working for a release with one line on stderr, `ppl` takes saved plans like `zeroshot` and
`generate`, and the files a user names are read before the model loads."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from cli_helpers import run_cli
from orthorank.harness.cli.main import build_parser, main

FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction, argparse._VersionAction)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_states_its_default():
    missing = []
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if not action.option_strings or action.required or isinstance(action, FLAGS):
                continue
            if action.help is argparse.SUPPRESS:  # a deprecated alias, hidden from --help
                continue
            text = action.help or ""
            if re.search(r"\bdefault", text, re.IGNORECASE) or "required" in text.lower():
                continue
            missing.append(f"{name} {'/'.join(action.option_strings)} (default {action.default!r})")
    assert not missing, f"{len(missing)} options do not state their default:\n" + "\n".join(missing)


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_help_renders(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    assert out.startswith(f"usage: orthorank {command}") and not err, err
    assert "%%" not in out and "%(" not in out, out


# -- deprecated spellings --------------------------------------------------------------------------------------------

ALIASES = [  # command, the other arguments it needs, old spelling, new spelling, value
    ("bench", [], "--batch", "--batch-size", "1,2"),
    ("bench", [], "--decode-batch", "--decode-batch-size", "4"),
    ("calibrate", ["--method", "sleb"], "--out-dir", "--out", "plans/m"),
    ("calibrate", ["--method", "sleb"], "-o", "--json", "p.json"),
    ("calibrate", ["--method", "sleb"], "--output", "--json", "p.json"),
    ("fit-router", ["--plan", "p.json"], "--out", "--json", "r.json"),
    ("longctx", ["--out", "o"], "--decode", "--decode-modes", "dense"),
    ("longbench", ["--out", "o"], "--decode", "--decode-modes", "threshold"),
]


@pytest.mark.parametrize("command, extra, old, new, value", ALIASES)
def test_an_old_spelling_parses_as_the_new_one_with_one_note(capsys, command, extra, old, new, value):
    parser = build_parser()
    with_new = vars(parser.parse_args([command, *extra, new, value]))
    assert capsys.readouterr().err == ""
    with_old = vars(parser.parse_args([command, *extra, old, value]))
    assert with_old == with_new
    assert capsys.readouterr().err == f"orthorank: {old} is deprecated; use {new}\n"


@pytest.mark.parametrize("command, extra, old, new, value", ALIASES)
def test_old_spellings_are_hidden_from_help(command, extra, old, new, value):
    text = _subparsers()[command].format_help()
    assert new in text and not re.search(rf"(^|[\s\[(]){re.escape(old)}[\s\]=,]", text), text


def test_old_and_new_spelling_together_are_refused(capsys):
    code, out, err = run_cli(capsys, "calibrate", "--method", "sleb", "--out", "a", "--out-dir", "b")
    assert code == 2 and "not allowed with" in err.strip().splitlines()[-1], err


# -- ppl takes saved plans by --method and --sparsity ----------------------------------------------------------------


def _text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("Plain words for scoring a perplexity, again and again. " * 60)
    return path


def _save(path, model, layers):
    from orthorank.method.plan import Plan

    path.parent.mkdir(parents=True, exist_ok=True)
    Plan("prune", layers, model, {"num_layers": 4}, target_sparsity=0.25).save(path)


def test_ppl_runs_a_saved_plan_by_method_and_sparsity(capsys, tiny_hf_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = _text(tmp_path)
    _save(tmp_path / "plans" / tiny_hf_folder.name / "sleb-0.25.json", tiny_hf_folder.name, [1])
    _save(tmp_path / "mine" / "sleb-0.25.json", tiny_hf_folder.name, [2])
    common = ["ppl", "--model", tiny_hf_folder, "--dataset", text, "--seq-len", "32", "--max-windows", "2",
              "--threads", "1", "--method", "sleb", "--sparsity", "0.25"]
    code, out, err = run_cli(capsys, *common, "--json", "a.json")
    assert code == 0, err
    plan = json.loads((tmp_path / "a.json").read_text())["plan"]
    assert plan["method"] == "prune" and plan["layers"] == [1]
    code, out, err = run_cli(capsys, *common, "--plans-dir", "mine", "--json", "b.json")
    assert code == 0, err
    assert json.loads((tmp_path / "b.json").read_text())["plan"]["layers"] == [2]


@pytest.mark.parametrize("extra, fragment", [
    (["--method", "sleb", "--sparsity", "0.1"], "no sleb plan at sparsity 0.1"),
    (["--method", "sleb", "--sparsity", "0.25", "--plans-dir", "none"], "no sleb plan at sparsity 0.25 in none"),
    (["--method", "sleb", "--sparsity", "0.25", "--plans-dir", "broken"], "is not valid JSON"),
    (["--method", "sleb"], "needs --sparsity S (a saved plan), --plan FILE"),
    (["--method", "dense", "--sparsity", "0.25"], "--method dense takes no --sparsity"),
])
def test_ppl_plan_errors_are_one_line_before_the_model_loads(capsys, tiny_hf_folder, tmp_path, monkeypatch, extra,
                                                            fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "sleb-0.25.json").write_text("{not json")
    code, out, err = run_cli(capsys, "ppl", "--model", tiny_hf_folder, "--dataset", _text(tmp_path), *extra)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0], err
    assert "loaded " not in err and "Traceback" not in err


# -- files named on the command line are read before the model loads -------------------------------------------------


def test_named_files_are_read_before_the_model_loads(capsys, tiny_hf_folder, tmp_path, monkeypatch):
    from orthorank.method.plan import Plan
    from orthorank.method.selection import SelectionConfig

    monkeypatch.chdir(tmp_path)
    text = _text(tmp_path)
    plan = tmp_path / "o.json"
    Plan("orthorank", [1, 2], tiny_hf_folder.name, {"num_layers": 4}, selection=SelectionConfig(ratio=0.4)).save(plan)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "sleb-0.2.json").write_text("{not json")
    model = ["--model", tiny_hf_folder, "--threads", "1"]
    cases = [
        (["fit-router", *model, "--plan", plan, "--json", "r.json", "--calib-data", text, "--match-compute-of",
          "none.json"], "plan file none.json does not exist"),
        (["calibrate", *model, "--method", "orthorank-ratios", "--sparsity", "0.25", "--policy", "router",
          "--router", "none.json", "--calib-data", text, "--out", "p"], "plan file none.json does not exist"),
        (["compare", *model, "--methods", "dense,sleb", "--sparsity", "0.2", "--plans-dir", "empty",
          "--datasets", text, "--out", "c"], "no sleb plan at sparsity 0.2 in empty"),
        (["compare", *model, "--methods", "dense,sleb", "--sparsity", "0.2", "--plans-dir", "broken",
          "--datasets", text, "--out", "c"], "is not valid JSON"),
        (["longctx", *model, "--methods", "dense,sleb", "--sparsity", "0.2", "--plans-dir", "broken",
          "--out", "l"], "is not valid JSON"),
        (["generate", *model, "--prompt", "hello", "--method", "sleb", "--sparsity", "0.2", "--plans-dir",
          "broken"], "is not valid JSON"),
    ]
    for argv, fragment in cases:
        code, out, err = run_cli(capsys, *argv)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and lines and fragment in lines[-1], (argv[0], err)
        assert "loaded " not in err and "Traceback" not in err, (argv[0], err)


def test_fit_routers_switch_is_not_named_like_the_ratio_and_the_old_name_still_works(capsys):
    parser = build_parser()
    new = vars(parser.parse_args(["fit-router", "--plan", "p.json", "--json", "r.json", "--no-rematch"]))
    assert new["keep_ratio"] is True and capsys.readouterr().err == ""
    old = vars(parser.parse_args(["fit-router", "--plan", "p.json", "--json", "r.json", "--keep-ratio"]))
    assert old == new
    assert capsys.readouterr().err == "orthorank: --keep-ratio is deprecated; use --no-rematch\n"
