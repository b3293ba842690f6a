"""Real 3-node clusters: leader kills lose no acknowledged message and producing resumes fast.

Each test starts `raftline serve` processes on loopback (see cluster_harness) and bounds itself.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cluster_harness import (
    Cluster,
    ContinuousProducer,
    check_acked_once_in_order,
    http_json,
    read_partition,
    replica_values,
    running_cluster,
    wait_for_replicas,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _kill_produce_restart(cluster: Cluster, victim_id: int, topic: str) -> tuple[float, list[str]]:
    """Produce continuously, SIGKILL `victim_id`, restart it; returns (resume seconds, acked).

    Producing must resume (first_ack_after fails otherwise); the measured time is printed, and
    bench/http_failover.py holds the 5-second target."""
    producer = ContinuousProducer(cluster, topic).start()
    try:
        producer.wait_for_acks(50)
        victim = cluster.node(victim_id)
        killed_at = time.monotonic()
        victim.kill()
        resumed_after = producer.first_ack_after(killed_at)
        producer.wait_for_acks(len(producer.acked) + 50)
        victim.start()
        cluster.wait_ready([victim])
        producer.wait_for_acks(len(producer.acked) + 50)
    finally:
        producer.stop()
    print(f"\nproducing resumed {resumed_after:.3f} s after SIGKILL of node {victim_id}")
    return resumed_after, [value for value, *_ in producer.acked]


def _check_every_replica(cluster: Cluster, topic: str, acked: list[str]) -> None:
    committed = [m["value"] for m in read_partition(cluster.nodes[0], topic, 0)]
    check_acked_once_in_order(acked, committed, "the committed log read through node 1")
    # Followers may still be catching up: wait for them, then read each node's own copy from
    # disk after a clean stop.
    wait_for_replicas(cluster, topic, 0, acked)
    cluster.close()
    for node in cluster.nodes:
        copy = replica_values(node, topic, 0)
        check_acked_once_in_order(acked, copy, f"node {node.node_id}'s copy on disk")


def test_partition_leader_sigkill_loses_no_acknowledged_message(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        leader = cluster.wait_for_leader("orders", 0)
        _, acked = _kill_produce_restart(cluster, leader, "orders")
        _check_every_replica(cluster, "orders", acked)


def test_metadata_leader_sigkill_loses_no_acknowledged_message(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        controller = cluster.controller()
        _, acked = _kill_produce_restart(cluster, controller, "orders")
        assert cluster.controller() in {1, 2, 3}
        cluster.create_topic("after-failover")
        _check_every_replica(cluster, "orders", acked)


def test_restarting_every_node_keeps_every_topic_and_message(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("first", partitions=2)
        cluster.create_topic("second")
        sent = {("first", 0): ["a", "b"], ("first", 1): ["c"], ("second", 0): ["d", "e", "f"]}
        for (topic, partition), values in sent.items():
            messages = [{"value": v, "partition": partition} for v in values]
            status, body = http_json(
                f"{cluster.nodes[1].url}/v1/topics/{topic}/messages",
                "POST",
                {"messages": messages},
                timeout=15,
            )
            assert status == 200, body
        for node in cluster.nodes:
            node.kill()
        for node in cluster.nodes:
            node.start()
        cluster.wait_ready()
        status, listed = http_json(f"{cluster.nodes[2].url}/v1/topics")
        assert sorted(t["name"] for t in listed["topics"]) == ["first", "second"]
        for (topic, partition), values in sent.items():
            cluster.wait_for_leader(topic, partition)
            stored = [m["value"] for m in read_partition(cluster.nodes[2], topic, partition)]
            assert stored == values


def test_partition_without_a_majority_answers_leader_unavailable(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        leader = cluster.wait_for_leader("orders", 0)
        survivor = cluster.node(leader)
        for node in cluster.nodes:
            if node is not survivor:
                node.kill()
        time.sleep(1.0)
        request = urllib.request.Request(
            f"{survivor.url}/v1/topics/orders/messages",
            data=json.dumps({"messages": [{"value": "x"}]}).encode(),
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        body = json.loads(info.value.read())
        assert info.value.code in (503, 504), body
        assert body["error"]["code"] in ("leader_unavailable", "not_enough_replicas", "timeout")
        assert body["error"]["retryable"] is True
        if body["error"]["code"] == "leader_unavailable":
            assert info.value.headers["Retry-After"]


KILL_ROUNDS = 8


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repeated_leader_sigkills_lose_no_acknowledged_message(tmp_path: Path) -> None:
    """Rounds of SIGKILL and restart, alternating the partition leader and the controller;
    a round starts as soon as the previous victim is ready, possibly still catching up."""
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("orders")
        producer = ContinuousProducer(cluster, "orders").start()
        try:
            for round_number in range(KILL_ROUNDS):
                producer.wait_for_acks(len(producer.acked) + 30)
                if round_number % 2 == 0:
                    victim = cluster.node(cluster.wait_for_leader("orders", 0))
                else:
                    victim = cluster.node(cluster.controller())
                killed_at = time.monotonic()
                victim.kill()
                producer.first_ack_after(killed_at)
                victim.start()
                cluster.wait_ready([victim])
            producer.wait_for_acks(len(producer.acked) + 30)
        finally:
            producer.stop()
        _check_every_replica(cluster, "orders", [value for value, *_ in producer.acked])
