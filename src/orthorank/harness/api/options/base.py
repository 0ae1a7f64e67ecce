"""Each command's options as one typed dataclass, and each option written once, as a field: its flag, default, type,
choices and help are the field's metadata. The library functions in orthorank.harness.api take these options, the study
builds them from a budget, and the CLI builds its parsers from them (harness/cli/parser.py), so nothing passes argv between
them and no flag is declared twice. `argv()` writes the equivalent command line, which every result file records."""

from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar, Self

from orthorank.errors import UserError
from orthorank.method.plan import MATCH_RULES
from orthorank.method.policies import get_policy

MODEL_GROUP = "model"  # the --help section of the model's options, written first on a command line
KINDS = ("value", "switch", "list", "repeat", "several")  # how a field is written on a command line (argv)


def flag(name: str, *, help: str, default: Any = MISSING, factory: Callable[[], Any] | None = None,
         kind: str = "value", type: Callable[[str], Any] | None = None, item: Callable[[str], Any] | None = None,
         choices: tuple | None = None, metavar: str | None = None, aliases: tuple[str, ...] = (),
         deprecated: tuple[str, ...] = (), exclusive: str | None = None, group: str | None = None) -> Any:
    """An option: a dataclass field whose metadata is everything the CLI needs to parse it.

    kind: value (one value), switch (store_true), list (comma-separated; `item` parses each, else `type` the whole),
    repeat (the flag may repeat), several (space-separated values). A field without a default is a required flag;
    `exclusive` names a mutually exclusive group (the class's `exclusive` says whether one is required). `aliases` are
    other spellings shown in --help, `deprecated` old ones that still work for a release with a note on stderr.
    `group` is the --help section (the shared groups set it)."""
    if kind not in KINDS:
        raise ValueError(f"{name}: kind {kind!r} is not one of {KINDS}")
    metadata = {"flag": name, "kind": kind, "help": help, "type": type, "item": item, "choices": choices,
                "metavar": metavar, "aliases": aliases, "deprecated": deprecated, "exclusive": exclusive,
                "group": group}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(kw_only=True)
class Options:
    command: ClassVar[str] = ""
    about: ClassVar[str] = ""  # the one line `orthorank --help` shows for the command
    description: ClassVar[str] = ""  # the command's --help text above its options
    examples: ClassVar[bool] = False  # the description has example lines: keep its line breaks
    exclusive: ClassVar[dict[str, bool]] = {}  # mutually exclusive groups of flags -> one of them is required

    @classmethod
    def from_namespace(cls, namespace: Any) -> Self:
        """The options a parsed command line gave (argparse's namespace: same names, values already checked)."""
        return cls(**{f.name: getattr(namespace, f.name) for f in fields(cls)})

    def argv(self) -> list[str]:
        """The command line that gives these options: the command, then every option that differs from its default."""
        out = [self.command]
        # the model first, as people write it (sorted is stable: the rest keep their order)
        for f in sorted(fields(self), key=lambda f: f.metadata["group"] != MODEL_GROUP):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if default is not MISSING and value == default:
                continue
            name, kind = f.metadata["flag"], f.metadata["kind"]
            if kind == "switch":
                out += [name] if value else []
            elif value is None:
                raise ValueError(f"{type(self).__name__}.{f.name}: None where the command line needs a value")
            elif kind == "repeat":
                out += [x for item in value for x in (name, str(item))]
            elif kind == "several":
                out += [name, *map(str, value)]
            elif kind == "list":
                out += [name, ",".join(map(str, value))]
            else:
                out += [name, str(value)]
        return out


# -- value types: each refuses a bad value as the command line is parsed, with a one-line reason -------------------

def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _int_at_least(text: str, low: int, words: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {words}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "0 or more")


def batch_size_or_auto(text: str) -> int | str:
    return text if text.startswith("auto") else positive_int(text)


def policy_name(text: str) -> str:
    """--policy is checked as it is parsed, before a command reads any data or model."""
    try:
        return get_policy(text).name
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def token_count(text: str) -> int:
    """8K, 8k, 32768 -> tokens (K = 1024)."""
    t = str(text).strip().lower()
    try:
        value = int(float(t[:-1]) * 1024) if t.endswith("k") else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (e.g. 8K or 8192)") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"a calibration needs at least 2 tokens, got {text!r}")
    return value


def match_rules(text: str) -> list[str]:
    rules = [r.strip() for r in text.split(",") if r.strip()]
    bad = [r for r in rules if r not in MATCH_RULES]
    if bad or not rules:
        raise argparse.ArgumentTypeError(f"--match takes {', '.join(MATCH_RULES)} (comma-separated), got {text!r}")
    return list(dict.fromkeys(rules))


def comma_list(item: Callable[[str], Any]) -> Callable[[str], list]:
    """A comma-separated list, each element parsed by `item`."""
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return [item(t) for t in items]
    parse.__name__ = f"list_of_{getattr(item, '__name__', 'items')}"
    return parse
