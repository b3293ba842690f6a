"""Exchanges and request/reply on a real 3-node cluster over HTTP, each call to a different
node: a topic exchange routes `eu.orders.*` and `#.refund` to the right topics, a fanout reaches
every bound topic, a request gets its correlated reply from a responder on another node; and
when the controller, a destination's leader or the transaction coordinator falls silent, every
exchange and request call is answered within the client's 3 s (a result, a retryable 503, or
a request's own 504), never held, and works again once leaders are elected."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, Node, http_json, running_cluster
from cluster_harness import call_until_done as call

from raftline.clients.client import Client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

CLIENT_TIMEOUT_S = 3.0


def once(node: Node, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One try that the node must answer within CLIENT_TIMEOUT_S: a result or a retryable 503
    (a timeout here raises: the request was held)."""
    status, answer = http_json(f"{node.url}{path}", method, body, timeout=CLIENT_TIMEOUT_S)
    if status >= 500:
        assert status == 503 and answer["error"]["retryable"] is True, (status, answer)
    return status, answer


def unanswered(node: Node, body: dict[str, Any]) -> None:
    """A request nobody answers, answered within CLIENT_TIMEOUT_S: 504, or a retryable 503."""
    status, answer = http_json(f"{node.url}/v1/request", "POST", body, timeout=CLIENT_TIMEOUT_S)
    assert status in (503, 504) and answer["error"]["retryable"] is True, (status, answer)


def values(node: Node, topic: str) -> list[str]:
    path = f"/v1/topics/{topic}/partitions/0/messages?offset=earliest&isolation=read_committed"
    return sorted(m["value"] for m in call(node, "GET", path)["messages"])


def publish(node: Node, exchange: str, *pairs: tuple[str, str]) -> Any:
    messages = [{"routing_key": key, "value": value} for key, value in pairs]
    return call(node, "POST", f"/v1/exchanges/{exchange}/messages", {"messages": messages})


def test_routing_fanout_and_request_reply_through_different_nodes(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        one, two, three = cluster.nodes
        for topic in ("orders-eu", "refunds", "audit-a", "audit-b", "rpc"):
            cluster.create_topic(topic)
        call(one, "POST", "/v1/exchanges", {"name": "events", "kind": "topic"})
        call(
            two,
            "POST",
            "/v1/exchanges/events/bindings",
            {"key": "eu.orders.*", "topic": "orders-eu"},
        )
        call(two, "POST", "/v1/exchanges/events/bindings", {"key": "#.refund", "topic": "refunds"})
        answer = publish(
            three,
            "events",
            ("eu.orders.created", "a"),
            ("eu.orders.refund", "b"),
            ("us.orders.refund", "c"),
            ("eu.orders.created.late", "d"),
        )
        assert answer["dropped"] == 1 and answer["transaction"] is True
        assert values(one, "orders-eu") == ["a", "b"]
        assert values(two, "refunds") == ["b", "c"]

        call(three, "POST", "/v1/exchanges", {"name": "broadcast", "kind": "fanout"})
        for topic in ("audit-a", "audit-b"):
            call(one, "POST", "/v1/exchanges/broadcast/bindings", {"topic": topic})
        publish(two, "broadcast", ("", "hello all"))
        assert values(three, "audit-a") == values(three, "audit-b") == ["hello all"]

        call(one, "POST", "/v1/queues", {"name": "rpc-q", "topic": "rpc"})
        call(one, "POST", "/v1/exchanges", {"name": "services", "kind": "direct"})
        call(two, "POST", "/v1/exchanges/services/bindings", {"key": "echo", "queue": "rpc-q"})
        responder = threading.Thread(target=serve, args=(three, 1), daemon=True)
        responder.start()
        body = {"exchange": "services", "routing_key": "echo", "message": {"value": "ping"}}
        replied = call(one, "POST", "/v1/request", {**body, "correlation_id": "c-7"})
        responder.join(timeout=30)
        assert replied["reply"]["value"] == "echo ping"
        assert replied["reply"]["headers"]["correlation-id"] == "c-7"


def serve(node: Node, requests: int) -> None:
    with Client(node.url) as client:
        client.responder("rpc-q", lambda m: f"echo {m.text}", wait_ms=300).serve(requests)


def silent_node(cluster: Cluster, leader: int) -> tuple[Node, list[Node]]:
    return cluster.node(leader), [n for n in cluster.nodes if n.node_id != leader]


def test_exchange_calls_are_answered_in_time_while_the_controller_is_silent(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("t")
        call(cluster.nodes[0], "POST", "/v1/exchanges", {"name": "x", "kind": "topic"})
        ask = {"topic": "t", "message": {"value": "anyone?"}, "timeout_ms": 500}
        for node in cluster.nodes:  # each node's view of the client's reply topic
            status, _ = http_json(
                f"{node.url}/v1/request", "POST", {**ask, "client_id": "c1"}, timeout=10
            )
            assert status == 504
        silent, others = silent_node(cluster, cluster.controller())
        silent.pause()
        try:
            for node in others:
                # an existing reply topic needs no controller, a new one does; either way
                # nobody answers: 504 once the wait runs out, or a retryable 503 while a
                # leader the request needs (the controller's, a partition's) is elected
                for body in ({**ask, "client_id": "c1"}, ask):
                    unanswered(node, body)
                once(node, "POST", "/v1/exchanges/x/bindings", {"key": "a.#", "topic": "t"})
                once(node, "POST", "/v1/exchanges", {"name": f"y{node.node_id}", "kind": "fanout"})
                once(node, "GET", "/v1/exchanges/x")
                once(
                    node,
                    "POST",
                    "/v1/exchanges/x/messages",
                    {"messages": [{"routing_key": "a.b", "value": "v"}]},
                )
            bound = call(
                others[0], "POST", "/v1/exchanges/x/bindings", {"key": "a.#", "topic": "t"}
            )
            assert bound == {"key": "a.#", "topic": "t"}
            published = publish(others[1], "x", ("a.b", "after"))
            assert published["routed"] == 1
        finally:
            silent.resume()


def test_a_publish_is_answered_in_time_when_a_destination_leader_falls_silent(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        for topic in ("left", "right"):
            cluster.create_topic(topic)
        first = cluster.nodes[0]
        call(first, "POST", "/v1/exchanges", {"name": "both", "kind": "fanout"})
        for topic in ("left", "right"):
            call(first, "POST", "/v1/exchanges/both/bindings", {"topic": topic})
        publish(first, "both", ("", "before"))
        silent, others = silent_node(cluster, cluster.wait_for_leader("right", 0))
        silent.pause()
        acknowledged = ["before"]
        statuses = []
        try:
            for i in range(4):
                body = {"messages": [{"value": f"during-{i}"}]}
                status, _ = once(others[i % 2], "POST", "/v1/exchanges/both/messages", body)
                statuses.append(status)
                if status == 200:
                    acknowledged.append(f"during-{i}")
            publish(others[0], "both", ("", "after"))
            acknowledged.append("after")
        finally:
            silent.resume()
        # every acknowledged publish is in both topics; a refused one (aborted, or of unknown
        # outcome) is in both or in neither
        left, right = values(others[0], "left"), values(others[1], "right")
        assert left == right, (left, right, statuses)
        assert set(acknowledged) <= set(left), (acknowledged, left, statuses)
