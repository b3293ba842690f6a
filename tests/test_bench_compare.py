"""The comparison runs a second Raftline system, raftline-nofsync, on nodes started with
`--fsync never`, through the same driver, and states what its acknowledgement means."""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bench import compare as compare_module
from bench.__main__ import parser
from bench.compare import PEER_OF, CompareOptions
from bench.drivers import driver_class
from bench.drivers.base import Endpoint
from bench.peers import PEERS, Peer, RaftlinePeer
from bench.workload import workload_from_dict


def _spawned_argv(system: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The node command line the peer serving `system` launches (nothing is started)."""
    launched: list[list[str]] = []

    def spawn(self: Peer, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        launched.append(argv)

    monkeypatch.setattr(Peer, "_spawn", spawn)
    monkeypatch.setattr("bench.peers._wait_for", lambda *args: None)
    PEERS[PEER_OF[system]](1, tmp_path).start()
    return launched[0]


def test_the_default_quick_run_includes_the_nofsync_variant() -> None:
    args = parser().parse_args(["compare", "--quick"])
    assert "raftline" in args.systems
    assert "raftline-nofsync" in args.systems


def test_the_nofsync_variant_runs_its_own_nodes() -> None:
    assert PEER_OF["raftline-nofsync"] != PEER_OF["raftline"]


def test_the_nofsync_variant_starts_nodes_with_fsync_never(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv = _spawned_argv("raftline-nofsync", monkeypatch, tmp_path)
    assert argv[argv.index("--fsync") + 1] == "never"


def test_raftline_still_starts_nodes_with_fsync_always(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv = _spawned_argv("raftline", monkeypatch, tmp_path)
    assert argv[argv.index("--fsync") + 1] == "always"


def test_the_nofsync_variant_uses_the_raftline_driver() -> None:
    assert driver_class("raftline-nofsync") is driver_class("raftline")


def test_the_nofsync_variant_states_that_acks_precede_any_fsync(tmp_path: Path) -> None:
    statement = PEERS["raftline-nofsync"](3, tmp_path).durability()
    assert statement is not None
    assert "`--fsync never`" in statement
    assert "after a majority of the replicas wrote the batch" in statement
    assert "(OS page cache), no fsync" in statement


def test_raftline_fsync_always_keeps_the_drivers_statement(tmp_path: Path) -> None:
    assert RaftlinePeer(1, tmp_path).durability() is None


class _Driver:
    durability = "the driver's statement"

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def _one_result(*args: Any) -> dict[str, Any]:
    return {
        "workload": "w",
        "errors": 0,
        "publish_msgs_per_s": 1.0,
        "publish_mb_per_s": 0.0,
        "consume_msgs_per_s": 1.0,
        "publish_latency_ms": None,
        "e2e_latency_ms": None,
    }


def test_a_peers_durability_statement_replaces_the_drivers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compare_module, "driver_class", lambda system: _Driver)
    monkeypatch.setattr(compare_module, "_run_workload", _one_result)
    options = CompareOptions(workloads=[workload_from_dict({"name": "w"})], log=lambda _: None)
    endpoint = Endpoint("127.0.0.1", {"http": 1})
    runs = asyncio.run(
        compare_module._run_system("raftline-nofsync", endpoint, "id", options, "k", "no fsync")
    )
    assert [run["durability"] for run in runs] == ["no fsync"]
