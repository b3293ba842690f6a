"""A log that cannot be written stops the node's Raft driver and acknowledges nothing.

An fsync error leaves the page cache in an unknown state (fsyncgate): retrying could report as
durable a write the disk dropped, so the runtime treats it as fatal.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from inproc_harness import configs, start_all
from test_node_cluster import batch_of

pytestmark = pytest.mark.timeout(60)

BOUND_S = 5.0


async def test_an_fsync_error_stops_the_driver_without_acknowledging_the_write(
    tmp_path: Path,
) -> None:
    (broker,) = await start_all(configs(tmp_path, 1))
    try:
        await broker.create_topic("failing", 1, 1, {})
        await broker.produce("failing", 0, batch_of(b"warm"), "all")
        [group] = broker.partitions
        storage = broker.runtime.groups[group].storage

        def broken_fsync() -> None:
            raise OSError(5, "Input/output error")

        storage.fsync = broken_fsync  # type: ignore[method-assign]
        write = asyncio.ensure_future(broker.produce("failing", 0, batch_of(b"lost"), "all"))
        driver = broker.runtime.driver
        assert driver is not None
        with pytest.raises(OSError):
            await asyncio.wait_for(asyncio.shield(driver), BOUND_S)
        assert not write.done() or write.exception() is not None
        write.cancel()
    finally:
        await broker.stop()
