"""Appends without sync: the active segment's write buffer, flush, and one fsync per round.

Buffered batches are readable, reach the file on flush or sync, and RaftStorage never fsyncs
inside append, so the node's one fsync per round is the only one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from raftline.raftlog import batch
from raftline.raftlog.log import LogConfig, LogFailedError, PartitionLog
from raftline.raftlog.records import Record, build_batch, iter_batches
from raftline.raftlog.segment import WRITE_BUFFER_BYTES, FileCache
from raftline.raftlog.storage import RaftStorage
from raftline.raftlog.types import Entry, EntryKind

SMALL = build_batch([Record(value=b"s" * 100)], timestamp=5)


def segment_file(directory: Path) -> Path:
    (path,) = directory.glob("*.log")
    return path


def file_offsets(directory: Path) -> list[int]:
    data = segment_file(directory).read_bytes()
    return [header.base_offset for _, header in batch.iter_headers(data)]


class CallCounter:
    """Stands in for an os function, counting calls."""

    def __init__(self, real: Callable[..., object]) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, *args: object) -> object:
        self.calls += 1
        return self.real(*args)


@pytest.fixture
def fdatasync(monkeypatch: pytest.MonkeyPatch) -> CallCounter:
    counter = CallCounter(os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", counter)
    return counter


def failing_pwritev(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(*_: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwritev", no_space)


def test_unsynced_appends_stay_out_of_the_file_until_flushed(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    for _ in range(3):
        log.append(SMALL, term=1, sync=False)
    assert file_offsets(tmp_path) == []
    log.flush()
    assert file_offsets(tmp_path) == [0, 1, 2]


def test_never_policy_append_reaches_the_file_before_returning(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    log.append(SMALL, term=1)
    log.append(SMALL, term=1)
    assert file_offsets(tmp_path) == [0, 1]


def test_interval_policy_buffers_small_appends_until_the_fsync_is_due(
    tmp_path: Path, fdatasync: CallCounter
) -> None:
    config = LogConfig(
        fsync="interval", flush_interval_bytes=3 * len(SMALL), flush_interval_ms=10**9
    )
    log = PartitionLog(tmp_path, config)
    log.append(SMALL, term=1)
    log.append(SMALL, term=1)
    assert (file_offsets(tmp_path), fdatasync.calls) == ([], 0)
    log.append(SMALL, term=1)
    assert (file_offsets(tmp_path), fdatasync.calls) == ([0, 1, 2], 1)
    assert log.durable_offset == 3


def test_reads_see_buffered_batches_stamped_with_valid_crcs(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    log.append(SMALL, term=3, sync=False)
    log.append(SMALL, term=4, sync=False)
    data = log.read(0, 1 << 20)
    assert [b.records[0].offset for b in iter_batches(data)] == [0, 1]  # verifies CRCs
    assert [h.leader_epoch for _, h in batch.iter_headers(data)] == [3, 4]
    assert log.header_at(1).leader_epoch == 4


def test_sync_writes_and_fsyncs_buffered_batches_once(
    tmp_path: Path, fdatasync: CallCounter
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="always"))
    for _ in range(5):
        log.append(SMALL, term=1, sync=False)
    assert (fdatasync.calls, log.durable_offset) == (0, 0)
    assert log.sync() == 5
    assert fdatasync.calls == 1
    assert file_offsets(tmp_path) == [0, 1, 2, 3, 4]


def test_a_full_buffer_is_written_without_waiting_for_a_flush(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    count = WRITE_BUFFER_BYTES // len(SMALL) + 1
    for _ in range(count):
        log.append(SMALL, term=1, sync=False)
    assert file_offsets(tmp_path) == list(range(count))


def test_a_large_batch_goes_to_the_file_behind_the_buffered_ones(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    large = build_batch([Record(value=b"L" * WRITE_BUFFER_BYTES)], timestamp=5)
    log.append(SMALL, term=1, sync=False)
    log.append(large, term=1, sync=False)
    assert file_offsets(tmp_path) == [0, 1]


def test_truncating_into_the_buffered_tail_keeps_the_batches_before_it(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    for _ in range(4):
        log.append(SMALL, term=1, sync=False)
    assert log.truncate_suffix(2) == 2
    log.append(SMALL, term=2, sync=False)
    log.flush()
    data = segment_file(tmp_path).read_bytes()
    assert [(h.base_offset, h.leader_epoch) for _, h in batch.iter_headers(data)] == [
        (0, 1),
        (1, 1),
        (2, 2),
    ]


def test_a_failed_buffer_write_fails_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = FileCache()
    log = PartitionLog(tmp_path, LogConfig(fsync="never"), files)
    log.append(SMALL, term=1, sync=False)
    failing_pwritev(monkeypatch)
    with pytest.raises(LogFailedError):
        log.flush()
    monkeypatch.undo()
    with pytest.raises(LogFailedError):
        log.append(SMALL, term=1)


def data_entry(index: int) -> Entry:
    return Entry(index, 1, EntryKind.DATA, SMALL, 1)


def test_raft_storage_append_never_fsyncs_and_fsync_syncs_the_round_once(
    tmp_path: Path, fdatasync: CallCounter
) -> None:
    storage = RaftStorage(tmp_path, LogConfig(fsync="always"))
    storage.append([data_entry(0), data_entry(1)])
    storage.append([data_entry(2)])
    assert fdatasync.calls == 0
    assert file_offsets(tmp_path) == [0, 1, 2]  # written: a killed process keeps them
    storage.fsync()
    assert fdatasync.calls == 1
    assert storage.log.durable_offset == 3


def test_unsynced_appends_across_rolls_read_back_in_order_and_reopen_after_sync(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=1000, index_interval_bytes=150, fsync="never")
    log = PartitionLog(tmp_path, config)
    batches = [build_batch([Record(value=b"%d" % i)], timestamp=i) for i in range(40)]
    log.append_many([(data, 1) for data in batches[:25]], sync=False)
    for data in batches[25:]:
        log.append(data, term=2, sync=False)
    assert len(log.segment_bases) > 1
    offset, values = 0, []
    while offset < log.next_offset:
        data, offset = log.read_from(offset, 300)
        values += [b.records[0].value for b in iter_batches(data)]
    assert values == [b"%d" % i for i in range(40)]
    log.sync()
    log.files.close_all()  # killed: no clean shutdown
    reopened = PartitionLog(tmp_path, config)
    assert reopened.recovery.truncated_bytes == 0
    assert reopened.next_offset == 40
    assert reopened.offset_for_timestamp(30) == 30


def test_append_many_with_a_batch_shorter_than_a_header_writes_none(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    with pytest.raises(batch.CorruptBatchError):
        log.append_many([(SMALL, 1), (b"short", 1)])
    assert log.next_offset == 0
    log.flush()
    assert file_offsets(tmp_path) == []


def test_a_failed_write_of_a_large_batch_fails_the_log_keeping_what_came_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    log.append(SMALL, term=1)
    large = build_batch([Record(value=b"L" * WRITE_BUFFER_BYTES)], timestamp=5)
    failing_pwritev(monkeypatch)
    with pytest.raises(LogFailedError):
        log.append(large, term=1)
    monkeypatch.undo()
    assert log.next_offset == 1
    assert file_offsets(tmp_path) == [0]  # no part of the large batch
    with pytest.raises(LogFailedError):
        log.append(SMALL, term=1)


def test_a_failed_write_of_a_full_buffer_during_append_fails_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    for _ in range(WRITE_BUFFER_BYTES // len(SMALL) - 1):
        log.append(SMALL, term=1, sync=False)
    failing_pwritev(monkeypatch)
    with pytest.raises(LogFailedError):
        for _ in range(2):
            log.append(SMALL, term=1, sync=False)
    monkeypatch.undo()
    with pytest.raises(LogFailedError):
        log.append(SMALL, term=1, sync=False)
