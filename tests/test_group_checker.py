"""Specification of the consumer-group checker: each hand-made history holds one anomaly it must
name, and a clean history with rebalances, refused commits and a final phase passes."""

from __future__ import annotations

from typing import Any

import pytest

from raftline.chaos import report
from raftline.chaos.group_checker import check, queue_view
from raftline.chaos.history import HistoryError, Op, index_ops
from raftline.chaos.queue_checker import check as queue_check

G = "billing"
P0, P1 = "orders/0", "orders/1"


def done(
    process: int, f: str, request: dict[str, Any], result: dict[str, Any], outcome: str = "ok"
):
    return [Op(process, "invoke", f, request), Op(process, outcome, f, {**request, **result})]  # type: ignore[arg-type]


def send(process: int, key: str, value: str, offset: int | None = None, outcome: str = "ok"):
    extra = {} if offset is None else {"offset": offset}
    return done(process, "send", {"key": key, "value": value}, extra, outcome)


def join(process: int, member: str, generation: int, assignment: list[str]) -> list[Op]:
    request = {"group": G, "member": member, "topics": ["orders"]}
    return done(
        process, "group-join", request, {"generation": generation, "assignment": assignment}
    )


def heartbeat(process: int, member: str, generation: int, assignment: list[str]) -> list[Op]:
    result = {"generation": generation, "assignment": assignment, "rebalancing": False}
    return done(process, "group-heartbeat", {"group": G, "member": member}, result)


def fetch(
    process: int,
    member: str,
    generation: int,
    positions: dict[str, int],
    messages: list[list[Any]] = (),  # type: ignore[assignment]
    final: bool = False,
) -> list[Op]:
    result = {"generation": generation, "messages": list(messages), "positions": positions}
    return done(process, "group-fetch", {"group": G, "member": member, "final": final}, result)


def commit(
    process: int, member: str, generation: int, offsets: dict[str, int], outcome: str = "ok"
) -> list[Op]:
    request = {"group": G, "member": member, "generation": generation, "offsets": offsets}
    return done(process, "group-commit", request, {}, outcome)


def offsets(process: int, shown: dict[str, int | None], final: bool = False) -> list[Op]:
    return done(process, "group-offsets", {"group": G, "final": final}, {"offsets": shown})


def reset(process: int, shown: dict[str, int]) -> list[Op]:
    request = {"group": G, "topic": "orders", "to": "earliest"}
    return done(process, "group-reset", request, {"offsets": shown})


def leave(process: int, member: str, outcome: str = "ok") -> list[Op]:
    return done(process, "group-leave", {"group": G, "member": member}, {}, outcome)


def history(*steps: list[Op]) -> list[Op]:
    return index_ops(op for step in steps for op in step)


def clean_steps() -> list[list[Op]]:
    """Two members split two partitions, b crashes, a takes over from the committed offset, and
    a zombie commit from the old generation is refused; then a final member reads to the end."""
    return [
        send(1, P0, "x0", 0),
        send(1, P1, "y0", 0),
        send(2, P0, "x1", 1),
        join(10, "a", 1, [P0, P1]),
        join(11, "b", 2, [P1]),
        heartbeat(10, "a", 2, [P0]),
        fetch(10, "a", 2, {P0: 2}, [[P0, 0, "x0"], [P0, 1, "x1"]]),
        commit(10, "a", 2, {P0: 2}),
        fetch(11, "b", 2, {P1: 1}, [[P1, 0, "y0"]]),
        done(11, "group-crash", {"group": G, "member": "b"}, {}),
        send(2, P1, "y1", 1),
        heartbeat(10, "a", 3, [P0, P1]),
        commit(11, "b", 2, {P1: 1}, outcome="fail"),  # the crashed member's zombie commit
        fetch(10, "a", 3, {P0: 2, P1: 2}, [[P1, 0, "y0"], [P1, 1, "y1"]]),
        commit(10, "a", 3, {P0: 2, P1: 2}),
        offsets(12, {P0: 2, P1: 2}),
        leave(10, "a"),
        join(20, "final", 4, [P0, P1]),
        fetch(20, "final", 4, {P0: 2, P1: 2}, final=True),
        offsets(20, {P0: 2, P1: 2}, final=True),
    ]


def kinds(*steps: list[Op]) -> set[str]:
    return set(check(history(*steps))["anomaly_types"])


