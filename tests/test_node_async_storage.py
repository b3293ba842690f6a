"""Asynchronous storage writes on a leader: its own fsync does not hold back what a quorum of
followers already made durable.

A leader whose write is on disk goes on taking acknowledgements and, once the write's entries
are in its log file, writing and replicating the next batches beside its fsync; a batch that two
followers fsynced commits, is acknowledged and is readable once the leader's copy is in its log
file, whether or not the leader's fsync has returned.
"""

from __future__ import annotations

import asyncio

import pytest
from test_node_cluster import batch_of, leader_of, produce_anywhere, values
from test_node_group_commit import BOUND_S, HeldFsync

from raftline.node.broker import Broker
from raftline.node.partition import PartitionReplica

pytestmark = pytest.mark.timeout(60)


async def test_an_acks_all_write_commits_while_the_leaders_own_fsync_is_held(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("async", 1, 3, {})
    await produce_anywhere(cluster, "async", batch_of(b"warm"))
    leader = leader_of(cluster, "async")
    group = leader.meta.state.topics["async"].group(0)
    held = HeldFsync(leader.runtime.groups[group].storage, asyncio.get_running_loop())
    try:
        write = asyncio.ensure_future(leader.produce("async", 0, batch_of(b"a"), "all"))
        await asyncio.wait_for(held.entered.wait(), BOUND_S)
        offset = await asyncio.wait_for(write, BOUND_S)
        batches, _, high_watermark = await leader.fetch("async", 0, offset, 1 << 20, 0)
        assert values(batches) == [b"a"]
        assert high_watermark == offset + 1
        assert not held.release.is_set()  # the leader's fsync never returned meanwhile
    finally:
        held.release.set()


async def test_the_next_write_is_replicated_and_acknowledged_beside_a_held_leader_fsync(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("ordered", 1, 3, {})
    await produce_anywhere(cluster, "ordered", batch_of(b"warm"))
    leader = leader_of(cluster, "ordered")
    group = leader.meta.state.topics["ordered"].group(0)
    held = HeldFsync(leader.runtime.groups[group].storage, asyncio.get_running_loop())
    try:
        first = asyncio.ensure_future(leader.produce("ordered", 0, batch_of(b"x0"), "all"))
        await asyncio.wait_for(held.entered.wait(), BOUND_S)
        offsets = [await asyncio.wait_for(first, BOUND_S)]
        # Written beside the held fsync and made durable by the followers.
        second = leader.produce("ordered", 0, batch_of(b"x1"), "all")
        offsets.append(await asyncio.wait_for(second, BOUND_S))
        assert not held.release.is_set()
        later = [
            asyncio.ensure_future(leader.produce("ordered", 0, batch_of(b"x%d" % i), "all"))
            for i in range(2, 6)
        ]
    finally:
        held.release.set()
    offsets += await asyncio.wait_for(asyncio.gather(*later), BOUND_S)
    assert offsets == list(range(offsets[0], offsets[0] + 6))
    batches, _, _ = await leader.fetch("ordered", 0, offsets[0], 1 << 20, 0)
    assert values(batches) == [b"x%d" % i for i in range(6)]
    for follower in cluster:
        if follower is not leader:
            replica = next(r for r in follower.partitions.values() if r.group == group)
            await asyncio.wait_for(_caught_up(replica, offsets[-1] + 1), BOUND_S)


async def _caught_up(replica: PartitionReplica, end: int) -> None:
    while replica.high_watermark < end:
        await asyncio.sleep(0.01)
