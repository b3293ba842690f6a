"""Transactions on a real 3-node cluster: through any node, across a coordinator leader kill.

A transaction over two partitions (replication 3) committed through one node is visible to
read_committed fetches through every node, all or nothing; an aborted one never is while
read_uncommitted sees it. The leader of the transaction's coordinator shard is then SIGKILLed
with a transaction open: its successor knows the transaction (replayed from the shard's log),
commits it, and the markers reach both partitions.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, http_json, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150)]


def _call(cluster: Cluster, path: str, body: Any = None, method: str = "POST") -> Any:
    """A request to any live node, repeated while the answer is retryable (elections)."""
    deadline = time.monotonic() + 40
    turn = 0
    while True:
        live = cluster.live()
        node = live[turn % len(live)]
        turn += 1
        try:
            status, answer = http_json(f"{node.url}{path}", method, body, timeout=15.0)
        except OSError:
            status, answer = 503, {"error": {"retryable": True}}
        if status < 300:
            return answer
        if not answer.get("error", {}).get("retryable") or time.monotonic() > deadline:
            raise AssertionError(f"{method} {path}: {status} {answer}")
        time.sleep(0.1)


def _txn(tid: str, pid: int, epoch: int, seq: int, partition: int, value: str) -> Any:
    return {
        "transactional": True,
        "transactional_id": tid,
        "producer_id": pid,
        "producer_epoch": epoch,
        "sequence": seq,
        "messages": [{"value": value, "partition": partition}],
    }


def _values(cluster: Cluster, partition: int, isolation: str) -> list[str]:
    values = []
    for node in cluster.live():  # every node answers alike (forwarding to the leader)
        answer = _call(
            cluster,
            f"/v1/topics/tx/partitions/{partition}/messages?offset=0&isolation={isolation}",
            method="GET",
        )
        status, direct = http_json(
            f"{node.url}/v1/topics/tx/partitions/{partition}/messages"
            f"?offset=0&isolation={isolation}",
            timeout=15.0,
        )
        assert status == 200, direct
        assert [m["value"] for m in direct["messages"]] == [m["value"] for m in answer["messages"]]
        values = [m["value"] for m in answer["messages"]]
    return values


def _shard_leader(cluster: Cluster) -> int:
    """The node leading the __transactions shard of "tx-a" (its metrics say so)."""
    from raftline.node.transactions.service import shard_of

    wanted = f'shard="{shard_of("tx-a")}"'
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for node in cluster.live():
            with urllib.request.urlopen(f"{node.url}/metrics", timeout=5) as response:
                text = response.read().decode()
            for line in text.splitlines():
                if line.startswith("raftline_txn_shard_leading{") and wanted in line:
                    return node.node_id
        time.sleep(0.1)
    raise AssertionError("no node leads the transaction's coordinator shard")


def test_transactions_across_nodes_and_a_coordinator_kill(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("tx", partitions=2)
        for partition in (0, 1):
            cluster.wait_for_leader("tx", partition)
        producer = _call(cluster, "/v1/producers", {"transactional_id": "tx-a"})
        pid, epoch = producer["producer_id"], producer["producer_epoch"]
        for partition in (0, 1):
            _call(cluster, "/v1/topics/tx/messages", _txn("tx-a", pid, epoch, 0, partition, "c"))
        assert _values(cluster, 0, "read_committed") == []
        ended = _call(
            cluster, "/v1/transactions/tx-a/commit", {"producer_id": pid, "producer_epoch": epoch}
        )
        epoch = ended["producer_epoch"]
        for partition in (0, 1):
            assert _values(cluster, partition, "read_committed") == ["c"]
        for partition in (0, 1):
            _call(cluster, "/v1/topics/tx/messages", _txn("tx-a", pid, epoch, 0, partition, "a"))
        ended = _call(
            cluster, "/v1/transactions/tx-a/abort", {"producer_id": pid, "producer_epoch": epoch}
        )
        epoch = ended["producer_epoch"]
        for partition in (0, 1):
            assert _values(cluster, partition, "read_committed") == ["c"]
            assert _values(cluster, partition, "read_uncommitted") == ["c", "a"]
        # a transaction open while the coordinator shard's leader dies
        for partition in (0, 1):
            _call(cluster, "/v1/topics/tx/messages", _txn("tx-a", pid, epoch, 0, partition, "k"))
        victim = _shard_leader(cluster)
        cluster.node(victim).kill()
        _call(
            cluster, "/v1/transactions/tx-a/commit", {"producer_id": pid, "producer_epoch": epoch}
        )
        for partition in (0, 1):
            assert _values(cluster, partition, "read_committed") == ["c", "k"]
        cluster.node(victim).start()
        cluster.wait_ready([cluster.node(victim)])
        for partition in (0, 1):
            assert _values(cluster, partition, "read_committed") == ["c", "k"]
