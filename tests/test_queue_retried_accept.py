"""An accept retried after its answer was lost (a 503 "outcome unknown", then the client's
retry) answers ok when its own delivery acknowledged the record, also on a new leader: the shard's
durable state remembers which delivery acknowledged each recent record. A receipt of another
delivery still answers lock_expired."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import serving

from raftline.node.broker import Broker
from raftline.node.queues.state import RECENT_ACKS, PartitionState, QueueState
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(60)


async def accept(broker: Broker, receipts: list[str]) -> list[dict[str, Any]]:
    answer = await broker.queue_call("q", "queue_ack", {"receipts": receipts, "outcome": "accept"})
    return list(answer["results"])


async def test_an_accept_sent_again_after_it_applied_answers_ok(tmp_path: Path) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        await broker.create_topic("t", 1, 1, {})
        await broker.produce("t", 0, build_batch([Record(b"a"), Record(b"b")]), "all")
        create = {"topic": "t", "lock_ms": 30_000, "max_deliveries": 5, "dead_letter_topic": None}
        await broker.queue_call("q", "queue_create", create)
        got = await broker.queue_call("q", "queue_receive", {"max_messages": 2, "wait_ms": 0})
        receipts = [m["receipt"] for m in got["messages"]]
        assert [r["ok"] for r in await accept(broker, receipts)] == [True, True]
        again = await accept(broker, receipts)  # the retry of an accept that applied
        assert [(r["ok"], r["error"]) for r in again] == [(True, None), (True, None)]
        described = await broker.queue_call("q", "queue_describe", {})
        assert described["acknowledged"] == 2  # counted once
        # a release or an extend of the same receipts is no retry: the lock is gone
        extended = await broker.queue_call("q", "queue_extend", {"receipts": receipts[:1]})
        assert extended["results"][0]["error"] == "lock_expired"


async def test_the_receipt_of_an_earlier_delivery_stays_lock_expired(tmp_path: Path) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        await broker.create_topic("t", 1, 1, {})
        await broker.produce("t", 0, build_batch([Record(b"a")]), "all")
        create = {"topic": "t", "lock_ms": 30_000, "max_deliveries": 5, "dead_letter_topic": None}
        await broker.queue_call("q", "queue_create", create)
        first = await broker.queue_call("q", "queue_receive", {"max_messages": 1})
        old = first["messages"][0]["receipt"]
        released = {"receipts": [old], "outcome": "release"}
        assert (await broker.queue_call("q", "queue_ack", released))["results"][0]["ok"]
        second = await broker.queue_call("q", "queue_receive", {"max_messages": 1})
        assert second["messages"][0]["delivery_count"] == 2
        assert (await accept(broker, [second["messages"][0]["receipt"]]))[0]["ok"]
        stale = await accept(broker, [old])
        assert (stale[0]["ok"], stale[0]["error"]) == (False, "lock_expired")


def test_the_acknowledging_delivery_survives_a_snapshot_and_old_snapshots_restore() -> None:
    queues = QueueState()
    create = {"op": "create", "queue": "q", "topic": "t", "incarnation": "i1"}
    queues.apply(create)
    queues.apply({"op": "deliver", "queue": "q", "partition": 0, "offsets": [0, 1]})
    queues.apply({"op": "deliver", "queue": "q", "partition": 0, "offsets": [1]})
    settle = {"op": "settle", "queue": "q", "partition": 0, "outcome": "ack", "offsets": [0, 1]}
    queues.apply({**settle, "attempts": [1, 2]})
    restored = QueueState.restore(json.loads(json.dumps(queues.snapshot())))  # a new leader
    partition = restored.queues["q"].partitions[0]
    assert (partition.acknowledged_by(0), partition.acknowledged_by(1)) == (1, 2)
    assert PartitionState.from_json([2, [], []]).acknowledged_by(0) is None  # an old snapshot


def test_a_partition_remembers_only_its_recent_acknowledgements() -> None:
    partition = PartitionState()
    for offset in range(RECENT_ACKS + 5):
        partition.deliveries[offset] = 1
    queues = QueueState()
    queues.apply({"op": "create", "queue": "q", "topic": "t", "incarnation": "i1"})
    queue = queues.queues["q"]
    queue.partitions[0] = partition
    for start in range(0, RECENT_ACKS + 5, 500):
        offsets = list(range(start, min(start + 500, RECENT_ACKS + 5)))
        queues.apply(
            {"op": "settle", "queue": "q", "partition": 0, "outcome": "ack", "offsets": offsets}
        )
    assert len(partition.acked) == RECENT_ACKS
    assert partition.acknowledged_by(4) is None and partition.acknowledged_by(5) == 1
