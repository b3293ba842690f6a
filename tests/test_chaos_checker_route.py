"""The routing checker on hand-made histories: a correct one passes, and each anomaly it names
(lost, partial, duplicate, garbage, failed-but-visible, misrouted, wrong-offset, unread) is
found where it was planted."""

from __future__ import annotations

from typing import Any

import pytest

from raftline.chaos.history import Op, index_ops
from raftline.chaos.route_checker import check

TOPICS = ("a", "b")


def publish(
    process: int, value: str, outcome: str, routed: list[list[Any]] | None = None
) -> list[Op]:
    done: dict[str, Any] = {"value": value}
    if routed is not None:
        done["routed"] = routed
    return [
        Op(process=process, type="invoke", f="publish", value={"value": value}, time=process),
        Op(process=process, type=outcome, f="publish", value=done, time=process + 1),
    ]


def final(topics: dict[str, list[list[Any]]]) -> list[Op]:
    return [
        Op(process=99, type="invoke", f="route-final", value={}, time=100),
        Op(process=99, type="ok", f="route-final", value={"topics": topics}, time=101),
    ]


def good() -> tuple[list[Op], dict[str, list[list[Any]]]]:
    ops = publish(1, "v1", "ok", [["a", 0, 5], ["b", 0, 7]])
    ops += publish(2, "v2", "info")  # unknown outcome: written to both
    ops += publish(3, "v3", "info")  # unknown outcome: written to neither
    ops += publish(4, "v4", "fail")
    return ops, {"a": [[0, 5, "v1"], [0, 6, "v2"]], "b": [[0, 7, "v1"], [0, 9, "v2"]]}


def test_a_correct_history_passes() -> None:
    ops, topics = good()
    result = check(index_ops(ops + final(topics)))
    assert result.valid, result.anomalies
    assert result.stats["acknowledged"] == 1 and result.stats["values_read"] == 2


@pytest.mark.parametrize(
    ("change", "anomaly"),
    [
        (lambda t: t["b"].remove([0, 7, "v1"]), "lost"),
        (lambda t: t["b"].remove([0, 9, "v2"]), "partial"),
        (lambda t: t["a"].append([0, 8, "v2"]), "duplicate"),
        (lambda t: t["a"].append([0, 8, "never-sent"]), "garbage"),
        (
            lambda t: (t["a"].append([0, 8, "v4"]), t["b"].append([0, 10, "v4"])),
            "failed-but-visible",
        ),
        (lambda t: (t["a"].remove([0, 5, "v1"]), t["a"].append([0, 4, "v1"])), "wrong-offset"),
    ],
)
def test_each_planted_anomaly_is_found(change: Any, anomaly: str) -> None:
    ops, topics = good()
    change(topics)
    result = check(index_ops(ops + final(topics)))
    assert not result.valid
    assert anomaly in result.anomalies, result.anomalies


def test_an_answer_naming_other_topics_than_the_bindings_is_misrouted() -> None:
    ops = publish(1, "v1", "ok", [["a", 0, 5]])
    topics = {"a": [[0, 5, "v1"]], "b": [[0, 7, "v1"]]}
    result = check(index_ops(ops + final(topics)))
    assert list(result.anomalies) == ["misrouted"]


def test_a_history_without_the_final_read_is_never_valid() -> None:
    ops, _ = good()
    result = check(index_ops(ops))
    assert not result.valid and "unread" in result.anomalies
