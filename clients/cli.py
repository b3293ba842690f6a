"""The `raftline` command line entry point.

Owns argument parsing for `serve` and the client subcommands.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(f"raftline: not implemented yet: {' '.join(args)}", file=sys.stderr)
    return 2
