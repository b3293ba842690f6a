"""fsync policies and group commit: concurrent appends share one fsync; durable offset tracking."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from raftline.raftlog.log import LogConfig, LogFailedError, PartitionLog
from raftline.raftlog.records import Record, build_batch

BATCH = build_batch([Record(value=b"x" * 100)], timestamp=0)


class CountingSync:
    """Stands in for os.fdatasync: counts calls and can hold the first one until released."""

    def __init__(self, real: Callable[[int], None], hold_first: bool = False) -> None:
        self.real = real
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        self.release.wait(10)
        self.real(fd)


@pytest.fixture
def fdatasync(monkeypatch: pytest.MonkeyPatch) -> CountingSync:
    counter = CountingSync(os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", counter)
    return counter


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_always_policy_makes_each_append_durable_before_it_returns(
    tmp_path: Path, fdatasync: CountingSync
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="always"))
    for i in range(3):
        assert log.append(BATCH, term=1) == i
        assert log.durable_offset == i + 1
    assert fdatasync.calls == 3


def test_appends_arriving_during_an_fsync_share_the_next_single_fsync(
    tmp_path: Path, fdatasync: CountingSync
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="always"))
    fdatasync.release.clear()
    durable_after: list[int] = []

    def append() -> None:
        base = log.append(BATCH, term=1)
        durable_after.append(log.durable_offset - base)

    first = threading.Thread(target=append)
    first.start()
    assert fdatasync.entered.wait(10)  # the first fsync is in flight and held
    others = [threading.Thread(target=append) for _ in range(5)]
    for t in others:
        t.start()
    wait_until(lambda: log.next_offset == 6)
    time.sleep(0.05)  # let them queue behind the running fsync
    fdatasync.release.set()
    for t in [first, *others]:
        t.join(10)
    assert fdatasync.calls == 2
    assert log.durable_offset == 6
    assert all(margin > 0 for margin in durable_after)  # each saw its own batch durable


def test_many_threads_appending_use_fewer_fsyncs_than_appends(
    tmp_path: Path, fdatasync: CountingSync
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="always"))
    real = fdatasync.real
    fdatasync.real = lambda fd: (time.sleep(0.005), real(fd))[1]

    def worker() -> None:
        for _ in range(10):
            log.append(BATCH, term=1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert log.next_offset == log.durable_offset == 80
    assert fdatasync.calls < 80


def test_never_policy_syncs_only_when_asked(tmp_path: Path, fdatasync: CountingSync) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    for _ in range(5):
        log.append(BATCH, term=1)
    assert (fdatasync.calls, log.durable_offset) == (0, 0)
    assert log.sync() == 5
    assert fdatasync.calls == 1
    assert log.sync() == 5 and fdatasync.calls == 1  # nothing new: no fsync


def test_interval_policy_syncs_once_enough_bytes_are_unsynced(
    tmp_path: Path, fdatasync: CountingSync
) -> None:
    config = LogConfig(
        fsync="interval", flush_interval_bytes=3 * len(BATCH), flush_interval_ms=10**9
    )
    log = PartitionLog(tmp_path, config, clock=lambda: 0)
    log.append(BATCH, term=1)
    log.append(BATCH, term=1)
    assert (fdatasync.calls, log.durable_offset) == (0, 0)
    log.append(BATCH, term=1)
    assert (fdatasync.calls, log.durable_offset) == (1, 3)


def test_interval_policy_syncs_once_the_interval_elapsed(
    tmp_path: Path, fdatasync: CountingSync
) -> None:
    now = [0]
    config = LogConfig(fsync="interval", flush_interval_bytes=1 << 30, flush_interval_ms=100)
    log = PartitionLog(tmp_path, config, clock=lambda: now[0])
    log.append(BATCH, term=1)
    log.maybe_sync()
    assert log.durable_offset == 0
    now[0] = 100
    log.maybe_sync()
    assert (fdatasync.calls, log.durable_offset) == (1, 1)


def test_truncation_pulls_the_durable_offset_back(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="always"))
    for _ in range(4):
        log.append(BATCH, term=1)
    log.truncate_suffix(2)
    assert log.durable_offset == 2
    log.append(BATCH, term=2)
    assert log.durable_offset == 3


def test_a_failed_fsync_makes_the_log_refuse_writes_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="always"))
    log.append(BATCH, term=1)

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(LogFailedError):
        log.append(BATCH, term=1)
    monkeypatch.undo()  # the disk "works" again, but the lost pages cannot be trusted
    with pytest.raises(LogFailedError):
        log.sync()
    with pytest.raises(LogFailedError):
        log.append(BATCH, term=1)
    assert log.durable_offset == 1
    assert PartitionLog(tmp_path, LogConfig(fsync="always")).next_offset == 2
