"""`raftline exchange create|list|describe|bind|unbind|publish|delete` and `raftline request`
against a real single-node process."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.clients.cli import main
from raftline.clients.client import Client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_cluster(Path(tmp_path_factory.mktemp("xcli")), size=1) as cluster:
        yield cluster.nodes[0].url


def run(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> str:
    code = main([*argv, "--url", url])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_exchange_commands(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for topic in ("orders-eu", "refunds", "unrouted"):
        run(capsys, url, "topic", "create", topic)
    out = run(
        capsys, url, "exchange", "create", "events", "--kind", "topic",
        "--alternate-topic", "unrouted",
    )  # fmt: skip
    assert "created topic exchange events" in out
    run(capsys, url, "exchange", "bind", "events", "-k", "eu.orders.*", "-t", "orders-eu")
    out = run(capsys, url, "exchange", "bind", "events", "-k", "#.refund", "-t", "refunds")
    assert "bound topic refunds to events with key '#.refund'" in out
    out = run(capsys, url, "exchange", "publish", "events", "-r", "eu.orders.refund", "r1")
    assert "orders-eu/0@" in out and "refunds/0@" in out
    monkeypatch.setattr("sys.stdin", io.StringIO("x\ny\n"))
    out = run(capsys, url, "exchange", "publish", "events", "-", "-r", "us.sales")
    assert out.splitlines()[0].startswith("alternate unrouted/0@") and len(out.splitlines()) == 2
    out = run(capsys, url, "exchange", "describe", "events")
    assert "alternate: unrouted" in out and "eu.orders.*" in out and "#.refund" in out
    assert "events" in run(capsys, url, "exchange", "list")
    run(capsys, url, "exchange", "unbind", "events", "-k", "#.refund", "-t", "refunds")
    assert "#.refund" not in run(capsys, url, "exchange", "describe", "events")
    run(capsys, url, "exchange", "delete", "events")
    assert main(["exchange", "describe", "events", "--url", url]) == 1
    assert "unknown_exchange" in capsys.readouterr().err
    assert main(["exchange", "create", "e2", "--kind", "topic", "--url", url,
                 "--alternate-queue", "nope"]) == 1  # fmt: skip
    assert "unknown_destination" in capsys.readouterr().err


def test_request_prints_the_reply(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, url, "topic", "create", "rpc")
    with Client(url) as client:
        client.queue("rpc-q").create("rpc")

        def serve() -> None:
            with Client(url) as own:
                own.responder("rpc-q", lambda m: f"pong {m.text}", wait_ms=200).serve(1)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        out = run(capsys, url, "request", "-t", "rpc", "ping", "--format", "json")
        server.join(timeout=30)
    answer = json.loads(out)
    assert answer["value"] == "pong ping"
    assert answer["headers"]["correlation-id"] == answer["correlation_id"]
    assert main(["request", "-t", "rpc", "again", "--timeout-ms", "300", "--url", url]) == 1
    assert "timeout" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [["exchange"], ["exchange", "create"], ["exchange", "list"], ["exchange", "describe"],
     ["exchange", "delete"], ["exchange", "bind"], ["exchange", "unbind"],
     ["exchange", "publish"], ["request"]],
)  # fmt: skip
def test_every_exchange_command_has_help(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: raftline" in capsys.readouterr().out
