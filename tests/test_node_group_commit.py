"""Group commit on a leader: an acknowledgement waits only for its own write's fsync.

A write that arrives while an earlier one is being fsynced goes to disk in the next round; the
earlier write's ack must not wait for that next fsync too.
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
