"""An acks=all produce that does not commit within the request timeout is answered "timeout"."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from inproc_harness import configs, start_all
from test_node_cluster import batch_of
from test_node_group_commit import HeldFsync

from raftline.node.broker import Broker
from raftline.node.errors import BrokerError
from raftline.node.partition import PartitionReplica

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 0.5


async def one_node(tmp_path: Path, topic: str) -> tuple[Broker, PartitionReplica]:
    """A single node with a short request timeout, leading a warm one-partition topic."""
    [config] = configs(tmp_path, 1)
    [broker] = await start_all([dataclasses.replace(config, request_timeout_s=TIMEOUT_S)])
    await broker.create_topic(topic, 1, 1, {})
    await broker.produce(topic, 0, batch_of(b"warm"), "all")
    [replica] = [r for r in broker.partitions.values() if r.topic == topic]
    return broker, replica


async def test_a_write_whose_fsync_outlasts_the_request_timeout_is_answered_timeout(
    tmp_path: Path,
) -> None:
    broker, replica = await one_node(tmp_path, "held")
    held = HeldFsync(broker.runtime.groups[replica.group].storage, asyncio.get_running_loop())
    try:
        started = time.monotonic()
        with pytest.raises(BrokerError) as caught:
            await broker.produce("held", 0, batch_of(b"a"), "all")
        assert caught.value.code == "timeout"
        assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 2
    finally:
        held.release.set()
        await broker.stop()


async def test_a_write_started_after_a_timed_out_one_gets_its_own_full_timeout(
    tmp_path: Path,
) -> None:
    broker, replica = await one_node(tmp_path, "staggered")
    held = HeldFsync(broker.runtime.groups[replica.group].storage, asyncio.get_running_loop())
    try:
        first = asyncio.ensure_future(broker.produce("staggered", 0, batch_of(b"a"), "all"))
        await asyncio.sleep(TIMEOUT_S / 2)
        second = asyncio.ensure_future(broker.produce("staggered", 0, batch_of(b"b"), "all"))
        with pytest.raises(BrokerError):
            await first
        assert not second.done()  # due half a timeout later
        held.release.set()
        assert await asyncio.wait_for(second, 5) > 0  # committed once the fsync returned
    finally:
        held.release.set()
        await broker.stop()


async def test_a_leader_keeps_no_deadline_of_writes_already_acknowledged(tmp_path: Path) -> None:
    broker, replica = await one_node(tmp_path, "acked")
    try:
        for value in range(50):
            await broker.produce("acked", 0, batch_of(str(value).encode()), "all")
        assert len(replica._deadlines) <= 1  # at most the last one, dropped by the next write
    finally:
        await broker.stop()
