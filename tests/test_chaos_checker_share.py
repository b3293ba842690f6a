"""Specification of the queue (share group) checker: a clean history passes; each hand-made
history holds one planted anomaly the checker must name."""

from __future__ import annotations

from typing import Any

import pytest

from raftline.chaos.history import Op, index_ops
from raftline.chaos.share_checker import ANOMALY_TYPES, check

MAX = 2


class History:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.clock = 0

    def op(self, process: int, f: str, invoke: Any, done: Any, outcome: str = "ok") -> None:
        self.clock += 10
        self.ops.append(Op(process, "invoke", f, invoke, time=self.clock))
        self.clock += 10
        self.ops.append(Op(process, outcome, f, done, time=self.clock))  # type: ignore[arg-type]

    def send(self, value: str, offset: int) -> None:
        self.op(0, "send", {"value": value}, {"value": value, "partition": 0, "offset": offset})

    def receive(self, process: int, *records: tuple[int, str, int]) -> None:
        messages = [
            {"partition": 0, "offset": o, "value": v, "delivery_count": c} for o, v, c in records
        ]
        self.op(process, "receive", {}, {"messages": messages})

    def settle(
        self, process: int, outcome: str, *records: tuple[int, int], ok: bool = True
    ) -> None:
        invoke = {"outcome": outcome, "records": [[0, o, c] for o, c in records]}
        self.op(process, "settle", invoke, {**invoke, "results": [ok] * len(records)})

    def final(self, *dead: tuple[int, str, int, str]) -> list[Op]:
        items = [
            {"partition": 0, "offset": o, "value": v, "delivery_count": c, "reason": r}
            for o, v, c, r in dead
        ]
        self.op(9, "final", {}, {"dead": items})
        return index_ops(self.ops)


def clean() -> History:
    h = History()
    h.send("a", 1)
    h.send("b", 2)
    h.send("c", 3)
    h.receive(1, (1, "a", 1), (2, "b", 1))
    h.receive(2, (3, "c", 1))
    h.settle(1, "accept", (1, 1))
    h.settle(1, "release", (2, 1))
    h.settle(2, "reject", (3, 1))
    h.receive(2, (2, "b", 2))  # released, counted again; then its lock expires
    return h


def test_a_clean_history_passes() -> None:
    h = clean()
    result = check(h.final((2, "b", 2, "max_deliveries"), (3, "c", 1, "rejected")), MAX)
    assert result.valid, result.anomalies
    assert result.stats["acknowledged"] == 1 and result.stats["dead_lettered"] == 2


def found(history: list[Op]) -> set[str]:
    result = check(history, MAX)
    assert set(result.anomalies) <= set(ANOMALY_TYPES)
    return set(result.anomalies)


def test_planted_lost_record() -> None:
    assert found(clean().final((3, "c", 1, "rejected"))) == {"lost"}


def test_planted_double_ack_and_redelivery_after_ack() -> None:
    h = clean()
    h.receive(3, (1, "a", 2))
    h.settle(3, "accept", (1, 2))
    kinds = found(h.final((2, "b", 2, "max_deliveries"), (3, "c", 1, "rejected")))
    assert kinds == {"double-ack", "redelivered-after-ack"}


def test_planted_delivery_count_going_down_and_past_the_limit() -> None:
    h = clean()
    h.receive(3, (2, "b", 1))
    h.receive(3, (2, "b", 3))
    kinds = found(h.final((2, "b", 3, "max_deliveries"), (3, "c", 1, "rejected")))
    assert kinds == {"delivery-count-decreased", "too-many-deliveries"}


def test_planted_wrong_dead_letters() -> None:
    h = clean()
    h.send("d", 4)
    h.receive(1, (4, "d", 1))
    h.settle(1, "accept", (4, 1))
    history = h.final(
        (2, "b", 1, "max_deliveries"),  # not spent, never rejected
        (3, "c", 1, "rejected"),
        (4, "d", 1, "rejected"),  # acknowledged
    )
    assert found(history) == {"unjustified-dead-letter", "acked-and-dead"}


def test_planted_garbage_read() -> None:
    h = clean()
    h.receive(3, (1, "zzz", 2))
    assert "garbage" in found(h.final((2, "b", 2, "max_deliveries"), (3, "c", 1, "rejected")))


def test_an_accept_of_unknown_outcome_is_not_a_loss() -> None:
    h = History()
    h.send("a", 1)
    h.receive(1, (1, "a", 1))
    h.op(1, "settle", {"outcome": "accept", "records": [[0, 1, 1]]}, None, outcome="info")
    assert check(h.final(), MAX).valid


@pytest.mark.parametrize("kind", ANOMALY_TYPES)
def test_every_anomaly_type_is_named_by_some_planted_test(kind: str) -> None:
    import inspect
    import sys

    source = inspect.getsource(sys.modules[__name__])
    assert f'"{kind}"' in source
