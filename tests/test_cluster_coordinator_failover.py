"""Real 3-node clusters: calls that a coordinator shard's leader serves (consumer groups,
transactions, queues) fail over like produce, never held until the client's timeout.

A coordinator shard lives in an internal topic and its leader may be any node. A paused
(SIGSTOPped) node keeps its connections open and answers nothing, as a node cut off by the
network does. With the shard's leader silent, a call through another node is answered within
the client's 3 s (issue 21): a result from the new leader or a retryable 503. A node cut off
from the majority answers a retryable 503 within an election timeout once it can tell.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, Node, http_json, paused, running_cluster
from cluster_harness import call_until_done as call

from raftline.node.transactions.service import shard_of as txn_shard_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

CLIENT_TIMEOUT_S = 3.0
ELECTION_TIMEOUT_S = 1.0  # the default NodeConfig's longest election timeout
# A loaded 2-core machine delays any answer; a held request waits out 5 s or more.
SLACK_S = 1.0

Call = tuple[str, str, Any]  # method, path, body


def answered_in_time(node: Node, method: str, path: str, body: Any = None) -> tuple[int, float]:
    """One try that must be answered within CLIENT_TIMEOUT_S with a result or a retryable 503
    (a timeout raises: the node held the request). (status, seconds taken)."""
    started = time.monotonic()
    status, answer = http_json(f"{node.url}{path}", method, body, timeout=CLIENT_TIMEOUT_S)
    took = time.monotonic() - started
    if status >= 500:
        assert status == 503 and answer["error"]["retryable"] is True, (path, status, answer)
    return status, took


def sees_dead(node: Node, others: list[Node], timeout: float = 10.0) -> None:
    """Waits until `node` counts every node of `others` as down (its links said so)."""
    gone = {n.node_id for n in others}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, answer = http_json(f"{node.url}/v1/cluster", timeout=CLIENT_TIMEOUT_S)
        if status == 200 and not any(n["alive"] for n in answer["nodes"] if n["id"] in gone):
            return
        time.sleep(0.1)
    raise AssertionError(f"node {node.node_id} still sees one of {sorted(gone)} alive")


def fails_over(cluster: Cluster, leader: int, calls: Callable[[], list[Call]]) -> None:
    """With `leader` silent, every call through each other node is answered in time, and a
    retried call gets a result within an election timeout + the client's timeout."""
    others = [n for n in cluster.nodes if n.node_id != leader]
    with paused(cluster.node(leader)):
        silenced = time.monotonic()
        for node in others:
            for method, path, body in calls():
                answered_in_time(node, method, path, body)
        for node in others:
            for method, path, body in calls():
                while answered_in_time(node, method, path, body)[0] >= 500:
                    assert time.monotonic() - silenced < 20.0, f"{path} never served again"
                    time.sleep(0.05)


def cut_off_answers_at_once(cluster: Cluster, alone: Node, calls: list[Call]) -> None:
    """With every other node silent, `alone` answers each call with a retryable 503 within an
    election timeout (it may still believe it leads the shard: check-quorum ends that)."""
    others = [n for n in cluster.nodes if n is not alone]
    with paused(*others):
        sees_dead(alone, others)
        for method, path, body in calls:
            status, took = answered_in_time(alone, method, path, body)
            assert status == 503, (path, status)
            assert took < ELECTION_TIMEOUT_S + SLACK_S, (path, took)


# ---- consumer groups ------------------------------------------------------------------------


def billing_group(cluster: Cluster) -> int:
    """Group "billing" over topic "orders", member "a" joined: the coordinator shard's leader."""
    cluster.create_topic("orders", partitions=2)
    first = cluster.nodes[0]
    join = {"topics": ["orders"], "member_id": "a", "session_timeout_ms": 60_000}
    call(first, "POST", "/v1/groups/billing/members", join)
    return int(call(first, "GET", "/v1/groups/billing")["coordinator"]["leader"])


def group_calls(generation: int = 1) -> list[Call]:
    offsets = [{"topic": "orders", "partition": p, "offset": 0} for p in range(2)]
    return [
        ("POST", "/v1/groups/billing/members/a/heartbeat", None),
        ("GET", "/v1/groups/billing/members/a/messages?max_messages=1&wait_ms=0", None),
        ("POST", "/v1/groups/billing/offsets", {"member_id": "a", "generation": generation,
                                                "offsets": offsets}),
        ("GET", "/v1/groups/billing/offsets", None),
        ("GET", "/v1/groups/billing", None),
    ]  # fmt: skip


