"""In-process 5-node cluster split in two: the nodes of the majority side answer a send for a
partition whose quorum is on the minority side with a 503 at once, not after an election timeout.

Issue 21's chaos criterion counts the sends of the majority side during such a split: held
sends there stall the clients that made them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from inproc_harness import http_cluster, wait_for
from test_cluster_stale_leader import cut, produce_via, written_topic

pytestmark = pytest.mark.timeout(120)


async def test_the_majority_side_answers_a_send_for_a_minority_side_quorum_at_once(
    tmp_path: Path,
) -> None:
    async with http_cluster(tmp_path, 5) as cluster:
        brokers = cluster.brokers
        group, replicas, leader = await written_topic(brokers, 3)
        # The leader and one follower on the minority side: the group keeps its quorum there.
        follower = next(b for b in brokers if b.node_id in replicas and b is not leader)
        minority = [leader, follower]
        majority = [b for b in brokers if b not in minority]
        for node in majority:
            await wait_for(
                lambda node=node: node.runtime.leader_view.leader_of(group) == leader.node_id
            )
            assert (await produce_via(cluster, node))[0] == 200  # its topic cache is warm
        for near in majority:
            for far in minority:
                cut(near, far)
        for node in majority:
            for far in minority:
                await wait_for(lambda n=node, f=far: not n.runtime.transport.alive(f.node_id))
        for node in majority:
            started = time.monotonic()
            status, body = await produce_via(cluster, node)
            took = time.monotonic() - started
            assert status == 503 and body["error"]["code"] == "leader_unavailable", body
            assert took < node.router.election_timeout_s / 2, (node.node_id, took)
        assert (await produce_via(cluster, leader))[0] == 200  # still written on its side
