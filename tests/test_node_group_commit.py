"""Group commit on a leader: an acknowledgement waits only for its own write's fsync.

A write that arrives while an earlier one is being fsynced goes to disk in the next round; the
earlier write's ack must not wait for that next fsync too, and no ack waits for the fsync of
another partition's write.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from inproc_harness import configs, start_all
from test_node_cluster import batch_of

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


async def test_an_ack_does_not_wait_for_another_partitions_fsync(tmp_path: Path) -> None:
    (broker,) = await start_all(configs(tmp_path, 1))
    loop = asyncio.get_running_loop()
    try:
        await broker.create_topic("pipelined", 2, 1, {})
        for partition in (0, 1):
            await broker.produce("pipelined", partition, batch_of(b"warm"), "all")
        held = next(
            broker.runtime.groups[g].storage
            for g, replica in broker.partitions.items()
            if replica.partition == 0
        )
        in_fsync = asyncio.Event()
        release = threading.Event()
        durable = held.fsync

        def held_fsync() -> None:
            loop.call_soon_threadsafe(in_fsync.set)
            release.wait(BOUND_S * 2)
            durable()

        held.fsync = held_fsync  # type: ignore[method-assign]
        slow = asyncio.ensure_future(broker.produce("pipelined", 0, batch_of(b"a"), "all"))
        try:
            await asyncio.wait_for(in_fsync.wait(), BOUND_S)
            await asyncio.wait_for(broker.produce("pipelined", 1, batch_of(b"b"), "all"), BOUND_S)
            assert not slow.done()  # partition 0's fsync is still held
        finally:
            release.set()
        await asyncio.wait_for(slow, BOUND_S)
    finally:
        await broker.stop()


async def test_a_small_fetch_reads_on_the_loop_while_another_partition_is_on_disk(
    tmp_path: Path,
) -> None:
    (broker,) = await start_all(configs(tmp_path, 1))
    loop = asyncio.get_running_loop()
    try:
        await broker.create_topic("reads", 2, 1, {})
        for partition in (0, 1):
            await broker.produce("reads", partition, batch_of(b"warm"), "all")
        replicas = {replica.partition: replica for replica in broker.partitions.values()}
        held = broker.runtime.groups[replicas[0].group].storage
        in_fsync = asyncio.Event()
        release = threading.Event()
        durable = held.fsync

        def held_fsync() -> None:
            loop.call_soon_threadsafe(in_fsync.set)
            release.wait(BOUND_S * 2)
            durable()

        read_on: list[threading.Thread] = []
        log = replicas[1].log
        read = log.read

        def recorded_read(*args: object) -> bytes:
            read_on.append(threading.current_thread())
            return read(*args)

        held.fsync = held_fsync  # type: ignore[method-assign]
        log.read = recorded_read  # type: ignore[method-assign]
        slow = asyncio.ensure_future(broker.produce("reads", 0, batch_of(b"a"), "all"))
        try:
            await asyncio.wait_for(in_fsync.wait(), BOUND_S)
            batches, _, _ = await broker.fetch("reads", 1, 0, 1 << 16, 0)
            assert batches
            assert read_on == [threading.main_thread()]
        finally:
            release.set()
        await asyncio.wait_for(slow, BOUND_S)
    finally:
        await broker.stop()
