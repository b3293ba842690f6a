"""Specification of the queue checker: each hand-made history holds one anomaly it must name."""

from __future__ import annotations

from typing import Any

import pytest

from raftline.chaos.history import HistoryError, Op, index_ops
from raftline.chaos.queue_checker import check

KEY = "orders/0"


def send(process: int, value: Any, offset: int | None = None, outcome: str = "ok") -> list[Op]:
    invoke = Op(process, "invoke", "send", {"key": KEY, "value": value})
    done: dict[str, Any] = {"key": KEY, "value": value}
    if offset is not None:
        done["offset"] = offset
    return [invoke, Op(process, outcome, "send", done)]  # type: ignore[arg-type]


def poll(process: int, start: int, messages: list[list[Any]], final: bool = False) -> list[Op]:
    request = {"key": KEY, "offset": start, "final": final}
    next_offset = messages[-1][0] + 1 if messages else start
    result = {**request, "messages": messages, "next_offset": next_offset}
    return [Op(process, "invoke", "poll", request), Op(process, "ok", "poll", result)]


def history(*steps: list[Op]) -> list[Op]:
    return index_ops(op for step in steps for op in step)


def produced_abc() -> list[list[Op]]:
    return [send(1, "a", 0), send(2, "b", 1), send(1, "c", 2)]


def anomalies(*steps: list[Op]) -> set[str]:
    return set(check(history(*steps))["anomaly_types"])


def test_clean_history_is_valid() -> None:
    result = check(
        history(*produced_abc(), poll(9, 0, [[0, "a"], [1, "b"]]), poll(9, 2, [[2, "c"]]))
    )
    assert result["valid"] is True
    assert result["anomaly_types"] == []
    assert result["stats"]["acknowledged"] == 3


def test_acknowledged_value_below_read_frontier_never_read_is_lost_write() -> None:
    found = check(history(*produced_abc(), poll(8, 0, [[0, "a"]]), poll(9, 2, [[2, "c"]])))
    assert found["anomaly_types"] == ["lost-write"]
    assert found["anomalies"]["lost-write"][0]["value"] == "b"


def test_acknowledged_value_beyond_every_read_is_unseen() -> None:
    assert anomalies(send(1, "a", 0), send(1, "b", 1), poll(9, 0, [[0, "a"]])) == {"unseen"}


def test_value_at_two_offsets_is_duplicate() -> None:
    assert anomalies(send(1, "a", 0), poll(9, 0, [[0, "a"], [1, "a"]])) == {"duplicate"}


def test_value_never_sent_is_garbage_read() -> None:
    assert anomalies(poll(9, 0, [[0, "ghost"]])) == {"garbage-read"}


def test_value_whose_send_failed_is_aborted_read() -> None:
    assert anomalies(send(1, "a", outcome="fail"), poll(9, 0, [[0, "a"]])) == {"aborted-read"}


def test_two_reads_disagreeing_at_one_offset_are_inconsistent_offsets() -> None:
    found = anomalies(
        send(1, "a", 0),
        send(2, "b", outcome="info"),
        poll(8, 0, [[0, "a"]]),
        poll(9, 0, [[0, "b"]]),
    )
    assert found == {"inconsistent-offsets"}


def test_poll_jumping_over_committed_value_is_int_poll_skip() -> None:
    found = check(
        history(*produced_abc(), poll(8, 0, [[0, "a"], [2, "c"]]), poll(9, 1, [[1, "b"]]))
    )
    assert found["anomaly_types"] == ["int-poll-skip"]
    assert found["anomalies"]["int-poll-skip"][0]["skipped"] == ["b"]


def test_poll_returning_offsets_backwards_is_int_nonmonotonic_poll() -> None:
    assert anomalies(
        *produced_abc(), poll(9, 0, [[0, "a"], [1, "b"], [0, "a"], [1, "b"], [2, "c"]])
    ) == {"int-nonmonotonic-poll"}


def test_consumer_continuing_past_unread_value_is_poll_skip() -> None:
    found = anomalies(
        *produced_abc(), poll(9, 0, [[0, "a"]]), poll(9, 1, [[2, "c"]]), poll(8, 1, [[1, "b"]])
    )
    assert found == {"poll-skip"}


def test_consumer_continuation_going_backwards_is_nonmonotonic_poll() -> None:
    found = anomalies(*produced_abc(), poll(9, 0, [[0, "a"], [1, "b"]]), poll(9, 2, [[1, "b"]]))
    assert "nonmonotonic-poll" in found
    assert found <= {"nonmonotonic-poll", "unseen"}


def test_consumer_seeking_elsewhere_is_not_a_skip() -> None:
    assert (
        anomalies(
            *produced_abc(), poll(9, 0, [[0, "a"]]), poll(9, 2, [[2, "c"]]), poll(8, 1, [[1, "b"]])
        )
        == set()
    )


def test_producer_later_send_at_earlier_offset_is_nonmonotonic_send() -> None:
    found = anomalies(send(1, "a", 1), send(1, "b", 0), poll(9, 0, [[0, "b"], [1, "a"]]))
    assert found == {"nonmonotonic-send"}


def test_read_value_missing_from_final_reads_is_vanished_read() -> None:
    found = check(
        history(
            send(1, "x", outcome="info"),
            send(2, "a", 0),
            send(2, "y", 1),
            poll(9, 1, [[1, "x"]]),
            poll(8, 0, [[0, "a"], [1, "y"]], final=True),
        )
    )
    assert "vanished-read" in found["anomaly_types"]
    assert found["anomalies"]["vanished-read"][0]["final_value"] == "y"


def test_allowed_anomaly_keeps_history_valid() -> None:
    steps = (
        *produced_abc(),
        poll(9, 0, [[0, "a"]]),
        poll(9, 1, [[2, "c"]]),
        poll(8, 1, [[1, "b"]]),
    )
    assert check(history(*steps), allowed=["poll-skip"])["valid"] is True
    assert check(history(*steps))["valid"] is False


def test_unknown_allowed_anomaly_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown anomaly"):
        check([], allowed=["made-up"])


def test_poll_without_messages_is_a_clear_error() -> None:
    broken = [Op(9, "invoke", "poll", {"key": KEY, "offset": 0}), Op(9, "ok", "poll", {"key": KEY})]
    with pytest.raises(HistoryError, match="messages"):
        check(index_ops(broken))
