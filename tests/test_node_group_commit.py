"""Group commit on a leader: an acknowledgement waits only for its own write's fsync.

A write that arrives while an earlier one is being fsynced goes to disk in the next round; the
earlier write's ack must not wait for that next fsync too, and no ack waits for the fsync of
another partition's write.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import configs, start_all
from test_node_cluster import batch_of

from raftline.node.broker import Broker

pytestmark = pytest.mark.timeout(60)

BOUND_S = 5.0


async def test_an_ack_does_not_wait_for_the_fsync_of_a_later_write(tmp_path: Path) -> None:
    (broker,) = await start_all(configs(tmp_path, 1))
    loop = asyncio.get_running_loop()
    try:
        await broker.create_topic("rounds", 1, 1, {})
        await broker.produce("rounds", 0, batch_of(b"warm"), "all")
        [group] = broker.partitions
        storage = broker.runtime.groups[group].storage
        in_first = asyncio.Event()
        first_may_end = threading.Event()
        release_second = threading.Event()
        durable = storage.fsync
        calls = 0

        def scripted_fsync() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                loop.call_soon_threadsafe(in_first.set)
                first_may_end.wait(BOUND_S * 2)
            elif calls == 2:
                release_second.wait(BOUND_S * 2)
            durable()

        storage.fsync = scripted_fsync  # type: ignore[method-assign]
        first = asyncio.ensure_future(broker.produce("rounds", 0, batch_of(b"a"), "all"))
        await asyncio.wait_for(in_first.wait(), BOUND_S)
        second = asyncio.ensure_future(broker.produce("rounds", 0, batch_of(b"b"), "all"))
        await asyncio.sleep(0.05)  # the second write is queued for the next round
        first_may_end.set()
        try:
            first_offset = await asyncio.wait_for(first, BOUND_S)
            assert not second.done()  # its fsync is held: the first ack did not wait for it
        finally:
            release_second.set()
        assert await asyncio.wait_for(second, BOUND_S) == first_offset + 1
    finally:
        await broker.stop()


class HeldFsync:
    """Makes one log's fsync wait (on its disk thread) until `release` is set."""

    def __init__(self, storage: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.entered = asyncio.Event()
        self.release = threading.Event()
        durable = storage.fsync

        def held() -> None:
            loop.call_soon_threadsafe(self.entered.set)
            self.release.wait(BOUND_S * 2)
            durable()

        storage.fsync = held


async def two_warm_partitions(tmp_path: Path, topic: str) -> tuple[Broker, dict[int, Any]]:
    (broker,) = await start_all(configs(tmp_path, 1))
    await broker.create_topic(topic, 2, 1, {})
    for partition in (0, 1):
        await broker.produce(topic, partition, batch_of(b"warm"), "all")
    return broker, {replica.partition: replica for replica in broker.partitions.values()}


async def test_an_ack_does_not_wait_for_another_partitions_fsync(tmp_path: Path) -> None:
    broker, replicas = await two_warm_partitions(tmp_path, "pipelined")
    try:
        held = HeldFsync(
            broker.runtime.groups[replicas[0].group].storage, asyncio.get_running_loop()
        )
        slow = asyncio.ensure_future(broker.produce("pipelined", 0, batch_of(b"a"), "all"))
        try:
            await asyncio.wait_for(held.entered.wait(), BOUND_S)
            await asyncio.wait_for(broker.produce("pipelined", 1, batch_of(b"b"), "all"), BOUND_S)
            assert not slow.done()  # partition 0's fsync is still held
        finally:
            held.release.set()
        await asyncio.wait_for(slow, BOUND_S)
    finally:
        await broker.stop()


async def test_a_small_fetch_reads_on_the_loop_while_another_partition_is_on_disk(
    tmp_path: Path,
) -> None:
    broker, replicas = await two_warm_partitions(tmp_path, "reads")
    try:
        held = HeldFsync(
            broker.runtime.groups[replicas[0].group].storage, asyncio.get_running_loop()
        )
        read_on: list[threading.Thread] = []
        log = replicas[1].log
        read = log.read

        def recorded_read(*args: object) -> bytes:
            read_on.append(threading.current_thread())
            return read(*args)

        log.read = recorded_read  # type: ignore[method-assign]
        slow = asyncio.ensure_future(broker.produce("reads", 0, batch_of(b"a"), "all"))
        try:
            await asyncio.wait_for(held.entered.wait(), BOUND_S)
            batches, _, _ = await broker.fetch("reads", 1, 0, 1 << 16, 0)
            assert batches
            assert read_on == [threading.main_thread()]
        finally:
            held.release.set()
        await asyncio.wait_for(slow, BOUND_S)
    finally:
        await broker.stop()
