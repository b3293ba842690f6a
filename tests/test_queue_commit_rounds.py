"""A receive or an ack that spans several partitions of a queue proposes its commands (the
delivery counts, the acknowledgements) to the shard's Raft group together, so they commit in one
round (one fsync on a majority), not one partition after another; and first deliveries under
the partitions' delivery leases propose nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import serving

from raftline.node.broker import Broker
from raftline.node.queues.service import QueueService
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(60)


async def queue_over(broker: Broker, partitions: int, max_deliveries: int = 5) -> None:
    await broker.create_topic("t", partitions, 1, {})
    for p in range(partitions):
        batch = build_batch([Record(f"{p}-{i}".encode()) for i in range(3)])
        await broker.produce("t", p, batch, "all")
    create = {
        "topic": "t",
        "lock_ms": 30_000,
        "max_deliveries": max_deliveries,
        "dead_letter_topic": None,
    }
    await broker.queue_call("q", "queue_create", create)


async def leased(broker: Broker, partitions: int, to: int) -> None:
    """Until the queue's delivery lease covers offsets below `to` in every partition."""
    async with asyncio.timeout(10):
        while True:
            states = [r.state.queues.get("q") for r in broker.queues.replicas.values()]
            queue = next(q for q in states if q is not None)
            if all(
                p in queue.partitions and queue.partitions[p].leased >= to
                for p in range(partitions)
            ):
                return
            await asyncio.sleep(0.01)


def count_in_flight(monkeypatch: pytest.MonkeyPatch, op: str) -> list[int]:
    """Patches the service's proposals; the list gets the number of `op` commands in flight
    at each proposal of one."""
    real_propose = QueueService._propose
    in_flight: list[int] = [0]
    seen: list[int] = []

    async def propose(self: QueueService, shard: str, command: dict[str, Any]) -> Any:
        if command.get("op") != op or command.get("outcome") == "gap":
            return await real_propose(self, shard, command)
        in_flight[0] += 1
        seen.append(in_flight[0])
        try:
            await asyncio.sleep(0.01)  # the others of the same call are proposed meanwhile
            return await real_propose(self, shard, command)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(QueueService, "_propose", propose)
    return seen


async def test_a_receive_of_one_partition_hands_out_in_the_receive_s_own_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No task of its own (as gather would make): two turns of a busy loop fewer between a
    # record and its receiver.
    async with serving(tmp_path / "data") as (_, broker):
        await queue_over(broker, 1)
        real_deliver = QueueService._deliver
        tasks: list[asyncio.Task[Any] | None] = []

        async def deliver(self: QueueService, *args: Any) -> Any:
            tasks.append(asyncio.current_task())
            return await real_deliver(self, *args)

        monkeypatch.setattr(QueueService, "_deliver", deliver)
        receiving = asyncio.ensure_future(
            broker.queue_call("q", "queue_receive", {"max_messages": 10, "wait_ms": 0})
        )
        assert len((await receiving)["messages"]) == 3
        assert tasks == [receiving]


async def test_a_receive_over_four_partitions_proposes_their_delivery_counts_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        await queue_over(broker, 4, max_deliveries=1)  # no lease: every delivery is a command
        seen = count_in_flight(monkeypatch, "deliver")
        got = await broker.queue_call("q", "queue_receive", {"max_messages": 12, "wait_ms": 0})
        assert len(got["messages"]) == 12
        assert max(seen) == 4  # one round for the four partitions (the old code: 1 at a time)


async def test_first_deliveries_under_the_lease_propose_no_command_and_redeliveries_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        await queue_over(broker, 4)
        await broker.queue_call("q", "queue_receive", {"max_messages": 1, "wait_ms": 0})
        await leased(broker, 4, 3)  # the reads of the first receive moved the leases
        seen = count_in_flight(monkeypatch, "deliver")
        got = await broker.queue_call("q", "queue_receive", {"max_messages": 12, "wait_ms": 0})
        assert len(got["messages"]) == 11
        assert {m["delivery_count"] for m in got["messages"]} == {1}
        assert seen == []
        receipts = [m["receipt"] for m in got["messages"]]
        await broker.queue_call("q", "queue_ack", {"receipts": receipts, "outcome": "release"})
        again = await broker.queue_call("q", "queue_receive", {"max_messages": 12, "wait_ms": 0})
        assert sorted(m["delivery_count"] for m in again["messages"]) == [2] * 11
        assert seen  # second deliveries are counted by a command


async def test_an_ack_over_four_partitions_proposes_their_settles_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        await queue_over(broker, 4)
        got = await broker.queue_call("q", "queue_receive", {"max_messages": 12, "wait_ms": 0})
        seen = count_in_flight(monkeypatch, "settle")
        receipts = [m["receipt"] for m in got["messages"]]
        acked = await broker.queue_call("q", "queue_ack", {"receipts": receipts})
        assert [r["ok"] for r in acked["results"]] == [True] * 12
        assert max(seen) == 4
        described = await broker.queue_call("q", "queue_describe", {})
        assert described["acknowledged"] == 12
