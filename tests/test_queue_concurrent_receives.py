"""Concurrent receives on one queue shard leader: a receive chooses its records, then awaits
(reads of other partitions, the Raft commit of its delivery count); another receive that locks
some of those records meanwhile must win them, and the first must not count or hand them out
again (a record held elsewhere, delivered twice, with its holder's ack refused as stale).
Waiting receives share one tail read per partition, which reads on between receives, and the
leader reads ahead only as far as its record cache bound allows."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import time
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import serving

from raftline.node.broker import Broker
from raftline.node.errors import BrokerError
from raftline.node.queues.readahead import ReadAhead
from raftline.node.queues.service import QueueService
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(60)


async def queue_over_two_partitions(broker: Broker) -> str:
    await broker.create_topic("t", 2, 1, {})
    for p in range(2):
        batch = build_batch([Record(f"{p}-{i}".encode()) for i in range(5)])
        await broker.produce("t", p, batch, "all")
    create = {"topic": "t", "lock_ms": 30_000, "max_deliveries": 5, "dead_letter_topic": None}
    await broker.queue_call("q", "queue_create", create)
    return next(s for s, r in broker.queues.replicas.items() if "q" in r.state.queues)


async def test_a_receive_never_hands_out_records_another_receive_locked_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        shard = await queue_over_two_partitions(broker)
        service = broker.queues
        real_deliver = QueueService._deliver
        first_chose = asyncio.Event()
        go_on = asyncio.Event()
        in_first = contextvars.ContextVar("in_first", default=False)

        async def deliver(self: QueueService, *args: Any) -> list[dict[str, Any]]:
            if in_first.get():  # the first receive has chosen: hold it there
                first_chose.set()
                await go_on.wait()
            return await real_deliver(self, *args)

        async def first_receive() -> tuple[list[dict[str, Any]], int | None]:
            in_first.set(True)
            return await service._take(shard, "q", [0, 1], 10)

        monkeypatch.setattr(QueueService, "_deliver", deliver)
        first = asyncio.ensure_future(first_receive())
        await first_chose.wait()
        second, _ = await service._take(shard, "q", [1, 0], 10)
        go_on.set()
        stale, _ = await first

        assert len(second) == 10 and all(m["delivery_count"] == 1 for m in second)
        assert stale == []  # everything it chose is held by the second receive
        replica = broker.queues.replicas[shard]
        for p in range(2):
            state = replica.state.queues["q"].partitions[p]
            # each counted once (by a command, or by the delivery lease)
            assert [state.count(o) for o in range(5)] == [1] * 5
        acked = await broker.queue_call(
            "q", "queue_ack", {"receipts": [m["receipt"] for m in second], "outcome": "accept"}
        )
        assert all(r["ok"] for r in acked["results"])


async def test_the_leader_reads_ahead_only_as_far_as_its_cache_bound_allows(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        bound = 2_500
        broker.config.queue_cache_bytes = bound
        await broker.create_topic("t", 1, 1, {})
        for i in range(10):  # one 1 KB record per batch
            await broker.produce("t", 0, build_batch([Record(b"%d" % i * 1000)]), "all")
        create = {"topic": "t", "lock_ms": 30_000, "max_deliveries": 5, "dead_letter_topic": None}
        await broker.queue_call("q", "queue_create", create)
        shard = next(s for s, r in broker.queues.replicas.items() if "q" in r.state.queues)
        cache = broker.queues.shards.leading[shard].cache
        received: list[bytes] = []
        for _ in range(20):
            args = {"max_messages": 10, "wait_ms": 0}
            got = (await broker.queue_call("q", "queue_receive", args))["messages"]
            assert 0 < len(got) < 10  # never more than the cache holds
            assert cache.used <= bound + 1_100  # over the bound by one batch at most
            received += [m["record"][3] for m in got]
            receipts = [m["receipt"] for m in got]
            await broker.queue_call("q", "queue_ack", {"receipts": receipts, "outcome": "accept"})
            assert cache.used == 0  # acknowledged records leave the cache at once
            if len(received) == 10:
                break
        assert sorted(received) == sorted(b"%d" % i * 1000 for i in range(10))


async def test_waiting_receives_share_one_tail_read_per_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(tmp_path / "data") as (_, broker):
        await queue_over_two_partitions(broker)
        first = await broker.queue_call("q", "queue_receive", {"max_messages": 10, "wait_ms": 0})
        await broker.queue_call(
            "q", "queue_ack", {"receipts": [m["receipt"] for m in first["messages"]]}
        )
        reads: list[int] = []
        real_read = ReadAhead.read

        async def read(self: ReadAhead, queue: Any, partition: int, *args: Any) -> Any:
            reads.append(partition)
            return await real_read(self, queue, partition, *args)

        monkeypatch.setattr(ReadAhead, "read", read)
        args = {"max_messages": 10, "wait_ms": 5_000}
        waiting = [
            asyncio.ensure_future(broker.queue_call("q", "queue_receive", args)) for _ in range(8)
        ]
        await asyncio.sleep(0.3)
        # 8 waiting receives: per partition at most one read as a receive looked, and one
        # long-poll (the old code: a long-poll per receive and partition, 16)
        assert max(collections.Counter(reads).values()) <= 2
        reads.clear()
        started = time.monotonic()
        await broker.produce("t", 1, build_batch([Record(b"new")]), "all")
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        assert time.monotonic() - started < 1.0  # woken by the record, not by the timeout
        got = [m for task in done for m in task.result()["messages"]]
        assert [m["record"][3] for m in got] == [b"new"]
        # the waking receives read nothing again: only the tail of partition 1 polls on
        assert reads == [1]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


async def test_the_tail_reads_on_between_receives_so_the_next_receive_reads_nothing_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caught-up consumer spends most of its time between receives (a stream sending its
    # frame, a client acking). What commits then must reach the view as it commits, not when
    # the next receive reads it itself (a node-to-node round trip on the receive's path).
    async with serving(tmp_path / "data") as (_, broker):
        shard = await queue_over_two_partitions(broker)
        first = await broker.queue_call("q", "queue_receive", {"max_messages": 10, "wait_ms": 0})
        receipts = [m["receipt"] for m in first["messages"]]
        await broker.queue_call("q", "queue_ack", {"receipts": receipts})
        # A receive waits (and starts the tails), then ends empty; no receive waits from now.
        waited = {"max_messages": 10, "wait_ms": 100}
        assert (await broker.queue_call("q", "queue_receive", waited))["messages"] == []
        await asyncio.sleep(1.2)  # past the long-poll the tail had in flight (TAIL_WAIT_MS)
        reads: list[int] = []  # the wait_ms of each read
        real_read = ReadAhead.read

        async def read(self: ReadAhead, queue: Any, partition: int, *args: Any) -> Any:
            reads.append(args[3])
            return await real_read(self, queue, partition, *args)

        monkeypatch.setattr(ReadAhead, "read", read)
        offset = await broker.produce("t", 1, build_batch([Record(b"new")]), "all")
        view = broker.queues.shards.leading[shard].views[("q", 1)]
        async with asyncio.timeout(2):
            while offset not in view.records:  # read as it committed, with no receive asking
                await asyncio.sleep(0.01)
        reads.clear()
        got = await broker.queue_call("q", "queue_receive", {"max_messages": 10, "wait_ms": 0})
        assert [m["record"][3] for m in got["messages"]] == [b"new"]
        assert 0 not in reads  # the receive read nothing itself: the tails long-poll on


async def test_a_reject_whose_archive_failed_is_not_handed_out_again_before_it_is_archived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dead-letter copy is written before the archive commits; should the commit fail, the
    # record waits for the leader's next round. Handed out meanwhile and accepted, it would
    # end acknowledged and dead-lettered both.
    async with serving(tmp_path / "data") as (_, broker):
        await broker.create_topic("t", 1, 1, {})
        await broker.produce("t", 0, build_batch([Record(b"job")]), "all")
        create = {"topic": "t", "lock_ms": 30_000, "max_deliveries": 5, "dead_letter_topic": "d"}
        await broker.queue_call("q", "queue_create", create)
        real_propose = QueueService._propose
        failed: list[dict[str, Any]] = []

        async def propose(self: QueueService, shard: str, command: dict[str, Any]) -> Any:
            if command.get("outcome") == "dead" and not failed:
                failed.append(command)
                raise BrokerError("timeout", "the queue command did not commit in time")
            return await real_propose(self, shard, command)

        monkeypatch.setattr(QueueService, "_propose", propose)
        got = await broker.queue_call("q", "queue_receive", {"max_messages": 1, "wait_ms": 0})
        receipts = [m["receipt"] for m in got["messages"]]
        await broker.queue_call("q", "queue_ack", {"receipts": receipts, "outcome": "reject"})
        assert failed  # the archive failed after the dead-letter append
        again = await broker.queue_call("q", "queue_receive", {"max_messages": 1, "wait_ms": 0})
        assert again["messages"] == []
        async with asyncio.timeout(10):  # the leader's rounds archive it
            while (await broker.queue_call("q", "queue_describe", {}))["dead_lettered"] == 0:
                await asyncio.sleep(0.05)
        again = await broker.queue_call("q", "queue_receive", {"max_messages": 1, "wait_ms": 0})
        assert again["messages"] == []
