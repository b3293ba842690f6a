"""The comparison runs a second Raftline system, raftline-nofsync, on nodes started with
`--fsync never`, through the same driver, and states what its acknowledgement means; every
workload starts with no dirty pages left by the one before."""

from pathlib import Path

import pytest
from test_bench_runner import StallingDriver

from bench.__main__ import parser
from bench.compare import PEER_OF, CompareOptions, _run_workload
from bench.drivers import driver_class
from bench.drivers.base import Endpoint
from bench.peers import PEERS, Peer
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


def test_the_nofsync_variant_states_that_acks_precede_any_fsync() -> None:
    endpoint = Endpoint("127.0.0.1", {"http": 1}, 3, {"fsync": "never"})
    statement = driver_class("raftline-nofsync")(endpoint).durability
    assert "`--fsync never`" in statement
    assert "after a majority wrote the batch to the segment file (OS page cache)" in statement
    assert "no fsync first" in statement


def test_raftline_states_that_acks_follow_the_fsync() -> None:
    endpoint = Endpoint("127.0.0.1", {"http": 1}, 3, {"fsync": "always"})
    statement = driver_class("raftline")(endpoint).durability
    assert "acks=all answers after a majority fsynced the batch" in statement


class TopicLog(StallingDriver):
    """Records topic creation, the first step of every workload run, next to the syncs."""

    def __init__(self, events: list[str]) -> None:
        super().__init__(Endpoint("127.0.0.1", {}))
        self.events = events

    async def create_topic(self, topic: str, partitions: int) -> None:
        self.events.append("create_topic")
        await super().create_topic(topic, partitions)


async def test_dirty_pages_are_written_back_before_each_workload_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    monkeypatch.setattr("bench.compare.os.sync", lambda: events.append("sync"))
    workload = workload_from_dict(
        {"name": "w", "consumers_per_topic": 0, "duration_seconds": 0.1, "warmup_seconds": 0.0}
    )
    options = CompareOptions(workloads=[workload])
    for _ in range(2):
        await _run_workload(TopicLog(events), workload, "t", 100.0, options)
    assert events == ["sync", "create_topic"] * 2


def test_the_idempotent_variant_shares_raftlines_nodes_and_numbers_its_batches() -> None:
    args = parser().parse_args(["compare", "--quick"])
    assert "raftline-idempotent" in args.systems
    assert PEER_OF["raftline-idempotent"] == PEER_OF["raftline"]
    endpoint = Endpoint("127.0.0.1", {"http": 1}, 3, {"fsync": "always"})
    assert driver_class("raftline-idempotent")(endpoint).idempotent
    assert not driver_class("raftline")(endpoint).idempotent
