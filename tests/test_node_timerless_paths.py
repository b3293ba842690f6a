"""Produce, replication, commit and the long-poll wake-up never wait for the node's timer.

The brokers here tick once a minute: anything that waited for a tick would take that long.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from inproc_harness import configs, wait_for
from test_node_cluster import batch_of, leader_of, values

from raftline.node.broker import Broker
from raftline.node.metadata import META_GROUP

pytestmark = pytest.mark.timeout(60)

TICK_MS = 60_000
BOUND_S = 5.0  # far below one tick, far above any loaded machine's round trip


@pytest.fixture
async def slow_ticking(tmp_path: Path) -> AsyncIterator[list[Broker]]:
    """Three brokers whose timer ticks once a minute; node 1 campaigns for the metadata."""
    cfgs = configs(tmp_path, 3)
    for cfg in cfgs:
        cfg.tick_ms = TICK_MS
    brokers = [Broker(c) for c in cfgs]
    for broker in brokers:
        await broker.start()
    # Without ticks nothing retries a lost vote request: campaign once every link is up.
    await wait_for(lambda: all(brokers[0].runtime.transport.alive(b.node_id) for b in brokers))
    brokers[0].runtime.campaign(META_GROUP)
    await wait_for(lambda: all(b.ready() for b in brokers), timeout=BOUND_S * 2)
    yield brokers
    for broker in brokers:
        await broker.stop()


async def test_acks_all_write_to_three_replicas_commits_without_a_tick(
    slow_ticking: list[Broker],
) -> None:
    await slow_ticking[0].create_topic("fast", 1, 3, {})
    leader = leader_of(slow_ticking, "fast")
    offset = await asyncio.wait_for(leader.produce("fast", 0, batch_of(b"a"), "all"), BOUND_S)
    batches, _, high_watermark = await leader.fetch("fast", 0, offset, 1 << 20, 0)
    assert values(batches) == [b"a"] and high_watermark == offset + 1


async def test_waiting_long_poll_returns_the_commit_without_a_tick(
    slow_ticking: list[Broker],
) -> None:
    await slow_ticking[0].create_topic("poll", 1, 3, {})
    leader = leader_of(slow_ticking, "poll")
    end = await asyncio.wait_for(leader.produce("poll", 0, batch_of(b"x"), "all"), BOUND_S) + 1
    poll = asyncio.ensure_future(leader.fetch("poll", 0, end, 1 << 20, 30_000))
    await asyncio.sleep(0.05)
    assert not poll.done()
    await asyncio.wait_for(leader.produce("poll", 0, batch_of(b"y"), "all"), BOUND_S)
    batches, _, _ = await asyncio.wait_for(poll, BOUND_S)
    assert values(batches) == [b"y"]


async def test_a_follower_stores_a_write_while_the_leaders_fsync_still_runs(
    slow_ticking: list[Broker],
) -> None:
    await slow_ticking[0].create_topic("parallel", 1, 3, {})
    leader = leader_of(slow_ticking, "parallel")
    await asyncio.wait_for(leader.produce("parallel", 0, batch_of(b"warm"), "all"), BOUND_S)
    [group] = leader.partitions
    storage = leader.runtime.groups[group].storage
    followers = [b.runtime for b in slow_ticking if b is not leader]
    before = storage.last_index()
    release = threading.Event()
    durable = storage.fsync

    def held_fsync() -> None:
        release.wait(BOUND_S * 2)
        durable()

    storage.fsync = held_fsync  # type: ignore[method-assign]
    write = asyncio.ensure_future(leader.produce("parallel", 0, batch_of(b"b"), "all"))
    try:
        # Any follower: without ticks, one may not even have learned of the topic yet.
        await wait_for(
            lambda: any(
                group in f.groups and f.groups[group].storage.last_index() > before
                for f in followers
            ),
            BOUND_S,
        )
    finally:
        release.set()
    assert await asyncio.wait_for(write, BOUND_S) == before + 1