def test_group_calls_fail_over_when_the_coordinator_leader_falls_silent(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        # a member keeps its generation across a coordinator failover (nobody joined or left)
        fails_over(cluster, billing_group(cluster), group_calls)


def test_a_node_cut_off_from_the_majority_answers_group_calls_with_a_503(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        leader = billing_group(cluster)
        join = ("POST", "/v1/groups/billing/members", {"topics": ["orders"], "member_id": "b"})
        cut_off_answers_at_once(cluster, cluster.node(leader), [*group_calls(), join])


# ---- transactions ---------------------------------------------------------------------------


def txn_shard_leader(cluster: Cluster, transactional_id: str) -> int:
    """The node leading the __transactions shard of `transactional_id` (its metrics say so)."""
    wanted = f'shard="{txn_shard_of(transactional_id)}"'
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for node in cluster.live():
            with urllib.request.urlopen(f"{node.url}/metrics", timeout=5) as response:
                text = response.read().decode()
            if any(
                line.startswith("raftline_txn_shard_leading{") and wanted in line
                for line in text.splitlines()
            ):
                return node.node_id
        time.sleep(0.1)
    raise AssertionError(f"no node leads the coordinator shard of {transactional_id}")


def transaction_calls(producer: dict[str, int]) -> list[Call]:
    fence = {"transactional_id": "tx-a", "transaction_timeout_ms": 60_000}
    return [
        ("POST", "/v1/transactions/tx-a/abort", producer),
        ("POST", "/v1/producers", fence),
    ]


def test_transaction_calls_fail_over_when_the_coordinator_leader_falls_silent(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("tx")
        first = cluster.nodes[0]
        fence = {"transactional_id": "tx-a", "transaction_timeout_ms": 60_000}
        call(first, "POST", "/v1/producers", fence)
        leader = txn_shard_leader(cluster, "tx-a")
        fails_over(cluster, leader, lambda: [("POST", "/v1/producers", fence)])


def test_a_node_cut_off_from_the_majority_answers_transaction_calls_with_a_503(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("tx")
        fence = {"transactional_id": "tx-a", "transaction_timeout_ms": 60_000}
        producer = call(cluster.nodes[0], "POST", "/v1/producers", fence)
        leader = cluster.node(txn_shard_leader(cluster, "tx-a"))
        cut_off_answers_at_once(cluster, leader, transaction_calls(producer))


# ---- queues ---------------------------------------------------------------------------------


def jobs_queue(cluster: Cluster) -> tuple[int, list[str]]:
    """Queue "jobs" over topic "work" with six messages, three of them received (locked for a
    minute): its shard's leader and their receipts."""
    cluster.create_topic("work", partitions=2)
    first = cluster.nodes[0]
    call(first, "POST", "/v1/queues", {"name": "jobs", "topic": "work", "lock_ms": 60_000})
    messages = [{"value": f"m{i}", "partition": i % 2} for i in range(6)]
    call(first, "POST", "/v1/topics/work/messages", {"messages": messages})
    receipts: list[str] = []
    while len(receipts) < 3:
        body = {"max_messages": 3 - len(receipts), "wait_ms": 1000}
        received = call(first, "POST", "/v1/queues/jobs/receive", body)
        receipts += [m["receipt"] for m in received["messages"]]
    return int(call(first, "GET", "/v1/queues/jobs")["shard"]["leader"]), receipts


def queue_calls(receipts: list[str]) -> Callable[[], list[Call]]:
    """Receive, extend and ack (a different held message each time it is called), describe."""
    held = iter(receipts)

    def calls() -> list[Call]:
        receipt = next(held)
        return [
            ("POST", "/v1/queues/jobs/receive", {"max_messages": 1, "wait_ms": 0}),
            ("POST", "/v1/queues/jobs/extend", {"receipts": [receipt]}),
            ("POST", "/v1/queues/jobs/ack", {"receipts": [receipt], "outcome": "accept"}),
            ("GET", "/v1/queues/jobs", None),
        ]

    return calls


def test_queue_calls_fail_over_when_the_shard_leader_falls_silent(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        leader, receipts = jobs_queue(cluster)
        fails_over(cluster, leader, queue_calls(receipts * 4))


def test_a_node_cut_off_from_the_majority_answers_queue_calls_with_a_503(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        leader, receipts = jobs_queue(cluster)
        cut_off_answers_at_once(cluster, cluster.node(leader), queue_calls(receipts)())


# ---- exchanges ------------------------------------------------------------------------------


def test_a_node_cut_off_from_the_majority_answers_a_publish_with_a_503(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("left")
        first = cluster.nodes[0]
        call(first, "POST", "/v1/exchanges", {"name": "all", "kind": "fanout"})
        call(first, "POST", "/v1/exchanges/all/bindings", {"topic": "left"})
        publish = ("POST", "/v1/exchanges/all/messages", {"messages": [{"value": "v"}]})
        call(first, *publish)
        alone = cluster.node(cluster.wait_for_leader("left", 0))
        cut_off_answers_at_once(cluster, alone, [publish])
