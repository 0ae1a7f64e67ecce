"""The command line, built from the typed options: every flag is a field of its command's options class, and its
metadata (harness/api/options/base.py `flag`) is all argparse needs. Nothing here names a flag."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, Field, fields
from typing import Any

from orthorank.harness.api.options import Options, comma_list
from orthorank.harness.api.options.groups import SECTIONS


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2, like every other bad input; --help has the rest."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class DeprecatedAlias(argparse.Action):
    """An old spelling of another option: one line on stderr, then exactly what the new spelling does."""

    def __init__(self, option_strings, dest, target: argparse.Action | None = None, new: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.target, self.new = target, new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"orthorank: {option_string} is deprecated; use {self.new}", file=sys.stderr, flush=True)
        self.target(parser, namespace, values, option_string)


def deprecated(parser: argparse.ArgumentParser, new: str, *old: str) -> None:
    """Keep the `old` spellings of the option `new` working for one release: same value, same destination, hidden
    from --help, and one line on stderr naming the new spelling. An old spelling joins the mutually exclusive group
    of the new one, so a required group is satisfied by either."""
    target = parser._option_string_actions[new]
    container = next((g for g in parser._mutually_exclusive_groups if target in g._group_actions), parser)
    container.add_argument(*old, dest=target.dest, action=DeprecatedAlias, target=target, new=new,
                           nargs=target.nargs, const=target.const, type=target.type, choices=target.choices,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _argument(f: Field) -> dict[str, Any]:
    """argparse's keywords for one option field."""
    md = f.metadata
    kw: dict[str, Any] = {"dest": f.name, "help": md["help"]}
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    if md["kind"] == "switch":
        kw["action"] = "store_true"
    else:
        if md["kind"] == "repeat":
            kw["action"] = "append"
        elif md["kind"] == "several":
            kw["nargs"] = "+"
        parse = comma_list(md["item"]) if md["item"] is not None else md["type"]
        kw.update({k: v for k, v in (("type", parse), ("choices", md["choices"]), ("metavar", md["metavar"]))
                   if v is not None})
    if default is MISSING:
        kw["required"] = True
    else:
        kw["default"] = default
    return kw


def add_command(sub: argparse._SubParsersAction, cls: type[Options]) -> argparse.ArgumentParser:
    """The subcommand `cls.command`: its options in --help sections (the command's own first, then the shared groups
    in SECTIONS order), mutually exclusive groups as the class declares them, and the old spellings it keeps."""
    p = sub.add_parser(cls.command, help=cls.about, description=cls.description,
                       formatter_class=argparse.RawDescriptionHelpFormatter if cls.examples else argparse.HelpFormatter)
    sections: dict[str | None, Any] = {None: p}
    exclusive: dict[str, Any] = {}
    for f in sorted(fields(cls), key=lambda f: SECTIONS.index(f.metadata["group"])):
        md = f.metadata
        if md["group"] not in sections:
            sections[md["group"]] = p.add_argument_group(md["group"])
        container = sections[md["group"]]
        if md["exclusive"] is not None:
            if md["exclusive"] not in exclusive:
                exclusive[md["exclusive"]] = container.add_mutually_exclusive_group(
                    required=cls.exclusive[md["exclusive"]])
            container = exclusive[md["exclusive"]]
        container.add_argument(md["flag"], *md["aliases"], **_argument(f))
    for f in fields(cls):
        if f.metadata["deprecated"]:
            deprecated(p, f.metadata["flag"], *f.metadata["deprecated"])
    return p


def build(prog: str, description: str, commands: dict[str, type[Options]]) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cls in commands.values():
        add_command(sub, cls)
    return parser
