"""`python -m orthorank.harness.cli.bench ...`: the bench subcommand alone, without importing the other commands (whose
optional dependencies a bare GPU machine may lack)."""

from __future__ import annotations

import os
import sys

from orthorank.harness.api.bench import run
from orthorank.harness.api.options import BenchOptions
from orthorank.harness.cli.parser import build
from orthorank.errors import UserError


def standalone(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build("orthorank", "orthorank bench alone", {"bench": BenchOptions})
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv])
    try:
        return int(run(BenchOptions.from_namespace(args)) or 0)
    except UserError as exc:
        print(f"orthorank bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(standalone())
