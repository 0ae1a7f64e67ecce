"""`orthorank` command line: parse, call the library function of the command (orthorank.harness.api), report errors.
The parsers are built from each command's typed options (harness/cli/parser.py); what a command does lives in orthorank.harness.api,
and the study, which sits above the library it calls, in orthorank.harness.study."""

from __future__ import annotations

import argparse
import os
import sys

from orthorank.harness import distributed
from orthorank.harness.api import JOBS, job
from orthorank.harness.api.options import BY_COMMAND, Options
from orthorank.harness.cli.parser import build
from orthorank.errors import UserError
from orthorank.harness.results import record_command
from orthorank.harness.study.options import StudyOptions

# Each command's options and the function its parsed options go to: the library's (orthorank.harness.api.JOBS), and the
# study runner.
OPTIONS: dict[str, type[Options]] = {**BY_COMMAND, StudyOptions.command: StudyOptions}
COMMANDS = {**JOBS, StudyOptions.command: "orthorank.harness.study.runner:run"}


def build_parser() -> argparse.ArgumentParser:
    return build("orthorank", "OrthoRank token selection for decoder LLMs, measured against layer pruning.", OPTIONS)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    record_command(sys.argv[1:] if argv is None else argv)
    finished = False
    try:
        code = int(job(args.command, COMMANDS)(OPTIONS[args.command].from_namespace(args)) or 0)
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
