"""Fixtures shared by several test files: in-process and real-process nodes, the Docker image.

Helpers they build on live in inproc_harness.py and cluster_harness.py.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from cluster_harness import Cluster, running_cluster
from inproc_harness import configs, serving, start_all
from seaweedfs import SeaweedServer, running_seaweedfs

from raftline.clients.client import Client
from raftline.node.broker import Broker


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[list[Broker]]:
    """Three in-process brokers on one event loop, all ready."""
    brokers = await start_all(configs(tmp_path, 3))
    yield brokers
    for broker in brokers:
        await broker.stop()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[TestClient]:
    """One in-process broker and an HTTP test client on it, ready."""
    async with serving(tmp_path / "data") as (client, _):
        yield client


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One real `raftline serve` process, shared by the tests of a module."""
    with running_cluster(Path(tmp_path_factory.mktemp("node")), size=1) as single:
        yield single


@pytest.fixture
def client(node: Cluster) -> Iterator[Client]:
    """A synchronous client of the module's `node`."""
    with Client(node.urls) as client:
        yield client


_topic_names = (f"topic-{i}" for i in itertools.count())


@pytest.fixture
def topic_name() -> str:
    """A topic name no other test uses."""
    return next(_topic_names)


@pytest.fixture
def new_topic(client: Client, topic_name: str) -> Callable[..., str]:
    """Creates the test's topic (`topic_name`) with that many partitions; returns its name."""

    def create(partitions: int = 1) -> str:
        client.create_topic(topic_name, partitions)
        return topic_name

    return create


@pytest.fixture(scope="session")
def raftline_image() -> None:
    """Skips the test unless the Docker engine runs and holds the images docker-compose.yml runs
    (the node's and the object storage service's)."""
    probe = ["docker", "image", "inspect", "raftline:local", "raftline-seaweedfs:local"]
    if not shutil.which("docker") or (
        subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode != 0
    ):
        pytest.skip(
            "needs the Docker engine, raftline:local and raftline-seaweedfs:local"
            " (scripts/build-image.sh)"
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (2 cores, UI off, every listener on loopback) for every Spark
    test, with the raftline data source registered; its Python workers run this interpreter."""
    from spark_harness import local_spark_session

    with local_spark_session() as session:
        yield session


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A real S3 server (SeaweedFS `weed mini` on loopback) for the tests of a module."""
    with running_seaweedfs(Path(tmp_path_factory.mktemp("weed"))) as server:
        yield server


@pytest.fixture(scope="module")
def bucket(seaweed: SeaweedServer) -> str:
    """A fresh bucket on the module's SeaweedFS."""
    return seaweed.create_bucket()
