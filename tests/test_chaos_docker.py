"""Fault mechanics on real containers of the raftline image (needs Docker and raftline:local).

The containers run a plain HTTP server in place of the node, so this checks the nemeses themselves:
nftables partitions and loss inside each container's namespace, SIGKILL and restart, pause.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftline.chaos.cluster import ComposeCluster, Node
from raftline.chaos.nemesis import (
    STORAGE_OUTAGES,
    Partition,
    ProcessFault,
    SlowNetwork,
    StorageOutage,
    Targets,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, raftline_image: None
) -> Iterator[ComposeCluster]:
    compose = (REPO / "docker-compose.yml").read_text()
    standin = compose.replace(
        "  networks: [raftline]\n",
        '  networks: [raftline]\n  entrypoint: ["python3", "-m", "http.server", "8080"]\n',
        1,
    ).replace("context: docker/", f"context: {REPO}/docker/")
    path = tmp_path_factory.mktemp("compose") / "docker-compose.yml"
    path.write_text(standin)
    cluster = ComposeCluster(5, "raftline-chaos-test", path)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def reaches(cluster: ComposeCluster, source: Node, target: Node, path: str = ":8080/") -> bool:
    code = (
        f"import urllib.request; urllib.request.urlopen('http://{target.service}{path}', timeout=1)"
    )
    argv = ["docker", "exec", source.container, "python3", "-c", code]
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0


def reaches_storage(cluster: ComposeCluster, source: Node, within_s: float = 0.0) -> bool:
    """Whether `source` gets an answer from the S3 server's health check (trying for up to
    `within_s`: a restarted server needs a few seconds)."""
    assert cluster.storage is not None
    deadline = time.monotonic() + within_s
    while not reaches(cluster, source, cluster.storage, ":8333/healthz"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)
    return True


@pytest.mark.parametrize("mode", STORAGE_OUTAGES)
def test_object_storage_outage_cuts_every_node_off_until_healed(
    cluster: ComposeCluster, mode: str
) -> None:
    assert reaches_storage(cluster, cluster.nodes[0], within_s=60)
    outage = StorageOutage(cluster, modes=[mode])
    assert outage.start(random.Random(1)) == {"fault": "s3", "mode": mode}
    try:
        assert not any(reaches_storage(cluster, node) for node in cluster.nodes[:2])
    finally:
        outage.stop()
    assert all(reaches_storage(cluster, node, within_s=60) for node in cluster.nodes[:2])


def test_isolated_node_is_cut_off_both_ways_until_healed(cluster: ComposeCluster) -> None:
    partition = Partition(cluster, Targets(cluster, "none"), shapes=["one"])
    sees = partition.start(random.Random(3))["sees"]
    isolated = cluster.node(next(i for i, seen in sees.items() if len(seen) == 1))
    others = [n for n in cluster.nodes if n is not isolated]
    try:
        assert not reaches(cluster, others[0], isolated)
        assert not reaches(cluster, isolated, others[0])
        assert reaches(cluster, others[0], others[1])
    finally:
        partition.stop()
    assert reaches(cluster, others[0], isolated)


def test_isolate_cuts_a_node_off_both_ways_from_its_own_namespace(cluster: ComposeCluster) -> None:
    victim, others = cluster.nodes[1], [n for n in cluster.nodes if n is not cluster.nodes[1]]
    cluster.isolate(victim)
    try:
        assert not reaches(cluster, others[0], victim)
        assert not reaches(cluster, victim, others[1])
        assert reaches(cluster, others[0], others[1])
    finally:
        cluster.heal_all()
    assert reaches(cluster, others[0], victim)
    assert reaches(cluster, victim, others[1])


def test_killed_node_is_down_until_the_fault_heals(cluster: ComposeCluster) -> None:
    kill = ProcessFault(cluster, Targets(cluster, "none"), "kill")
    victim = cluster.node(kill.start(random.Random(2))["node"])
    assert not cluster.is_running(victim)
    kill.stop()
    assert cluster.is_running(victim)


def test_paused_node_is_frozen_until_the_fault_heals(cluster: ComposeCluster) -> None:
    pause = ProcessFault(cluster, Targets(cluster, "none"), "pause")
    victim = cluster.node(pause.start(random.Random(5))["node"])
    other = next(n for n in cluster.nodes if n is not victim)
    assert not reaches(cluster, other, victim)
    pause.stop()
    assert reaches(cluster, other, victim)


def qdiscs(cluster: ComposeCluster, node: Node) -> str:
    argv = ["nsenter", "-t", str(cluster.pid(node)), "-n", "tc", "qdisc", "show", "dev", "eth0"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def test_slowed_nodes_send_through_a_token_bucket_until_healed(cluster: ComposeCluster) -> None:
    slow = SlowNetwork(cluster)
    slowed = [cluster.node(i) for i in slow.start(random.Random(4))["nodes"]]
    assert slowed and all("tbf" in qdiscs(cluster, n) for n in slowed)
    slow.stop()
    assert not any("tbf" in qdiscs(cluster, n) for n in slowed)
