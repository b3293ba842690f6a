"""In-process 4-node cluster: a node whose link to a partition's leader has been down for an
election timeout, while the other replicas still follow that leader, answers at once rather
than wait for an election that is not coming.

The topic has 3 replicas, so the fourth node holds none: it reaches a majority of the replicas
(the two followers), and an election looks possible to it, yet none is coming.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from inproc_harness import http_cluster, wait_for
from test_cluster_stale_leader import cut, produce_via, written_topic

pytestmark = pytest.mark.timeout(120)


async def test_a_node_whose_link_to_the_known_leader_stayed_down_answers_503_at_once(
    tmp_path: Path,
) -> None:
    async with http_cluster(tmp_path, 4) as cluster:
        brokers = cluster.brokers
        group, replicas, leader = await written_topic(brokers, 3)
        outsider = next(b for b in brokers if b.node_id not in replicas)
        await wait_for(lambda: outsider.runtime.leader_view.leader_of(group) == leader.node_id)
        assert (await produce_via(cluster, outsider))[0] == 200  # its topic cache is warm
        cut(outsider, leader)
        await wait_for(lambda: not outsider.runtime.transport.alive(leader.node_id))
        # Long enough for a dead leader's group to have elected another one.
        await asyncio.sleep(outsider.router.election_timeout_s)
        assert outsider.runtime.leader_view.reaches_majority(replicas)
        # the others follow it
        assert outsider.runtime.leader_view.leader_of(group) == leader.node_id
        started = time.monotonic()
        status, body = await produce_via(cluster, outsider)
        took = time.monotonic() - started
        assert status == 503 and body["error"]["code"] == "leader_unavailable", body
        assert body["error"]["retryable"] is True, body
        # Not held for another election timeout, waiting for an election that is not coming.
        assert took < outsider.router.election_timeout_s / 2, took
