"""Asynchronous storage writes on a follower: an APPEND that arrives while its last write fsyncs.

The follower writes it at once, beside that fsync, instead of waiting for the fsync to return and
for the loop to take up its outcome; it still acknowledges each write only once its own fsync
returned, in order. Only its leader's replication in its term is taken beside writes: a new
term (a vote, a new leader's APPEND) waits for them to end.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from inproc_harness import wait_for
from test_node_cluster import batch_of, leader_of, produce_anywhere
from test_node_group_commit import BOUND_S, HeldFsync

from raftline.node.broker import Broker

pytestmark = pytest.mark.timeout(60)


@dataclass
class Replicas:
    leader: Broker
    follower: Broker
    group: str

    def written_through(self) -> int:
        """The last offset in the follower's log file (fsynced or not)."""
        return int(self.follower.runtime.groups[self.group].storage.last_index())

    def acknowledged_through(self) -> int:
        """The last offset the leader counts as durable on the follower."""
        progress = self.leader.runtime.groups[self.group].core.progress(self.follower.node_id)
        assert progress is not None
        return progress.match

    async def produce(self, topic: str, payload: bytes) -> int:
        write = self.leader.produce(topic, 0, batch_of(payload), "all")
        return await asyncio.wait_for(write, BOUND_S)


async def hold_a_followers_fsync(cluster: list[Broker], topic: str) -> tuple[Replicas, HeldFsync]:
    """A topic of one partition on three replicas, warm on all of them, whose first follower's
    next fsyncs wait until the HeldFsync's `release` is set."""
    await cluster[0].create_topic(topic, 1, 3, {})
    warm = await produce_anywhere(cluster, topic, batch_of(b"warm"))
    leader = leader_of(cluster, topic)
    follower = next(b for b in cluster if b is not leader)
    replicas = Replicas(leader, follower, leader.meta.state.topics[topic].group(0))
    await wait_for(lambda: replicas.acknowledged_through() >= warm, BOUND_S)
    storage = follower.runtime.groups[replicas.group].storage
    return replicas, HeldFsync(storage, asyncio.get_running_loop())


async def test_a_follower_writes_an_append_that_arrives_while_its_last_write_fsyncs(
    cluster: list[Broker],
) -> None:
    replicas, held = await hold_a_followers_fsync(cluster, "beside")
    try:
        await replicas.produce("beside", b"a")  # the leader and the other follower have it
        await asyncio.wait_for(held.entered.wait(), BOUND_S)
        second = await replicas.produce("beside", b"b")
        await wait_for(lambda: replicas.written_through() >= second, BOUND_S)
        assert not held.release.is_set()  # the first fsync never returned meanwhile
    finally:
        held.release.set()


async def test_a_follower_acknowledges_a_write_made_beside_an_fsync_only_after_its_own(
    cluster: list[Broker],
) -> None:
    replicas, held = await hold_a_followers_fsync(cluster, "acked")
    try:
        first = await replicas.produce("acked", b"a")
        await asyncio.wait_for(held.entered.wait(), BOUND_S)
        second = await replicas.produce("acked", b"b")
        await wait_for(lambda: replicas.written_through() >= second, BOUND_S)
        assert replicas.acknowledged_through() < first  # nothing it wrote is acknowledged yet
    finally:
        held.release.set()
    await wait_for(lambda: replicas.acknowledged_through() >= second, BOUND_S)


async def test_a_follower_takes_a_new_leaders_term_only_after_its_writes_in_flight_end(
    cluster: list[Broker],
) -> None:
    replicas, held = await hold_a_followers_fsync(cluster, "newterm")
    group = replicas.group
    other = next(b for b in cluster if b not in (replicas.leader, replicas.follower))
    old_term = replicas.follower.runtime.groups[group].core.term
    try:
        await replicas.produce("newterm", b"a")
        await asyncio.wait_for(held.entered.wait(), BOUND_S)
        replicas.leader.runtime.transfer_leadership(group, other.node_id)
        await wait_for(lambda: other.runtime.groups[group].role == "leader", BOUND_S)
        await asyncio.sleep(0.2)  # the new leader's APPENDs reach the follower meanwhile
        assert replicas.follower.runtime.groups[group].core.term == old_term
    finally:
        held.release.set()
    new_term = other.runtime.groups[group].core.term
    await wait_for(lambda: replicas.follower.runtime.groups[group].core.term == new_term, BOUND_S)
