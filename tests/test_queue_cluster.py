"""A queue on a real 3-node cluster over HTTP, as the outside check runs it: two receivers on
different nodes share the work; an unacknowledged record comes back after its lock expires with
a higher delivery count; a record released max_deliveries times lands in the dead-letter topic
with its source headers; acknowledged records never come back, also after the queue shard's
leader and then the partition's leader are SIGKILLed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Node, running_cluster
from cluster_harness import call_until_done as call

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def receive(node: Node, n: int, wait_ms: int = 0) -> list[dict[str, Any]]:
    body = {"max_messages": n, "wait_ms": wait_ms}
    return list(call(node, "POST", "/v1/queues/jobs/receive", body)["messages"])


def settle(node: Node, messages: list[dict[str, Any]], outcome: str) -> list[dict[str, Any]]:
    if not messages:
        return []
    body = {"receipts": [m["receipt"] for m in messages], "outcome": outcome}
    return list(call(node, "POST", "/v1/queues/jobs/ack", body)["results"])


def test_queue_on_a_cluster_survives_shard_and_partition_leader_kills(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        n1, n2, n3 = cluster.nodes
        cluster.create_topic("work", partitions=2)
        cluster.create_topic("work.dlq", partitions=1)
        for p in range(2):
            messages = [{"value": f"{p}-{i}", "partition": p} for i in range(10)]
            call(n1, "POST", "/v1/topics/work/messages", {"messages": messages})
        spec = {
            "name": "jobs",
            "topic": "work",
            "lock_ms": 1_000,
            "max_deliveries": 2,
            "dead_letter_topic": "work.dlq",
        }
        assert call(n2, "POST", "/v1/queues", spec)["name"] == "jobs"

        def key(m: dict[str, Any]) -> tuple[int, int]:
            return (m["partition"], m["offset"])

        # two receivers on two nodes share the work
        a, b = receive(n1, 4), receive(n3, 4)
        assert len(a) == 4 and len(b) == 4 and not {key(m) for m in a} & {key(m) for m in b}
        acked = {key(m) for m in a + b[:3]}
        assert all(r["ok"] for r in settle(n2, a + b[:3], "accept"))
        # b's last one comes back after its lock with a higher delivery count
        deadline = time.monotonic() + 10
        back: list[dict[str, Any]] = []
        while time.monotonic() < deadline and key(b[3]) not in {key(m) for m in back}:
            got = receive(n2, 20, wait_ms=1_500)
            assert not {key(m) for m in got} & acked
            back += got
            others = [m for m in got if key(m) != key(b[3])]  # acked at once, within their lock
            assert all(r["ok"] for r in settle(n1, others, "accept"))
            acked |= {key(m) for m in others}
        again = next(m for m in back if key(m) == key(b[3]))
        assert again["delivery_count"] == 2
        # released a second time (max_deliveries 2): to the dead-letter topic
        assert settle(n1, [again], "release")[0]["ok"]
        dead: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while not dead and time.monotonic() < deadline:
            dead = call(n3, "GET", "/v1/topics/work.dlq/partitions/0/messages?offset=0")["messages"]
        assert len(dead) == 1
        headers = dead[0]["headers"]
        assert dead[0]["value"] == again["value"]
        assert headers["x-raftline-source-topic"] == "work"
        assert headers["x-raftline-source-partition"] == str(again["partition"])
        assert headers["x-raftline-source-offset"] == str(again["offset"])
        assert headers["x-raftline-delivery-count"] == "2"

        # kill the queue shard's leader, then (once it is back) the partition leaders' node
        described = call(n1, "GET", "/v1/queues/jobs")
        assert described["acknowledged"] == len(acked) and described["dead_lettered"] == 1
        total = 20
        for victim_of in ("shard", "partition"):
            if victim_of == "shard":
                victim = cluster.node(described["shard"]["leader"])
            else:
                victim = cluster.node(cluster.wait_for_leader("work", 0))
            in_flight = receive(victim, 2)
            victim.kill()
            survivor = next(n for n in cluster.nodes if n.running)
            deadline = time.monotonic() + 40
            rounds = 0
            while time.monotonic() < deadline and len(acked) < total - 1:
                got = receive(survivor, 3, wait_ms=1_000)
                assert not {key(m) for m in got} & acked, "an acknowledged record came back"
                results = settle(survivor, got, "accept")
                acked |= {key(m) for m, r in zip(got, results, strict=True) if r["ok"]}
                rounds += 1
                if victim_of == "shard" and rounds >= 2:
                    break
            assert {key(m) for m in in_flight} <= acked or victim_of == "shard"
            victim.start()
            cluster.wait_ready()
        assert len(acked) == total - 1  # one dead-lettered
        assert receive(n2, 10, wait_ms=1_500) == []
        described = call(n3, "GET", "/v1/queues/jobs")
        assert described["acknowledged"] == total - 1 and described["dead_lettered"] == 1
        assert described["locked"] == 0 and described["available"] == 0
