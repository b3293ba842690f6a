"""The bench scripts' command lines: help and bad values end the run before anything starts."""

from __future__ import annotations

import pytest

from bench import http_failover, positionals
from bench.positionals import Positional, positive_float, positive_int

COUNTS = [Positional("rounds", positive_int, 3), Positional("gap_s", positive_float, 0.5)]


def test_missing_positionals_take_their_defaults() -> None:
    args = positionals.parse("bench.x", "doc", COUNTS, [])
    assert (args.rounds, args.gap_s) == (3, 0.5)


def test_given_positionals_are_read_in_order() -> None:
    args = positionals.parse("bench.x", "doc", COUNTS, ["7", "0.25"])
    assert (args.rounds, args.gap_s) == (7, 0.25)


def test_help_prints_the_scripts_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        positionals.parse("bench.x", "Seconds from a fault to the next ack.", COUNTS, ["--help"])
    assert exit_.value.code == 0
    assert "Seconds from a fault to the next ack." in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["many"], ["0"], ["2", "-1"], ["2", "nan"]])
def test_a_bad_value_is_a_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        positionals.parse("bench.x", "doc", COUNTS, argv)
    assert exit_.value.code == 2


def test_http_failover_refuses_an_unknown_fault_before_starting() -> None:
    with pytest.raises(SystemExit) as exit_:
        http_failover.main(["3", "explode"])
    assert exit_.value.code == 2
