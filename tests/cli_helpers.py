"""Running the CLI in-process and checking its one-line user errors (shared by the CLI test files)."""

from __future__ import annotations

from orthorank.harness.cli.main import main


def run_cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # a usage error (argparse) exits from inside parse_args, one line on stderr
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(capsys, fragment, *argv, prefix: str = "orthorank "):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (code, out, err)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines and "Traceback" not in err, err
    assert lines[-1].startswith(prefix), err
    assert fragment in lines[-1], lines[-1]
