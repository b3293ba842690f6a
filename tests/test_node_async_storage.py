"""Asynchronous storage writes on a leader: its own fsync does not hold back what a quorum of
followers already made durable.

A leader whose write is on disk goes on taking acknowledgements and, once the write's entries
are in its log file, writing and replicating the next batches beside its fsync; a batch that two
followers fsynced commits, is acknowledged and is readable once the leader's copy is in its log
file, whether or not the leader's fsync has returned.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any

import pytest
from inproc_harness import wait_for
from test_node_cluster import batch_of, leader_of, produce_anywhere, values
from test_node_group_commit import BOUND_S, HeldFsync

from raftline.node.broker import Broker
from raftline.node.group import GroupStorage, Replica
from raftline.node.partition import PartitionReplica
from raftline.raftlog.types import Entry

pytestmark = pytest.mark.timeout(60)


async def hold_leaders_fsync(cluster: list[Broker], topic: str) -> tuple[Broker, HeldFsync]:
    """A topic of one partition on three replicas whose leader's next fsync is held."""
    await cluster[0].create_topic(topic, 1, 3, {})
    await produce_anywhere(cluster, topic, batch_of(b"warm"))
    leader = leader_of(cluster, topic)
    group = leader.meta.state.topics[topic].group(0)
    return leader, HeldFsync(leader.runtime.groups[group].storage, asyncio.get_running_loop())


async def test_an_acks_all_write_commits_while_the_leaders_own_fsync_is_held(
    cluster: list[Broker],
) -> None:
    leader, held = await hold_leaders_fsync(cluster, "async")
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
    leader, held = await hold_leaders_fsync(cluster, "ordered")
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
    group = leader.meta.state.topics["ordered"].group(0)
    for follower in cluster:
        if follower is not leader:
            replica = next(r for r in follower.partitions.values() if r.group == group)
            await asyncio.wait_for(_caught_up(replica, offsets[-1] + 1), BOUND_S)


async def _caught_up(replica: PartitionReplica, end: int) -> None:
    while replica.high_watermark < end:
        await asyncio.sleep(0.01)


def jittery(storage: GroupStorage, fsync_s: float) -> None:
    """Random delays in a log's appends and fsyncs (they run on the disk threads), so that a
    leader's writes overlap, return out of order and race its followers'."""
    append, fsync = storage.append, storage.fsync

    def slow_append(entries: Any) -> Any:
        time.sleep(random.uniform(0, 0.002))
        return append(entries)

    def slow_fsync() -> None:
        time.sleep(random.uniform(0, fsync_s))
        fsync()

    storage.append = slow_append  # type: ignore[method-assign]
    storage.fsync = slow_fsync  # type: ignore[method-assign]


def record_applied(replica: Replica) -> list[Entry]:
    """The entries the runtime hands the replica to apply, in the order it does."""
    applied: list[Entry] = []
    on_commit = replica.on_commit

    def recording(entries: list[Entry]) -> None:
        applied.extend(entries)
        on_commit(entries)

    replica.on_commit = recording  # type: ignore[method-assign]
    return applied


def stored_values(replica: PartitionReplica, upto: int) -> list[bytes]:
    batches, offset = [], 0
    while offset < upto:
        data, offset = replica.log.read_from(offset, 1 << 20, upto)
        batches.append(data)
    return values(batches)


async def test_under_random_disk_latency_every_acknowledged_write_is_stored_once_in_order(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("jitter", 2, 3, {})
    await produce_anywhere(cluster, "jitter", batch_of(b"warm"))
    topic = cluster[0].meta.state.topics["jitter"]
    groups = [topic.group(0), topic.group(1)]
    for broker in cluster:
        await wait_for(lambda b=broker: all(g in b.runtime.groups for g in groups), BOUND_S)
    await produce_anywhere(cluster, "jitter", batch_of(b"warm"), 1)  # partition 1 has a leader
    applied: list[list[Entry]] = []
    for broker in cluster:
        for group in groups:
            local = broker.runtime.groups[group]
            # Leaders' fsyncs mostly end last: their next writes then start beside them.
            jittery(local.storage, 0.03 if local.role == "leader" else 0.008)
            applied.append(record_applied(local.replica))

    async def writer(partition: int, name: bytes) -> list[tuple[int, bytes]]:
        acked = []
        for i in range(12):
            payload = b"%s-%d" % (name, i)
            batch = batch_of(payload)
            acked.append((await produce_anywhere(cluster, "jitter", batch, partition), payload))
        return acked

    writers = [(p, b"p%dw%d" % (p, w)) for p in (0, 1) for w in range(12)]
    runs = await asyncio.wait_for(asyncio.gather(*(writer(p, n) for p, n in writers)), 30)
    for run in runs:
        assert [o for o, _ in run] == sorted(o for o, _ in run)  # each writer's order kept
    for partition, group in enumerate(groups):
        acked = [
            a for (p, _), run in zip(writers, runs, strict=True) if p == partition for a in run
        ]
        end = max(offset for offset, _ in acked) + 1
        replicas = [next(r for r in b.partitions.values() if r.group == group) for b in cluster]
        for replica in replicas:
            await asyncio.wait_for(_caught_up(replica, end), BOUND_S)
            stored = [v for v in stored_values(replica, end) if v != b"warm"]
            assert sorted(stored) == sorted(payload for _, payload in acked)  # each once
            for offset, payload in acked:
                assert values([replica.log.read(offset, 1, offset + 1)]) == [payload]
    for entries in applied:  # every replica applied its entries once each, in offset order
        assert all(b.index == a.last_index + 1 for a, b in itertools.pairwise(entries))
