"""A partition replica that is closed (topic deleted, replica moved) ends every wait on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from inproc_harness import configs, start_all, wait_for

from raftline.node.errors import BrokerError

pytestmark = pytest.mark.timeout(60)


async def test_a_wait_for_commit_ends_with_a_retryable_error_when_the_replica_closes(
    tmp_path: Path,
) -> None:
    [broker] = await start_all(configs(tmp_path, 1))
    try:
        await broker.create_topic("closing", 1, 1, {})
        await wait_for(lambda: any(r.role == "leader" for r in broker.partitions.values()))
        [replica] = [r for r in broker.partitions.values() if r.topic == "closing"]
        waiting = asyncio.create_task(replica.until_committed(replica.high_watermark + 1000))
        await asyncio.sleep(0.05)
        replica.close()
        with pytest.raises(BrokerError) as caught:
            await asyncio.wait_for(waiting, 5)
        assert caught.value.code == "leader_unavailable"
    finally:
        await broker.stop()
