"""`orthorank` command line: parse, call the library function of the command (orthorank.api), report errors.
Each subcommand's options live in its own module here; what it does lives in orthorank.api."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from orthorank import distributed
from orthorank.api import JOBS, job
from orthorank.api.options import BY_COMMAND
from orthorank.errors import UserError
from orthorank.results import record_command

# One module per subcommand; each defines `add_parser(subparsers)`. Parsed options go to the command's function:
# the library's (orthorank.api.JOBS), and the study runner, which sits above the library it calls.
COMMAND_MODULES = [
    "orthorank.cli.ppl",
    "orthorank.cli.bench",
    "orthorank.cli.analyze",
    "orthorank.cli.selection_map",
    "orthorank.cli.calibrate",
    "orthorank.cli.fit_router",
    "orthorank.cli.compare",
    "orthorank.cli.zeroshot",
    "orthorank.cli.generate",
    "orthorank.cli.longctx",
    "orthorank.cli.frontier",
    "orthorank.cli.study",
]
COMMANDS = {**JOBS, "study": "orthorank.study.runner:run"}


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2, like every other bad input; --help has the rest."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="orthorank",
        description="OrthoRank token selection for decoder LLMs, measured against layer pruning.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    record_command(sys.argv[1:] if argv is None else argv)
    finished = False
    try:
        code = int(job(args.command, COMMANDS)(BY_COMMAND[args.command].from_namespace(args)) or 0)
        finished = True
        return code
    except UserError as exc:
        print(f"orthorank {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("orthorank: interrupted", file=sys.stderr)
        return 130
    finally:
        distributed.shutdown(wait=finished)


if __name__ == "__main__":
    sys.exit(main())
