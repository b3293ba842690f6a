"""Specification of fault shapes and of the fault schedule (pure parts; Docker parts are marked)."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from raftline.chaos import nemesis
from raftline.chaos.availability import NS, fault_windows
from raftline.chaos.cluster import ClusterError, ComposeCluster, Node, StaticCluster
from raftline.chaos.history import NEMESIS, Recorder
from raftline.chaos.nemesis import ClockSkew, Schedule, StorageOutage, majorities_ring, make_faults


@pytest.mark.parametrize("n", [3, 5, 7])
def test_majorities_ring_gives_every_node_a_distinct_majority(n: int) -> None:
    sees = majorities_ring(range(1, n + 1), random.Random(n))
    assert all(node in seen and len(seen) == n // 2 + 1 for node, seen in sees.items())
    assert len({frozenset(seen) for seen in sees.values()}) == n


def test_majorities_ring_of_five_is_symmetric() -> None:
    sees = majorities_ring(range(1, 6), random.Random(1))
    assert all(a in sees[b] for a in sees for b in sees[a])


def test_faults_against_a_cluster_run_elsewhere_are_rejected() -> None:
    with pytest.raises(ValueError, match="faults need the compose cluster"):
        make_faults(StaticCluster(["http://127.0.0.1:1"]), ["partition"], "t")


def test_no_nemesis_needs_no_fault_control() -> None:
    assert make_faults(StaticCluster(["http://127.0.0.1:1"]), [], "t") == []


def test_storage_outage_without_an_object_storage_service_is_a_clear_failure() -> None:
    (outage,) = make_faults(ComposeCluster(3), ["s3"], "t")
    assert isinstance(outage, StorageOutage)
    with pytest.raises(ClusterError, match="no running object storage"):
        outage.start(random.Random(0))


@dataclass
class CountingFault:
    name: str = "partition"
    calls: list[str] = field(default_factory=list)

    def start(self, rng: random.Random) -> dict[str, Any]:
        self.calls.append("start")
        return {"fault": self.name}

    def stop(self) -> dict[str, Any]:
        self.calls.append("stop")
        return {"fault": self.name}


def run_schedule(fault: CountingFault, tmp_path: Path) -> Recorder:
    recorder = Recorder(tmp_path / "h.jsonl")
    schedule = Schedule(
        [fault], recorder, random.Random(0), quiet_s=(0.01, 0.02), fault_s=(0.01, 0.02)
    )
    worker = threading.Thread(target=schedule.run)
    worker.start()
    threading.Event().wait(0.3)
    schedule.stopping.set()
    worker.join(5)
    recorder.close()
    return recorder


def test_schedule_heals_every_fault_it_starts(tmp_path: Path) -> None:
    fault = CountingFault()
    run_schedule(fault, tmp_path)
    assert fault.calls.count("start") >= 2
    assert fault.calls.count("start") == fault.calls.count("stop")
    assert fault.calls[-1] == "stop"


def test_schedule_records_fault_windows_in_the_history(tmp_path: Path) -> None:
    recorder = run_schedule(CountingFault(), tmp_path)
    windows = fault_windows(recorder.ops)
    assert windows and all(w.end is not None and w.start <= w.end for w in windows)
    assert {op.process for op in recorder.ops} == {NEMESIS}


class FailingFault(CountingFault):
    def start(self, rng: random.Random) -> dict[str, Any]:
        raise OSError("no nft here")


def test_fault_that_fails_to_start_opens_no_window(tmp_path: Path) -> None:
    recorder = run_schedule(FailingFault(), tmp_path)
    assert any(op.type == "fail" for op in recorder.ops)
    assert fault_windows(recorder.ops) == []


@dataclass
class StubbornHeal(CountingFault):
    """A fault whose first two heals fail, as a node too busy to answer its hook does."""

    failed_heals: int = 0

    def stop(self) -> dict[str, Any]:
        self.calls.append("stop")
        if self.failed_heals < 2:
            self.failed_heals += 1
            raise ClusterError("test hook /v1/admin/clock on node 2: timed out")
        return {"fault": self.name}


def test_a_heal_that_fails_is_tried_again_and_closes_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Schedule, "HEAL_RETRY_S", 0.01)
    fault = StubbornHeal()
    recorder = run_schedule(fault, tmp_path)
    assert fault.failed_heals == 2
    assert fault.calls.count("start") + 2 == fault.calls.count("stop")
    windows = fault_windows(recorder.ops)
    assert len(windows) == fault.calls.count("start")
    assert all(w.end is not None for w in windows)


def test_a_hook_reset_reaches_every_node_when_one_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    reached = []

    def post_hook(node: Node, path: str, body: dict[str, Any]) -> None:
        reached.append(node.node_id)
        if node.node_id == 2:
            raise ClusterError(f"test hook {path} on node 2: timed out")

    monkeypatch.setattr(nemesis, "post_hook", post_hook)
    cluster = ComposeCluster(5)
    with pytest.raises(ClusterError, match="node 2"):
        ClockSkew(cluster).stop()
    assert reached == [1, 2, 3, 4, 5]


def test_the_placebo_nemesis_changes_nothing_and_opens_a_window(tmp_path: Path) -> None:
    (placebo,) = make_faults(ComposeCluster(3), ["none"], "t")
    assert placebo.start(random.Random(0)) == {"fault": "none"}
    assert placebo.stop() == {"fault": "none"}


def test_a_fault_lasts_its_shortest_length_when_the_run_ends_first(tmp_path: Path) -> None:
    fault = CountingFault()
    recorder = Recorder(tmp_path / "h.jsonl")
    schedule = Schedule([fault], recorder, random.Random(0), quiet_s=(0.01, 0.02), fault_s=(1, 2))
    worker = threading.Thread(target=schedule.run)
    worker.start()
    while "start" not in fault.calls:
        threading.Event().wait(0.01)
    schedule.stopping.set()  # the run ends just after the fault started
    worker.join(5)
    recorder.close()
    (window,) = fault_windows(recorder.ops)
    assert window.end is not None and window.end - window.start >= 1 * NS
