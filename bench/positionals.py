"""Command lines of the bench scripts run as `python -m bench.<script> [n] [m]...`.

Owns their parsing: --help prints the script's docstring, and a value of the wrong kind is a
usage error (exit 2) before anything starts, not a traceback halfway through a run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


@dataclass(frozen=True)
class Positional:
    """One optional positional argument: its name, how it is read, its default."""

    name: str
    kind: Callable[[str], Any]
    default: Any
    choices: Sequence[str] | None = None


def parse(
    prog: str, doc: str | None, positionals: Sequence[Positional], argv: list[str] | None = None
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {prog}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for arg in positionals:
        parser.add_argument(
            arg.name,
            nargs="?",
            type=arg.kind,
            default=arg.default,
            choices=arg.choices,
            help=f"default {arg.default}",
        )
    return parser.parse_args(argv)
