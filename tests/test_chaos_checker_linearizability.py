"""Specification of the Wing-Gong linearizability checker on register and topic histories."""

from __future__ import annotations

import math
from typing import Any

from raftline.chaos.history import Op, index_ops
from raftline.chaos.linearizability import (
    UNKNOWN,
    Operation,
    RegisterModel,
    TopicModel,
    check_operations,
    check_topics,
)


def op(
    client: int, input: tuple[Any, ...], output: Any, call: float, ret: float, key: str = "r"
) -> Operation:
    return Operation(client, key, input, output, call, ret)


def register(*ops: Operation) -> dict[str, Any]:
    return check_operations(RegisterModel(), ops)


def topics(*ops: Operation) -> dict[str, Any]:
    return check_operations(TopicModel(), ops)


def test_sequential_write_then_read_is_linearizable() -> None:
    assert register(op(1, ("write", 1), None, 0, 5), op(2, ("read",), 1, 6, 8))["valid"]


def test_read_concurrent_with_write_may_see_old_or_new_value() -> None:
    write = op(1, ("write", 1), None, 0, 10)
    assert register(write, op(2, ("read",), None, 2, 4))["valid"]
    assert register(write, op(2, ("read",), 1, 2, 4))["valid"]


def test_touching_intervals_count_as_concurrent() -> None:
    assert register(op(1, ("write", 1), None, 0, 5), op(2, ("read",), None, 5, 6))["valid"]


def test_stale_read_after_completed_write_is_not_linearizable() -> None:
    result = register(op(1, ("write", 1), None, 0, 5), op(2, ("read",), None, 6, 8))
    assert result["verdict"] == "illegal"


def test_read_of_overwritten_value_is_not_linearizable() -> None:
    result = register(
        op(1, ("write", 1), None, 0, 5),
        op(1, ("write", 2), None, 6, 10),
        op(2, ("read",), 1, 11, 12),
    )
    assert not result["valid"]


def test_two_concurrent_cas_from_same_value_cannot_both_succeed() -> None:
    result = register(op(1, ("cas", None, 1), True, 0, 10), op(2, ("cas", None, 2), True, 0, 10))
    assert result["verdict"] == "illegal"


def test_indeterminate_write_may_or_may_not_take_effect() -> None:
    write = op(1, ("write", 1), UNKNOWN, 0, math.inf)
    assert register(write, op(2, ("read",), 1, 20, 21))["valid"]
    assert register(write, op(2, ("read",), None, 20, 21))["valid"]


def test_indeterminate_write_cannot_be_undone_once_observed() -> None:
    write = op(1, ("write", 1), UNKNOWN, 0, math.inf)
    result = register(write, op(2, ("read",), 1, 20, 21), op(2, ("read",), None, 30, 31))
    assert not result["valid"]


def test_concurrent_creates_of_one_topic_are_one_created_one_exists() -> None:
    first = op(1, ("create", 3), "created", 0, 10, key="orders")
    assert topics(first, op(2, ("create", 3), "exists", 0, 10, key="orders"))["valid"]
    assert not topics(first, op(2, ("create", 3), "created", 0, 10, key="orders"))["valid"]


def test_describe_after_completed_delete_must_not_find_topic() -> None:
    steps = [
        op(1, ("create", 3), "created", 0, 1, key="orders"),
        op(1, ("delete",), "deleted", 2, 3, key="orders"),
    ]
    assert topics(*steps, op(2, ("describe",), "unknown_topic", 4, 5, key="orders"))["valid"]
    assert not topics(*steps, op(2, ("describe",), 3, 4, 5, key="orders"))["valid"]


def test_failure_is_reported_for_the_offending_topic_only() -> None:
    result = topics(
        op(1, ("create", 1), "created", 0, 1, key="good"),
        op(1, ("create", 2), "created", 0, 1, key="bad"),
        op(2, ("describe",), 5, 2, 3, key="bad"),
    )
    assert result["keys"] == 2
    assert [f["key"] for f in result["failures"]] == ["bad"]


def test_illegal_search_with_many_concurrent_writes_terminates() -> None:
    writes = [op(i, ("write", i), None, 0, 10) for i in range(12)]
    assert not register(*writes, op(99, ("read",), 42, 11, 12))["valid"]


def recorded(
    at: int, process: int, f: str, request: dict[str, Any], outcome: str, **done: Any
) -> list[Op]:
    """An operation invoked at time `at` and completed one tick later."""
    return [
        Op(process, "invoke", f, request, time=at),
        Op(process, outcome, f, time=at + 1, **done),
    ]  # type: ignore[arg-type]


def test_recorded_topic_exists_error_is_a_definite_answer() -> None:
    create = {"topic": "orders", "partitions": 3}
    ops = index_ops(
        recorded(0, 1, "create", create, "ok", value={"result": "created"})
        + recorded(2, 2, "create", create, "fail", error="topic_exists")
        + recorded(4, 2, "describe", {"topic": "orders"}, "ok", value={"result": 3})
    )
    assert check_topics(ops)["valid"]


def test_recorded_history_with_lost_topic_is_not_linearizable() -> None:
    create = {"topic": "orders", "partitions": 3}
    ops = index_ops(
        recorded(0, 1, "create", create, "ok", value={"result": "created"})
        + recorded(2, 2, "describe", {"topic": "orders"}, "fail", error="unknown_topic")
    )
    assert check_topics(ops)["verdict"] == "illegal"


def test_recorded_create_that_timed_out_may_have_happened() -> None:
    create = {"topic": "orders", "partitions": 3}
    ops = index_ops(
        recorded(0, 1, "create", create, "info", error="timeout")
        + recorded(2, 2, "describe", {"topic": "orders"}, "ok", value={"result": 3})
    )
    assert check_topics(ops)["valid"]