def test_clean_history_is_valid() -> None:
    result = check(history(*clean_steps()))
    assert result["valid"] is True, result["anomalies"]
    assert result["stats"]["acknowledged"] == 4
    assert result["stats"]["commits_refused"] == 1
    assert result["stats"]["generations"] == 4


def test_clean_history_is_valid_for_the_queue_checker_and_the_report() -> None:
    ops = history(*clean_steps())
    assert queue_check(queue_view(ops))["anomaly_types"] == []
    result = report.analyse(ops)
    assert result["valid"] is True
    assert report.summary_text(result).startswith("verdict: VALID")


def test_acknowledged_message_no_member_fetched_is_lost() -> None:
    # a commits past y1 although its fetch never returned it: the final member starts beyond it.
    found = check(
        history(
            send(1, P0, "x0", 0),
            send(1, P0, "x1", 1),
            join(10, "a", 1, [P0]),
            fetch(10, "a", 1, {P0: 2}, [[P0, 0, "x0"]]),
            commit(10, "a", 1, {P0: 2}),
            leave(10, "a"),
            join(20, "final", 2, [P0]),
            fetch(20, "final", 2, {P0: 2}, final=True),
        )
    )
    assert found["anomaly_types"] == ["lost"]
    assert found["anomalies"]["lost"][0]["value"] == "x1"


def test_unacknowledged_send_never_fetched_is_not_lost() -> None:
    assert kinds(send(1, P0, "x0", outcome="info"), join(10, "a", 1, [P0])) == set()


def test_committed_offset_read_lower_than_a_commit_is_offset_regression() -> None:
    found = check(
        history(
            join(10, "a", 1, [P0]),
            commit(10, "a", 1, {P0: 5}),
            offsets(12, {P0: 5}),
            offsets(12, {P0: 3}),
        )
    )
    assert found["anomaly_types"] == ["offset-regression"]
    evidence = found["anomalies"]["offset-regression"][0]
    assert (evidence["earlier"]["offset"], evidence["later"]["offset"]) == (5, 3)


def test_committed_offset_missing_from_a_later_read_is_offset_regression() -> None:
    steps = (join(10, "a", 1, [P0]), commit(10, "a", 1, {P0: 5}), offsets(12, {P1: 0}))
    assert kinds(*steps) == {"offset-regression"}


def test_a_lower_commit_shown_by_a_later_read_is_offset_regression() -> None:
    steps = (
        join(10, "a", 1, [P0]),
        commit(10, "a", 1, {P0: 5}),
        commit(10, "a", 1, {P0: 4}),
        offsets(12, {P0: 4}),
    )
    assert kinds(*steps) == {"offset-regression"}


def test_a_lower_commit_alone_is_not_judged() -> None:
    # A broker may accept a commit below the committed offset and keep the higher one.
    steps = (
        join(10, "a", 1, [P0]),
        commit(10, "a", 1, {P0: 5}),
        commit(10, "a", 1, {P0: 4}),
        offsets(12, {P0: 5}),
    )
    assert kinds(*steps) == set()


def test_an_explicit_reset_excuses_a_step_back() -> None:
    steps = (
        join(10, "a", 1, [P0]),
        commit(10, "a", 1, {P0: 5}),
        leave(10, "a"),
        reset(12, {P0: 0}),
        offsets(12, {P0: 0}),
    )
    assert kinds(*steps) == set()


def test_a_read_before_any_commit_may_show_anything() -> None:
    steps = (offsets(12, {P0: 9}), join(10, "a", 1, [P0]), commit(10, "a", 1, {P0: 2}))
    assert kinds(*steps) == set()


def test_concurrent_commit_and_read_are_not_ordered() -> None:
    # The read was sent before the commit returned, so it may be ordered before it.
    ops = [
        *join(10, "a", 1, [P0]),
        *commit(10, "a", 1, {P0: 1}),
        Op(10, "invoke", "group-commit", {"group": G, "member": "a", "generation": 1,
                                          "offsets": {P0: 5}}),
        Op(12, "invoke", "group-offsets", {"group": G}),
        Op(10, "ok", "group-commit", {"group": G, "member": "a", "generation": 1,
                                      "offsets": {P0: 5}}),
        Op(12, "ok", "group-offsets", {"group": G, "offsets": {P0: 1}}),
    ]  # fmt: skip
    assert set(check(index_ops(ops))["anomaly_types"]) == set()


