"""Under fsync "never" the log asks the kernel to start writeback as it writes, so that sealing
a segment at a roll (an fsync) finds little dirty data and appends do not stall behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftline.raftlog import segment
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import build_batch

MIB = 1024 * 1024


@pytest.fixture
def writeback_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    calls: list[tuple[int, int, int]] = []

    def record(fd: int, start: int, length: int, flags: int) -> int:
        calls.append((start, length, flags))
        return 0

    monkeypatch.setattr(segment, "_sync_file_range", record)
    return calls


def write_mib(log: PartitionLog, count: int) -> None:
    one_mib = build_batch([b"x" * (MIB - 200)])
    for _ in range(count):
        log.append(one_mib, term=1)


def test_never_starts_writeback_of_each_step_written(
    tmp_path: Path, writeback_calls: list[tuple[int, int, int]]
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    write_mib(log, 20)
    ends = [start + length for start, length, _ in writeback_calls]
    # Each written byte is handed to writeback once, in ranges of at least a step, up to the
    # end of what the file holds (every 1 MiB append is past a step).
    assert [start for start, _, _ in writeback_calls] == [0, *ends[:-1]]
    assert all(length >= segment.WRITEBACK_STEP_BYTES for _, length, _ in writeback_calls)
    assert ends[-1] == sum(p.stat().st_size for p in tmp_path.glob("*.log"))
    assert {flags for _, _, flags in writeback_calls} == {segment._SYNC_FILE_RANGE_WRITE}


def test_always_leaves_writeback_to_its_fsyncs(
    tmp_path: Path, writeback_calls: list[tuple[int, int, int]]
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="always"))
    write_mib(log, 20)
    assert writeback_calls == []


def test_never_starts_writeback_when_a_round_of_appends_is_flushed(
    tmp_path: Path, writeback_calls: list[tuple[int, int, int]]
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    one_mib = build_batch([b"x" * (MIB - 200)])
    log.append_many([(one_mib, 1)] * 10, sync=False)  # as the Raft storage writes a round
    log.flush()
    assert [start for start, _, _ in writeback_calls] == [0]
