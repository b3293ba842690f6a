"""`raftline queue create|receive|stats|list|delete` against a real single-node process."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.clients.cli import main

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_cluster(Path(tmp_path_factory.mktemp("qcli")), size=1) as cluster:
        yield cluster.nodes[0].url


def run(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str]:
    code = main([*argv, "--url", url])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return code, captured.out


def test_create_receive_and_stats(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run(capsys, url, "topic", "create", "tasks", "-p", "2")
    monkeypatch.setattr("sys.stdin", io.StringIO("a\nb\nc\n"))
    run(capsys, url, "produce", "tasks")
    _, out = run(capsys, url, "queue", "create", "work", "-t", "tasks", "--max-deliveries", "3")
    assert "created queue work over tasks" in out
    _, out = run(capsys, url, "queue", "receive", "work", "-n", "1", "--settle", "release")
    assert len(out.splitlines()) == 1
    _, out = run(capsys, url, "queue", "receive", "work", "--format", "json")
    received = [json.loads(line) for line in out.splitlines()]
    assert sorted(m["value"] for m in received) == ["a", "b", "c"]
    assert sorted(m["delivery_count"] for m in received) == [1, 1, 2]
    _, out = run(capsys, url, "queue", "stats", "work")
    assert "ACKNOWLEDGED" in out and out.splitlines()[-1].split()[:3] == ["0", "0", "3"]
    _, out = run(capsys, url, "queue", "list")
    assert "work" in out and "tasks" in out
    _, out = run(capsys, url, "queue", "delete", "work")
    assert main(["queue", "stats", "work", "--url", url]) == 1
    assert "unknown_queue" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [["queue"], ["queue", "create"], ["queue", "receive"], ["queue", "stats"],
     ["queue", "list"], ["queue", "delete"]],
)  # fmt: skip
def test_every_queue_command_has_help(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: raftline")
