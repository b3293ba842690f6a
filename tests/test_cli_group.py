"""`raftline consume --group` and `raftline group list|describe|reset-offsets|remove-members`
against a real single-node `raftline serve` process."""

from __future__ import annotations

import io
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.clients.cli import main
from raftline.clients.client import Client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]
_names = (f"cli-group-{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_cluster(Path(tmp_path_factory.mktemp("cli-group")), size=1) as cluster:
        yield cluster.nodes[0].url


def _run(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--url", url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def topic(url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """A 2-partition topic holding one..six (three on each partition)."""
    name = next(_names)
    assert _run(capsys, url, "topic", "create", name, "-p", "2")[0] == 0
    for partition, lines in (("0", "one\ntwo\nthree\n"), ("1", "four\nfive\nsix\n")):
        monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
        assert _run(capsys, url, "produce", name, "-p", partition)[0] == 0
    return name


ALL = ["five", "four", "one", "six", "three", "two"]


def _rows(out: str, first: str) -> list[list[str]]:
    """The rows of the table whose header starts with `first`."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_consume_with_a_group_prints_commits_and_leaves(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    group = f"{topic}-g"
    code, out, _ = _run(
        capsys, url, "consume", topic, "--group", group, "-o", "earliest", "-n", "6"
    )
    assert code == 0
    assert sorted(out.splitlines()) == ALL
    code, out, _ = _run(capsys, url, "group", "describe", group)
    assert code == 0
    assert "state: empty" in out.splitlines()[0]
    assert _rows(out, "MEMBER") == []  # it left
    offsets = _rows(out, "TOPIC")
    assert [(r[0], r[1], r[-1]) for r in offsets] == [(topic, "0", "0"), (topic, "1", "0")]
    assert "total lag: 0" in out
    code, out, _ = _run(capsys, url, "group", "list")
    assert code == 0 and [group, "empty", "0"] in _rows(out, "GROUP")


def test_describe_shows_members_with_their_partitions(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    group = f"{topic}-g"
    with Client(url) as client:
        member = client.consumer(topic, group=group, member_id="cli-member", wait_ms=0)
        member.poll()
        try:
            code, out, _ = _run(capsys, url, "group", "describe", group)
        finally:
            member.close()
    assert code == 0
    assert _rows(out, "MEMBER")[0][0] == "cli-member"
    assert _rows(out, "MEMBER")[0][-1] == f"{topic}/0,{topic}/1"
    assert {r[2] for r in _rows(out, "TOPIC")} == {"cli-member"}


def test_reset_offsets_then_the_group_reads_again(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    group = f"{topic}-g"
    argv = ["consume", topic, "--group", group, "-o", "earliest", "-n", "6"]
    assert _run(capsys, url, *argv)[0] == 0
    reset = ["group", "reset-offsets", group, "--topic", topic]
    code, out, _ = _run(capsys, url, *reset, "--to-earliest")
    assert code == 0
    assert [r[:2] for r in _rows(out, "TOPIC")] == [[topic, "0"], [topic, "1"]]
    code, out, _ = _run(capsys, url, *argv)
    assert code == 0 and sorted(out.splitlines()) == ALL
    code, _, err = _run(capsys, url, *reset, "--to-offset", "99")
    assert code == 1
    assert "offset_out_of_range" in err and "Traceback" not in err


def test_reset_offsets_of_a_group_with_members_is_refused(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    group = f"{topic}-g"
    with Client(url) as client:
        member = client.consumer(topic, group=group, wait_ms=0)
        member.poll()
        code, _, err = _run(
            capsys, url, "group", "reset-offsets", group, "-t", topic, "--to-latest"
        )
        assert code == 1 and "group_not_empty" in err
        code, out, _ = _run(capsys, url, "group", "remove-members", group)
        assert code == 0 and out.strip() == f"removed {member.member_id}"
        code, _, _ = _run(capsys, url, "group", "reset-offsets", group, "-t", topic, "--to-latest")
        assert code == 0
        member.close()


def test_unknown_group_and_bad_input_are_errors_without_a_traceback(
    url: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, url, "group", "describe", "no-such-group")
    assert code == 1 and "unknown_group" in err and "Traceback" not in err
    code, _, err = _run(capsys, url, "consume", "no-such-topic", "--group", "g", "-n", "1")
    assert code == 1 and "unknown_topic" in err
    for argv in (
        ["consume", topic, "--group", "g", "--partition", "0"],
        ["consume", topic, "--group", "g", "--offset", "5"],
        ["group", "reset-offsets", "g", "--topic", topic],
        ["group", "reset-offsets", "g", "--topic", topic, "--to-offset", "-1"],
        ["group", "reset-offsets", "g", "--topic", topic, "--to-timestamp", "soon"],
        ["group", "reset-offsets", "g", "--topic", topic, "--to-earliest", "--to-latest"],
    ):
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--url", url])
        assert exited.value.code == 2
        assert "error:" in capsys.readouterr().err


def test_ctrl_c_leaves_the_group_cleanly(url: str, topic: str) -> None:
    group = f"{topic}-g"
    # Ctrl-C as in an interactive shell: a suite started in the background (`&`) passes its
    # children SIGINT ignored, and the consumer would rightly not stop.
    command = [
        sys.executable,
        "-c",
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from raftline.clients.cli import main; main()",
    ]
    argv = ["consume", topic, "--group", group, "-o", "earliest", "--url", url]
    # faulthandler: a consumer that does not end is made to print every thread's stack.
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(
        [*command, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        with Client(url) as client:
            deadline = time.monotonic() + 30
            while not [g for g in client.list_groups() if g["group"] == group and g["members"]]:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
            time.sleep(0.5)
            os.kill(process.pid, signal.SIGINT)
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGABRT)
                _, stacks = process.communicate(timeout=10)
                raise AssertionError(f"still running 30 s after Ctrl-C:\n{stacks}") from None
            assert process.returncode == 0, err
            assert "Traceback" not in err
            assert sorted(out.splitlines()) == ALL
            described = client.describe_group(group)
            assert described["members"] == []
            assert {o["lag"] for o in described["offsets"]} == {0}  # what it printed: committed
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize(
    "command",
    [["group", "list"], ["group", "describe"], ["group", "reset-offsets"],
     ["group", "remove-members"]],
)  # fmt: skip
def test_every_group_command_has_help(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from raftline.clients.cli import main; main()", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: raftline")
