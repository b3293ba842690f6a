"""The exactly-once checkers on hand-made histories: each anomaly found where it is."""

from __future__ import annotations

from typing import Any

from raftline.chaos.eos_checker import check_idempotent, check_transactions
from raftline.chaos.history import Op, index_ops

KEY = "w/0"


class History:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.clock = 0

    def op(self, process: int, f: str, value: Any, result: str = "ok", done: Any = None) -> None:
        self.clock += 10
        self.ops.append(Op(process, "invoke", f, value, time=self.clock))
        self.clock += 10
        self.ops.append(Op(process, result, f, value if done is None else done, time=self.clock))

    def send(self, values: list[str], offsets: list[int] | None, result: str = "ok") -> None:
        value = {"key": KEY, "values": values, "producer_id": 1, "producer_epoch": 0}
        done = None
        if offsets is not None:
            done = {**value, "offsets": [{"partition": 0, "offset": o} for o in offsets]}
        self.op(1, "send", value, result, done)

    def final(self, messages: list[tuple[int, str]], f: str = "poll", key: str = KEY) -> None:
        value = {"key": key, "final": True}
        self.op(9, f, value, done={**value, "messages": [list(m) for m in messages]})

    def txn(self, txn: str, key: str, values: list[str]) -> None:
        self.op(1, "txn-send", {"txn": txn, "key": key, "values": values})

    def end(self, txn: str, commit: bool, result: str = "ok") -> None:
        self.op(1, "txn-end", {"txn": txn, "commit": commit}, result)

    def poll(self, messages: list[tuple[int, str]], key: str = KEY) -> None:
        value = {"key": key, "final": False}
        self.op(5, "txn-poll", value, done={**value, "messages": [list(m) for m in messages]})

    def idempotent(self) -> dict[str, Any]:
        return check_idempotent(index_ops([Op(0, "invoke", "producer-init"), *self.ops]))

    def transactions(self) -> dict[str, Any]:
        return check_transactions(index_ops(self.ops))


def test_a_retried_value_stored_once_at_its_acknowledged_offset_is_valid() -> None:
    h = History()
    h.send(["i1-0"], None, "info")
    h.send(["i1-0"], [0])
    h.final([(0, "i1-0")])
    assert h.idempotent()["valid"]


def test_idempotent_anomalies_are_each_found() -> None:
    h = History()
    h.send(["i1-0", "i1-1"], [0, 1])
    h.send(["i1-2"], [2])  # stored twice
    h.send(["i1-3"], [4])  # lost
    h.send(["i1-4"], [3])  # acknowledged at 3, stored at 5
    h.final([(0, "i1-1"), (1, "i1-0"), (2, "i1-2"), (3, "i1-2"), (5, "i1-4"), (6, "x")])
    assert h.idempotent()["anomaly_types"] == [
        "duplicate",
        "garbage",
        "lost",
        "order",
        "wrong-offset",
    ]


def test_committed_aborted_and_unknown_transactions_read_as_allowed_are_valid() -> None:
    h = History()
    h.txn("a", KEY, ["ta-0"])
    h.txn("a", "w/1", ["ta-1"])
    h.end("a", True)
    h.txn("b", KEY, ["tb-0"])
    h.end("b", False)
    h.txn("c", KEY, ["tc-0"])
    h.end("c", True, "info")  # unknown: none of it visible is fine
    h.poll([(0, "ta-0")])
    h.final([(0, "ta-0")], "txn-poll")
    h.final([(0, "ta-1")], "txn-poll", "w/1")
    verdict = h.transactions()
    assert verdict["valid"], verdict["anomalies"]
    assert verdict["stats"]["multi_partition_committed"] == 1


def test_transaction_anomalies_are_each_found() -> None:
    h = History()
    h.txn("a", KEY, ["ta-0", "ta-1"])
    h.poll([(0, "ta-0")])  # before the commit was asked for
    h.end("a", True)
    h.txn("b", KEY, ["tb-0"])
    h.end("b", False)
    h.txn("c", KEY, ["tc-0", "tc-1"])
    h.end("c", True, "info")
    h.txn("d", KEY, ["td-0"])
    h.end("d", True)
    h.final([(0, "ta-0"), (1, "tb-0"), (2, "tc-0"), (3, "ta-0"), (4, "zz")], "txn-poll")
    assert h.transactions()["anomaly_types"] == [
        "aborted-read",
        "duplicate",
        "fractured",
        "garbage",
        "lost",
        "uncommitted-read",
    ]


def test_a_write_write_cycle_is_reported_but_allowed() -> None:
    h = History()
    h.txn("a", KEY, ["ta-0"])
    h.txn("a", "w/1", ["ta-1"])
    h.txn("b", KEY, ["tb-0"])
    h.txn("b", "w/1", ["tb-1"])
    h.end("a", True)
    h.end("b", True)
    h.final([(0, "ta-0"), (1, "tb-0")], "txn-poll")
    h.final([(0, "tb-1"), (1, "ta-1")], "txn-poll", "w/1")
    verdict = h.transactions()
    assert verdict["valid"]
    assert verdict["stats"]["g0_cycles"] == 1 and verdict["g0_examples"] == [["a", "b", "a"]]
