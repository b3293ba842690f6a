"""`raftline topic|produce|consume|cluster` against a real single-node `raftline serve` process."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.clients.cli import main

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]
_names = (f"cli-{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_cluster(Path(tmp_path_factory.mktemp("cli")), size=1) as cluster:
        yield cluster.nodes[0].url


def _run(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--url", url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def topic(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    name = next(_names)
    assert _run(capsys, url, "topic", "create", name, "-p", "2")[0] == 0
    return name


def test_topic_list_shows_a_table_row_per_topic(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, url, "topic", "list")
    assert code == 0
    assert out.splitlines()[0].split() == ["TOPIC", "PARTITIONS", "REPLICATION"]
    assert [topic, "2", "1"] in [line.split() for line in out.splitlines()]


def test_topic_describe_lists_partitions(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, url, "topic", "describe", topic)
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1"]


def test_topic_delete_then_describe_fails_with_the_code(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, url, "topic", "delete", topic)[0] == 0
    code, _, err = _run(capsys, url, "topic", "describe", topic)
    assert code == 1
    assert "unknown_topic" in err


def test_produced_stdin_lines_are_consumed_in_order(
    url: str, topic: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\nthree\n"))
    assert _run(capsys, url, "produce", topic, "--partition", "1")[0] == 0
    code, out, _ = _run(capsys, url, "consume", topic, "--partition", "1")
    assert code == 0
    assert out.splitlines() == ["one", "two", "three"]


def test_produce_from_a_file_with_a_key_and_consume_as_json(
    url: str, topic: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(300)))
    assert _run(capsys, url, "produce", topic, "--file", str(lines), "--key", "k")[0] == 0
    _, out, _ = _run(capsys, url, "consume", topic, "--format", "json")
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["value"] for r in records] == [f"line {i}" for i in range(300)]
    assert {r["key"] for r in records} == {"k"}
    assert len({r["partition"] for r in records}) == 1


def test_lines_produced_on_a_produce_stream_are_consumed_in_order(
    url: str, topic: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\nthree\n"))
    assert _run(capsys, url, "produce", topic, "-p", "0", "--transport", "stream")[0] == 0
    _, out, _ = _run(capsys, url, "consume", topic, "--partition", "0")
    assert out.splitlines() == ["one", "two", "three"]
    with urllib.request.urlopen(url + "/metrics") as answer:
        metrics = answer.read().decode().splitlines()
    assert 'raftline_stream_messages_total{kind="produce"} 3' in metrics


def test_a_produce_stream_without_acks_is_refused_with_a_message(
    url: str, topic: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("lost\n"))
    code, _, err = _run(capsys, url, "produce", topic, "--transport", "stream", "--acks", "none")
    assert code == 1
    assert "acks" in err


def test_consume_follow_stops_after_max_messages(
    url: str, topic: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\nb\nc\n"))
    _run(capsys, url, "produce", topic, "-p", "0")
    code, out, _ = _run(capsys, url, "consume", topic, "--follow", "-n", "2")
    assert code == 0
    assert out.splitlines() == ["a", "b"]


def test_cluster_command_shows_the_node(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, url, "cluster")
    assert code == 0
    assert "controller: 1" in out


@pytest.mark.parametrize(
    "command",
    [["serve"], ["topic", "create"], ["topic", "list"], ["topic", "describe"],
     ["topic", "delete"], ["produce"], ["consume"], ["cluster"]],
)  # fmt: skip
def test_every_command_has_help(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from raftline.clients.cli import main; main()", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: raftline")