def test_two_members_holding_one_partition_in_one_generation_is_double_assignment() -> None:
    found = check(history(join(10, "a", 3, [P0, P1]), fetch(11, "b", 3, {P1: 0})))
    assert found["anomaly_types"] == ["double-assignment"]
    assert found["anomalies"]["double-assignment"][0]["members"] == ["a", "b"]


def test_holding_one_partition_in_different_generations_is_fine() -> None:
    assert kinds(join(10, "a", 3, [P0, P1]), heartbeat(11, "b", 4, [P1])) == set()


def test_successful_commit_of_a_partition_not_held_is_commit_by_non_owner() -> None:
    found = check(
        history(
            join(10, "a", 2, [P0]),
            join(11, "b", 2, [P1]),
            commit(10, "a", 2, {P1: 3}),
        )
    )
    assert found["anomaly_types"] == ["commit-by-non-owner"]
    assert found["anomalies"]["commit-by-non-owner"][0]["holders"] == ["b"]


def test_successful_commit_by_a_member_no_answer_ever_showed_is_commit_by_non_owner() -> None:
    assert kinds(commit(10, "ghost", 1, {P0: 3})) == {"commit-by-non-owner"}


def test_refused_commit_of_a_partition_not_held_is_fine() -> None:
    steps = (join(10, "a", 2, [P0]), commit(10, "a", 2, {P1: 3}, outcome="fail"))
    assert kinds(*steps) == set()


def test_commit_after_the_partition_moved_to_another_member_is_stale() -> None:
    steps = (join(10, "a", 2, [P0, P1]), join(11, "b", 3, [P1]), commit(10, "a", 2, {P1: 3}))
    found = check(history(*steps))
    assert found["anomaly_types"] == ["stale-commit"]
    assert found["anomalies"]["stale-commit"][0]["answered_generation"] == 3


def test_older_generation_commit_of_a_partition_held_all_along_is_stale() -> None:
    # API.md fences by generation: once generation 3 exists, generation 2 is stale.
    steps = (
        join(10, "a", 2, [P0, P1]),
        join(11, "b", 3, []),
        heartbeat(10, "a", 3, [P0, P1]),
        commit(10, "a", 2, {P1: 3}),
    )
    assert kinds(*steps) == {"stale-commit"}


def test_commit_before_the_partition_moved_is_not_stale() -> None:
    steps = (join(10, "a", 2, [P0, P1]), commit(10, "a", 2, {P1: 3}), join(11, "b", 3, [P1]))
    assert kinds(*steps) == set()


def test_member_seeing_an_older_generation_later_is_generation_regression() -> None:
    found = check(history(join(10, "a", 5, [P0]), heartbeat(10, "a", 4, [P0])))
    assert "generation-regression" in found["anomaly_types"]
    evidence = found["anomalies"]["generation-regression"][0]
    assert (evidence["earlier"]["generation"], evidence["later"]["generation"]) == (5, 4)


def test_different_members_may_see_generations_at_different_times() -> None:
    assert kinds(join(10, "a", 5, [P0]), heartbeat(11, "b", 4, [P1])) == set()


def test_invalid_group_history_makes_the_report_invalid() -> None:
    ops = history(join(10, "a", 3, [P0]), join(11, "b", 3, [P0]))
    result = report.analyse(ops)
    assert result["valid"] is False
    assert "double-assignment" in report.summary_text(result)


def test_allowed_anomaly_keeps_history_valid_and_unknown_one_is_rejected() -> None:
    ops = history(join(10, "a", 3, [P0]), join(11, "b", 3, [P0]))
    assert check(ops, allowed=["double-assignment"])["valid"] is True
    with pytest.raises(ValueError, match="unknown anomaly"):
        check(ops, allowed=["made-up"])


def test_fetch_without_positions_is_a_clear_error() -> None:
    ops = done(10, "group-fetch", {"group": G, "member": "a"}, {"generation": 1, "messages": []})
    with pytest.raises(HistoryError, match="positions"):
        check(index_ops(ops))


def test_queue_view_flags_a_fetch_returning_one_value_at_two_offsets() -> None:
    ops = history(
        send(1, P0, "x0", 0),
        join(10, "a", 1, [P0]),
        fetch(10, "a", 1, {P0: 2}, [[P0, 0, "x0"], [P0, 1, "x0"]]),
    )
    assert "duplicate" in queue_check(queue_view(ops))["anomaly_types"]
