"""A round's fsyncs of several partition logs run side by side and fail together."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from raftline.node.rounds import fsync_all


class Log:
    """A storage whose fsync waits for the barrier's other parties (fsyncs under way at once)."""

    def __init__(self, barrier: threading.Barrier | None = None, fails: bool = False) -> None:
        self.barrier, self.fails, self.synced = barrier, fails, False

    def fsync(self) -> None:
        if self.barrier is not None:
            self.barrier.wait(timeout=5)
        if self.fails:
            raise OSError("disk gone")
        self.synced = True


def test_the_fsyncs_of_a_round_run_at_the_same_time() -> None:
    barrier = threading.Barrier(3)  # serial fsyncs would time out waiting for each other
    logs = [Log(barrier) for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        fsync_all(pool, logs)  # type: ignore[arg-type]
    assert all(log.synced for log in logs)


def test_a_failed_fsync_fails_the_round_after_the_others_finish() -> None:
    logs = [Log(), Log(fails=True), Log()]
    with ThreadPoolExecutor(3) as pool, pytest.raises(OSError, match="disk gone"):
        fsync_all(pool, logs)  # type: ignore[arg-type]
    assert logs[0].synced and logs[2].synced


def test_the_calling_thread_runs_one_fsync_itself_instead_of_idling() -> None:
    ran_on: list[threading.Thread] = []

    class Noting(Log):
        def fsync(self) -> None:
            ran_on.append(threading.current_thread())

    with ThreadPoolExecutor(3) as pool:
        fsync_all(pool, [Noting(), Noting(), Noting()])  # type: ignore[list-item]
    assert ran_on.count(threading.current_thread()) == 1 and len(ran_on) == 3


def test_each_fsync_reports_when_it_was_handed_over_started_and_returned() -> None:
    timings: list[tuple[float, float, float]] = []
    with ThreadPoolExecutor(3) as pool:
        fsync_all(pool, [Log(), Log(), Log()], timings)  # type: ignore[list-item]
    assert len(timings) == 3
    assert all(handed <= started <= returned for handed, started, returned in timings)
