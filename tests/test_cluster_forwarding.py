"""Any node of a real 3-node cluster answers for partitions it neither leads nor holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_harness import http_json, read_partition, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


def test_every_node_produces_and_fetches_every_partition(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("spread", partitions=3, replication_factor=1)
        holders = {p["partition"]: p["replicas"] for p in cluster.describe("spread")["partitions"]}
        assert sorted(len(r) for r in holders.values()) == [1, 1, 1]
        for partition in range(3):
            cluster.wait_for_leader("spread", partition)
            for node in cluster.nodes:
                status, body = http_json(
                    f"{node.url}/v1/topics/spread/messages",
                    "POST",
                    {"messages": [{"value": f"via {node.node_id}", "partition": partition}]},
                    timeout=15,
                )
                assert status == 200, body
        for partition in range(3):
            for node in cluster.nodes:
                values = [m["value"] for m in read_partition(node, "spread", partition)]
                assert values == ["via 1", "via 2", "via 3"]
