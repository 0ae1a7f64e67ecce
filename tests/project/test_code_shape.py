"""The package's import graph reads top-down: no folder imports one above it, no cycle, every folder placed
(tools/code_shape.py measures it and prints the numbers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "code_shape", Path(__file__).resolve().parents[2] / "tools" / "code_shape.py")
code_shape = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(code_shape)


def test_no_import_runs_back_up_the_layers_and_no_cycle():
    m = code_shape.measure()
    assert m["unplaced"] == [], f"folders or modules missing from LAYERS: {m['unplaced']}"
    assert m["arrows_back_up"] == [], "imports that run back up: " + ", ".join(
        f"{a} -> {b} ({n})" for a, b, n in m["arrows_back_up"])
    assert m["cycles"] == [], f"import cycles between folders: {m['cycles']}"


def test_the_measure_sees_an_arrow_back_up_and_a_cycle(tmp_path):
    pkg = tmp_path / "orthorank"
    for name, body in {"errors.py": "from orthorank.method import plan\n",
                       "method/__init__.py": "", "method/plan.py": "def f():\n    from orthorank import errors\n"}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(body)
    (pkg / "__init__.py").write_text("")
    m = code_shape.measure(pkg)
    assert m["arrows_back_up"] == [["errors", "method", 1]]
    assert m["cycles"] == [["errors", "method"]] and m["imports_inside_functions"] == 1


def test_every_module_a_stored_result_is_keyed_by_exists():
    """The result store keys each result kind by the code of named modules; a moved file would silently drop out
    of the key (its results then outliving a change to its code)."""
    from orthorank.harness import store

    root = Path(store.__file__).resolve().parents[1]  # the package: src/orthorank
    missing = sorted({rel for mods in store.NUMERIC_MODULES.values() for rel in mods if not (root / rel).is_file()})
    assert missing == [], f"NUMERIC_MODULES names files that do not exist: {missing}"



# Issue 56 landed in steps; each step could only lower these, and all are at their target now.
MOST_KIND_STRING_TESTS = 0
MOST_FLAGS_DECLARED_TWICE = 0
MOST_FILES_OVER_400_LINES = 0
MOST_FUNCTIONS_OVER_80_LINES = 0


def test_the_refactor_only_moves_forward():
    m = code_shape.measure()
    assert len(m["kind_string_tests"]) <= MOST_KIND_STRING_TESTS, (
        "new plan-kind string tests outside method/kinds/: ask the plan's kind (plan.kind) or the method registry "
        "instead")
    assert len(m["flags_declared_more_than_once"]) <= MOST_FLAGS_DECLARED_TWICE
    assert len(m["files_over_400_lines"]) <= MOST_FILES_OVER_400_LINES, (
        "files over 400 lines: " + ", ".join(f"{f['file']} ({f['lines']})" for f in m["files_over_400_lines"]))
    assert len(m["functions_over_80_lines"]) <= MOST_FUNCTIONS_OVER_80_LINES, (
        "functions over 80 lines: cut them into named phases: " + ", ".join(
            f"{f['function']} ({f['lines']})" for f in m["functions_over_80_lines"]))


def test_the_measure_sees_a_kind_test_a_repeated_flag_and_a_long_file(tmp_path):
    pkg = tmp_path / "orthorank"
    files = {
        "__init__.py": "",
        "harness/api/__init__.py": "", "harness/cli/__init__.py": "", "method/__init__.py": "", "method/kinds/__init__.py": "",
        "harness/api/options.py": 'from dataclasses import field\nx = field(default=1, metadata={"flag": "--ratio"})\n'
                          'a = flag("--seq-len", help="tokens")\nb = flag("--seq-len", help="tokens")\n'
                          'c = flag("--batch-size", help="windows")\nd = flag("--batch-size", help="prompts")\n',
        "harness/cli/ppl.py": 'def f(p):\n    p.add_argument("--ratio")\n    p.add_argument("--other")\n',
        "harness/api/run.py": 'def f(plan, method):\n    a = plan.method == "prune"\n    b = method in ("dense", "sleb")\n'
                      '    c = plan.kind.removes\n    return "x" + ("\\n" * 0) * 401\n' + "#\n" * 400,
        "method/kinds/prune.py": 'def f(plan):\n    return plan.method == "prune"\n',
    }
    for name, body in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(body)
    m = code_shape.measure(pkg)
    assert m["kind_string_tests"] == ["orthorank/harness/api/run.py:2", "orthorank/harness/api/run.py:3"]
    # --ratio: the CLI beside the options; --seq-len: the same declaration copied; --batch-size: two meanings
    assert m["flags_declared_more_than_once"] == ["--ratio", "--seq-len"]
    assert [f["file"] for f in m["files_over_400_lines"]] == ["orthorank/harness/api/run.py"]
