"""Bad input found by probing the commands as a user would: each case is one line on stderr and exit 2, caught
before a model loads where the input alone decides it, and no user file is replaced without --overwrite."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_user_error, run_cli
from orthorank.harness.cli.main import main


def _usage_error(capsys, fragment: str, *argv) -> None:
    """An argparse-level error: exit 2 and exactly one line, naming the command's --help."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"orthorank {argv[0]}: error:"), err
    assert fragment in lines[0] and "--help" in lines[0], err


@pytest.mark.parametrize("argv, fragment", [
    (["compare", "--seq-len", "0", "--out", "x"], "--seq-len"),
    (["compare", "--measure-speed", "-1", "--out", "x"], "--measure-speed"),
    (["bench", "--warmup", "-1"], "--warmup"),
    (["study", "--budget", "bogus", "--out", "x"], "--budget"),
    (["selection-map", "--max-tokens", "0", "--out", "x"], "--max-tokens"),
])
def test_usage_errors_are_one_line(capsys, argv, fragment):
    _usage_error(capsys, fragment, *argv)


def test_study_names_no_stage(capsys, tiny_hf_folder, tmp_path):
    for stages in (",", " "):
        assert_user_error(capsys, "names no stage", "study", "--model", tiny_hf_folder, "--out", tmp_path / "s",
                          "--stages", stages)
    assert not (tmp_path / "s").exists()


def _study(folder, model="m"):
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"model": model, "claims": [], "budget_caption": "budget test"}))
    return folder


def test_summary_of_broken_studies(capsys, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "study.json").write_text("{not json")
    assert_user_error(capsys, "cannot read", "study", "--out", tmp_path / "sum", "--summary", bad)
    (bad / "study.json").write_text("{}")
    assert_user_error(capsys, "is not a study written by `orthorank study`", "study", "--out", tmp_path / "sum",
                      "--summary", bad)
    (bad / "study.json").write_text("[1, 2]")
    assert_user_error(capsys, "is not a study", "study", "--out", tmp_path / "sum", "--summary", bad)
    assert not (tmp_path / "sum").exists()


def test_summary_out_and_overwrite(capsys, tmp_path):
    ok = _study(tmp_path / "ok")
    a_file = tmp_path / "existing.txt"
    a_file.write_text("mine")
    assert_user_error(capsys, "is a file, not a folder", "study", "--out", a_file, "--summary", ok)
    assert a_file.read_text() == "mine"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.md").write_text("my notes")
    assert_user_error(capsys, "pass --overwrite", "study", "--out", mine, "--summary", ok)
    assert (mine / "summary.md").read_text() == "my notes"
    assert run_cli(capsys, "study", "--out", mine, "--summary", ok, "--overwrite")[0] == 0
    assert "Claims x models" in (mine / "summary.md").read_text()
    # a folder an earlier summary wrote is the summary's own: the next summary replaces it
    ok2 = _study(tmp_path / "ok2", "m2")
    assert run_cli(capsys, "study", "--out", mine, "--summary", ok, ok2)[0] == 0
    assert json.loads((mine / "summary.json").read_text())["models"] == ["m", "m2"]


def test_calibrate_refuses_sparsity_zero(capsys, tiny_hf_folder, tmp_path):
    for method in ("sleb", "orthorank"):
        code, out, err = run_cli(capsys, "calibrate", "--model", tiny_hf_folder, "--method", method, "--sparsity", "0",
                                 "--out", tmp_path / "p")
        assert code == 2 and "--sparsity 0 changes no layer" in err.strip().splitlines()[-1], err
        assert "loaded " not in err  # refused before the model loads


@pytest.mark.parametrize("command", ["longctx", "longbench", "selection-map"])
def test_decode_modifier_refused_where_it_would_be_dropped(capsys, tiny_hf_folder, tmp_path, command):
    code, out, err = run_cli(capsys, command, "--model", tiny_hf_folder, "--out", tmp_path / "o", "--methods" if
                             command != "selection-map" else "--method", "dense" if command != "selection-map"
                             else "orthorank", "--policies", "orthogonal+decode=threshold",
                             *(["--data-dir", tmp_path] if command == "longbench" else []))
    if command == "longbench":  # no task files there: refused for that first, also before loading
        assert code == 2 and "loaded " not in err, err
        return
    assert code == 2 and "without +decode=" in err.strip().splitlines()[-1], err
    assert "loaded " not in err


def test_longctx_bad_decode_before_loading(capsys, tiny_hf_folder, tmp_path):
    code, out, err = run_cli(capsys, "longctx", "--model", tiny_hf_folder, "--out", tmp_path / "o", "--methods",
                             "dense", "--decode-modes", "fast")
    assert code == 2 and "unknown decode policy 'fast'" in err and "loaded " not in err, err


def test_selection_map_defaults_to_orthorank_and_checks_prompts_first(capsys, tiny_hf_folder, tmp_path):
    code, out, err = run_cli(capsys, "selection-map", "--model", tiny_hf_folder, "--out", tmp_path / "m",
                             "--sparsity", "0.2")
    assert code == 2 and "dense" not in err.strip().splitlines()[-1], err
    code, out, err = run_cli(capsys, "selection-map", "--model", tiny_hf_folder, "--out", tmp_path / "m",
                             "--layers", "1", "--prompts", "bogus:1")
    assert code == 2 and "unknown prompt 'bogus:1'" in err and "loaded " not in err, err


@pytest.mark.parametrize("command, extra", [
    ("compare", ["--methods", "dense", "--datasets", "wikitext2"]),
    ("longctx", ["--methods", "dense"]),
    ("selection-map", ["--layers", "1"]),
])
def test_out_under_a_file_is_refused_before_work(capsys, tiny_hf_folder, tmp_path, command, extra):
    a_file = tmp_path / "existing.txt"
    a_file.write_text("mine")
    code, out, err = run_cli(capsys, command, "--model", tiny_hf_folder, "--out", a_file, *extra)
    assert code == 2 and "is a file, not a folder" in err.strip().splitlines()[-1], err
    assert "loaded " not in err and a_file.read_text() == "mine"
