"""Real 3-node clusters: a silent leader or a lost majority never holds a client's request.

A paused (SIGSTOPped) node keeps its connections open and answers nothing, as a node cut off
by the network does. Clients here give up after 3 s, as in issue 21's failover target; each
request must be answered (a result or a retryable 503) before that.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, Node, http_json, paused, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

CLIENT_TIMEOUT_S = 3.0


def produce(node: Node, topic: str, value: str) -> tuple[int, Any]:
    body = {"acks": "all", "messages": [{"value": value, "partition": 0}]}
    return http_json(
        f"{node.url}/v1/topics/{topic}/messages", "POST", body, timeout=CLIENT_TIMEOUT_S
    )


def assert_retryable_unavailable(status: int, body: Any) -> None:
    assert status == 503, body
    assert body["error"]["code"] == "leader_unavailable", body
    assert body["error"]["retryable"] is True


def followers(cluster: Cluster, leader: int) -> list[Node]:
    return [n for n in cluster.nodes if n.node_id != leader]


def test_a_write_forwarded_to_a_leader_that_falls_silent_is_answered_in_time(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        leader = cluster.wait_for_leader("orders", 0)
        via = followers(cluster, leader)[0]
        assert produce(via, "orders", "before")[0] == 200
        with paused(cluster.node(leader)):
            # The follower still sees the leader alive and forwards; the leader never answers.
            status, body = produce(via, "orders", "during")
            if status != 200:  # a new leader may already have taken the forwarded write
                assert_retryable_unavailable(status, body)


def test_a_read_forwarded_to_a_leader_that_falls_silent_goes_to_the_new_leader(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        leader = cluster.wait_for_leader("orders", 0)
        via = followers(cluster, leader)[0]
        assert produce(via, "orders", "kept")[0] == 200
        with paused(cluster.node(leader)):
            status, body = http_json(
                f"{via.url}/v1/topics/orders/partitions/0/messages?offset=0",
                timeout=CLIENT_TIMEOUT_S,
            )
        assert status == 200, body
        assert [m["value"] for m in body["messages"]] == ["kept"]


def test_a_node_cut_off_from_the_majority_answers_every_request_with_a_503(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        leader = cluster.wait_for_leader("orders", 0)
        alone = cluster.node(leader)
        with paused(*followers(cluster, leader)):
            assert_retryable_unavailable(*produce(alone, "orders", "lost-majority"))
            # Now it no longer leads; a lookup of metadata and a read fail as fast.
            assert_retryable_unavailable(*produce(alone, "orders", "after"))
            assert_retryable_unavailable(
                *http_json(f"{alone.url}/v1/topics/orders", timeout=CLIENT_TIMEOUT_S)
            )
            started = time.monotonic()
            assert_retryable_unavailable(
                *http_json(
                    f"{alone.url}/v1/topics/orders/partitions/0/messages?offset=0",
                    timeout=CLIENT_TIMEOUT_S,
                )
            )
            # It knows it cannot reach a majority: no waiting for an election at all.
            assert time.monotonic() - started < 0.5


def test_a_metadata_leader_cut_off_from_the_majority_answers_a_topic_lookup_with_a_503(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        status, body = http_json(f"{cluster.nodes[0].url}/v1/cluster", timeout=CLIENT_TIMEOUT_S)
        assert status == 200 and body["controller"] is not None, body
        alone = cluster.node(body["controller"])
        with paused(*followers(cluster, alone.node_id)):
            # Its read barrier needs a quorum's answer: it must not wait for its own step-down.
            assert_retryable_unavailable(
                *http_json(f"{alone.url}/v1/topics/orders", timeout=CLIENT_TIMEOUT_S)
            )
