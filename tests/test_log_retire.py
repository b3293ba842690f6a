"""Segments a prefix drop (retention, snapshots) removes leave the log at once, renamed, and
are unlinked on a background thread, never under the log's lock; recovery removes what a crash
left of them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import DELETED_SUFFIX, unlink_later

BATCH = build_batch([Record(value=b"x" * 1000)], timestamp=0)


def _log(directory: Path) -> PartitionLog:
    log = PartitionLog(directory, LogConfig(segment_bytes=8 * 1024, fsync="never"))
    for _ in range(40):
        log.append(BATCH, 1)
    return log


def _drain_unlinks() -> None:
    unlink_later([]).result(timeout=10)  # one background thread: this runs after earlier ones


def test_a_dropped_segment_is_gone_from_its_name_at_once(tmp_path: Path) -> None:
    log = _log(tmp_path)
    first = sorted(tmp_path.glob("*.log"))[0]
    log.drop_prefix(log.sealed_segments()[1].base_offset)
    assert not first.exists()
    log.close()


def test_dropped_segments_are_unlinked_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path)
    threads: list[str] = []
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        threads.append(threading.current_thread().name)
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    log.drop_prefix(log.sealed_segments()[2].base_offset)
    _drain_unlinks()
    assert threads and all(name.startswith("raftline-unlink") for name in threads)
    assert not list(tmp_path.glob("*" + DELETED_SUFFIX))
    log.close()


def test_recovery_removes_retired_files_a_crash_left(tmp_path: Path) -> None:
    _log(tmp_path).close()
    leftover = tmp_path / ("00000000000000000000.log" + DELETED_SUFFIX)
    leftover.write_bytes(b"old")
    reopened = PartitionLog(tmp_path, LogConfig(segment_bytes=8 * 1024))
    assert not leftover.exists()
    assert reopened.next_offset == 40
    reopened.close()
