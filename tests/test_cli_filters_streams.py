"""`raftline consume --filter/--stream` and `raftline queue receive --filter/--stream` against a
real single-node `raftline serve` process."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.clients.cli import main
from raftline.clients.client import Client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

_names = (f"cli-fs-{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_cluster(Path(tmp_path_factory.mktemp("cli")), size=1) as cluster:
        yield cluster.nodes[0].url


@pytest.fixture
def topic(url: str) -> Iterator[str]:
    name = next(_names)
    with Client(url) as client:
        client.create_topic(name, 1)
        messages = [
            {"value": f"v{i}", "headers": {"region": ["eu", "us"][i % 2]}} for i in range(6)
        ]
        client.produce(name, messages)
    yield name


def _run(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str]:
    code = main([*argv, "--url", url])
    return code, capsys.readouterr().out


def test_consume_with_a_filter_prints_only_matching_records(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(capsys, url, "consume", topic, "--filter", 'headers.region == "us"')
    assert code == 0 and out.split() == ["v1", "v3", "v5"]


def test_consume_stream_prints_records_produced_after_it_started(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def later() -> None:
        with Client(url) as client:
            client.produce(topic, [{"value": "late-us", "headers": {"region": "us"}}])
            client.produce(topic, [{"value": "late-eu", "headers": {"region": "eu"}}])

    timer = threading.Timer(1.0, later)
    timer.start()
    code, out = _run(
        capsys, url, "consume", topic, "-o", "latest", "--stream", "-n", "1",
        "--filter", 'headers.region == "eu"',
    )  # fmt: skip
    timer.join()
    assert code == 0 and out.split() == ["late-eu"]


def test_queue_receive_with_a_filter_over_a_stream(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, url, "queue", "create", f"{topic}-q", "-t", topic)[0] == 0
    code, out = _run(
        capsys, url, "queue", "receive", f"{topic}-q", "--stream", "--wait-ms", "2000",
        "-n", "3", "--filter", 'headers.region == "eu"',
    )  # fmt: skip
    assert code == 0 and sorted(out.split()) == ["v0", "v2", "v4"]
