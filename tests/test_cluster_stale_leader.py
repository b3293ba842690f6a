"""In-process 3-node clusters: a node whose idea of a partition's leader went stale while its
links were cut (the partition's replicas elected without it) neither holds a request waiting
for that leader nor keeps that idea after the links come back.

The topic has 2 replicas, so the third node holds none and knows the leader only from what the
leaders announce. Cuts hold node-to-node frames back for a minute: the links fall silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest
from inproc_harness import HttpCluster, http_cluster, wait_for
from test_node_cluster import batch_of, produce_anywhere

from raftline.node.broker import Broker, BrokerError
from raftline.node.netfaults import LinkFaults

pytestmark = pytest.mark.timeout(120)

TOPIC = "stale"
CUT = LinkFaults(delay_ms=60_000)  # frames wait longer than any test runs: a silent link


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[HttpCluster]:
    async with http_cluster(tmp_path, 3) as started:
        yield started


def cut(a: Broker, b: Broker) -> None:
    """Silence the link between `a` and `b` both ways (other cuts of theirs stay)."""
    for one, other in ((a, b), (b, a)):
        faults = one.runtime.transport.link_faults
        peers = set() if faults is None or faults.peers is None else set(faults.peers)
        one.runtime.transport.link_faults = LinkFaults(
            delay_ms=CUT.delay_ms, peers=frozenset(peers | {other.node_id})
        )


def heal(brokers: list[Broker]) -> None:
    for broker in brokers:
        broker.runtime.transport.link_faults = None


async def written_topic(
    brokers: list[Broker], replication_factor: int
) -> tuple[str, Sequence[int], Broker]:
    """(Raft group, replicas, leader) of a new 1-partition topic TOPIC, written to once."""
    await brokers[0].create_topic(TOPIC, 1, replication_factor, {})
    await produce_anywhere(brokers, TOPIC, batch_of(b"warm"))
    topic = brokers[0].meta.state.topics[TOPIC]
    group, replicas = topic.group(0), topic.replicas[0]
    leader = next(b for b in brokers if b.runtime.leader_view.leader_of(group) == b.node_id)
    return group, replicas, leader


async def placed_topic(cluster: HttpCluster) -> tuple[Broker, Broker, Broker]:
    """(leader, follower, the node holding no replica) of a 1-partition RF 2 topic, written to."""
    brokers = cluster.brokers
    group, replicas, leader = await written_topic(brokers, 2)
    follower = next(b for b in brokers if b.node_id in replicas and b is not leader)
    outsider = next(b for b in brokers if b.node_id not in replicas)
    await wait_for(lambda: outsider.runtime.leader_view.leader_of(group) == leader.node_id)
    return leader, follower, outsider


async def produce_via(cluster: HttpCluster, broker: Broker) -> tuple[int, dict]:
    url = cluster.url_of(broker)
    body = {"acks": "all", "messages": [{"value": "v", "partition": 0}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/topics/{TOPIC}/messages", json=body) as reply,
    ):
        return reply.status, await reply.json()


async def test_a_leader_that_says_it_no_longer_leads_is_asked_once_then_503_at_once(
    cluster: HttpCluster,
) -> None:
    leader, follower, outsider = await placed_topic(cluster)
    group = outsider.meta.state.topics[TOPIC].group(0)
    # The replicas lose each other; the outsider still reaches both, so an election looks
    # possible to it, and it still takes the deposed leader for the leader.
    cut(leader, follower)
    # A write keeps the group awake (a quiet group keeps its leader until woken): the leader
    # finds its quorum gone and steps down; the write cannot commit.
    stuck = asyncio.ensure_future(leader.produce(TOPIC, 0, batch_of(b"lost"), "all"))
    await wait_for(lambda: leader.runtime.groups[group].role != "leader")
    with contextlib.suppress(BrokerError):
        await stuck
    assert outsider.runtime.leader_view.leader_of(group) == leader.node_id
    forwards = outsider.counters["forwarded_requests"]
    started = time.monotonic()
    status, body = await produce_via(cluster, outsider)
    took = time.monotonic() - started
    assert status == 503 and body["error"]["code"] == "leader_unavailable", body
    assert outsider.counters["forwarded_requests"] - forwards == 1
    # Not held for the election timeout it used to wait out, asking the same node again.
    assert took < outsider.router.election_timeout_s / 2, took


async def test_a_node_learns_a_leadership_won_while_its_link_was_silent_when_the_link_revives(
    cluster: HttpCluster,
) -> None:
    leader, follower, outsider = await placed_topic(cluster)
    group = outsider.meta.state.topics[TOPIC].group(0)
    cut(outsider, leader)
    cut(outsider, follower)
    transport = outsider.runtime.transport
    await wait_for(lambda: not transport.alive(leader.node_id))
    await wait_for(lambda: not transport.alive(follower.node_id))
    leader.runtime.transfer_leadership(group, follower.node_id)
    await wait_for(lambda: follower.runtime.groups[group].role == "leader")
    heal(cluster.brokers)  # the same connections carry frames again: the links revive
    await wait_for(
        lambda: outsider.runtime.leader_view.leader_of(group) == follower.node_id, timeout=5
    )
    status, body = await produce_via(cluster, outsider)
    assert status == 200, body
