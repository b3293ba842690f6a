"""segment.ms without appends: the active segment is sealed once its first batch is that old."""

from __future__ import annotations

from pathlib import Path

from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import FileCache


def log_at(directory: Path, clock: list[int]) -> PartitionLog:
    config = LogConfig(segment_ms=1000, fsync="never")
    return PartitionLog(directory, config, FileCache(), clock=lambda: clock[0])


def test_an_idle_active_segment_is_sealed_once_segment_ms_old(tmp_path: Path) -> None:
    clock = [10_000]
    log = log_at(tmp_path, clock)
    log.append(build_batch([Record(b"a")]), term=1)
    assert not log.roll_if_older(10_999)
    assert log.roll_if_older(11_000)
    assert [s.next_offset for s in log.sealed_segments()] == [1]
    assert log.segment_bases == [0, 1]


def test_an_empty_active_segment_is_never_sealed(tmp_path: Path) -> None:
    clock = [10_000]
    log = log_at(tmp_path, clock)
    assert not log.roll_if_older(99_000)
    log.append(build_batch([Record(b"a")]), term=1)
    assert log.roll_if_older(99_000)
    assert not log.roll_if_older(199_000)  # the new active segment holds nothing yet
    assert len(log.segment_bases) == 2


def test_records_appended_after_a_time_roll_read_back_across_segments(tmp_path: Path) -> None:
    clock = [10_000]
    log = log_at(tmp_path, clock)
    log.append(build_batch([Record(b"a")]), term=1)
    log.roll_if_older(20_000)
    clock[0] = 20_000
    log.append(build_batch([Record(b"b")]), term=1)
    data, next_offset = log.read_from(0, 1 << 20)
    assert next_offset == 1 and b"a" in data
    assert b"b" in log.read_from(1, 1 << 20)[0]
