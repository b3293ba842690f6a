"""Opening a log after a crash: tail validation, torn or corrupt batch cuts, index rebuilds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftline.raftlog import batch, segment
from raftline.raftlog.index import OFFSET_ENTRY
from raftline.raftlog.log import LOG_START_FILE, CorruptLogError, LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import FileCache

CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=150, fsync="never")


def records(n: int, tag: str = "v") -> bytes:
    return build_batch([Record(value=f"{tag}{i}".encode()) for i in range(n)], timestamp=1000)


def filled_log(directory: Path, batches: int = 40) -> PartitionLog:
    log = PartitionLog(directory, CONFIG, FileCache())
    for i in range(batches):
        log.append(records(2, tag=f"b{i}-"), term=1)
    return log


def crash(log: PartitionLog) -> None:
    """Drop the log the way a killed process does: no clean shutdown, handles just closed."""
    log.files.close_all()


def seg(directory: Path, base: int, suffix: str = ".log") -> Path:
    return directory / f"{base:020d}{suffix}"


def last_batch_position(path: Path) -> int:
    return list(batch.iter_headers(path.read_bytes()))[-1][0]


def test_clean_close_reopens_with_a_clean_report(tmp_path: Path) -> None:
    filled_log(tmp_path).close()
    log = PartitionLog(tmp_path, CONFIG)
    assert log.recovery.clean
    assert log.recovery.next_offset == 80 and log.recovery.segments == len(log.segment_bases)


def test_torn_last_batch_is_cut_and_earlier_batches_survive(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    last = seg(tmp_path, log.segment_bases[-1])
    crash(log)
    size = last.stat().st_size
    torn_at = last_batch_position(last)
    os.truncate(last, size - 5)
    reopened = PartitionLog(tmp_path, CONFIG)
    assert reopened.recovery.truncated_bytes == size - 5 - torn_at
    assert "past the end" in (reopened.recovery.truncated_reason or "")
    assert reopened.next_offset == 78
    assert reopened.append(records(1), term=2) == 78


def test_bit_flip_in_the_tail_fails_the_crc_and_the_batch_is_cut(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    last = seg(tmp_path, log.segment_bases[-1])
    crash(log)
    data = bytearray(last.read_bytes())
    data[-3] ^= 0x10  # inside the last record's value
    last.write_bytes(data)
    reopened = PartitionLog(tmp_path, CONFIG)
    assert "CRC" in (reopened.recovery.truncated_reason or "")
    assert reopened.next_offset == 78
    assert last.stat().st_size == last_batch_position_of(data)


def last_batch_position_of(data: bytes | bytearray) -> int:
    return list(batch.iter_headers(bytes(data)))[-1][0]


def test_zeroed_garbage_after_the_last_batch_is_cut(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    last = seg(tmp_path, log.segment_bases[-1])
    crash(log)
    size = last.stat().st_size
    with last.open("ab") as f:
        f.write(bytes(4096))
    reopened = PartitionLog(tmp_path, CONFIG)
    assert reopened.recovery.truncated_bytes == 4096
    assert last.stat().st_size == size
    assert reopened.next_offset == 80


def test_corrupt_batch_in_the_middle_of_the_last_segment_cuts_from_there(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    base = log.segment_bases[-1]
    last = seg(tmp_path, base)
    crash(log)
    data = bytearray(last.read_bytes())
    positions = [pos for pos, _ in batch.iter_headers(bytes(data))]
    assert len(positions) >= 3
    data[positions[1] + 40] ^= 0xFF  # inside the second batch's CRC-covered header
    last.write_bytes(data)
    reopened = PartitionLog(tmp_path, CONFIG)
    assert reopened.next_offset == base + 2
    assert last.stat().st_size == positions[1]


def test_batch_with_an_unexpected_base_offset_is_cut(tmp_path: Path) -> None:
    log = filled_log(tmp_path, batches=3)
    crash(log)
    path = seg(tmp_path, 0)
    stray = bytearray(records(1))
    batch.stamp(stray, 99, 1)  # a valid batch, but not the offset that follows
    with path.open("ab") as f:
        f.write(stray)
    reopened = PartitionLog(tmp_path, CONFIG)
    assert "base offset 99" in (reopened.recovery.truncated_reason or "")
    assert reopened.next_offset == 6


@pytest.mark.parametrize("damage", ["missing", "partial_entry", "garbage", "zeroed", "past_end"])
def test_damaged_index_of_a_sealed_segment_is_rebuilt(tmp_path: Path, damage: str) -> None:
    log = filled_log(tmp_path)
    base = log.segment_bases[0]
    crash(log)
    index = seg(tmp_path, base, ".index")
    original = index.read_bytes()
    assert len(original) >= 16
    if damage == "missing":
        index.unlink()
    elif damage == "partial_entry":
        index.write_bytes(original[:-3])
    elif damage == "garbage":
        index.write_bytes(b"\xff" * len(original))
    elif damage == "zeroed":  # allocated but never written before the crash
        index.write_bytes(bytes(len(original)))
    else:  # an ordered entry for data the segment does not hold
        index.write_bytes(original + OFFSET_ENTRY.pack(10_000, 1 << 20))
    reopened = PartitionLog(tmp_path, CONFIG)
    assert reopened.recovery.rebuilt_indexes == [index.name]
    assert index.read_bytes() == original
    assert batch.parse_header(reopened.read(base + 5, 100)).base_offset == base + 4


def test_corruption_inside_an_older_segment_is_an_error_not_a_silent_cut(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    base = log.segment_bases[0]
    crash(log)
    path = seg(tmp_path, base)
    data = bytearray(path.read_bytes())
    data[200:212] = b"\xee" * 12
    path.write_bytes(data)
    seg(tmp_path, base, ".index").unlink()  # force a full scan of the damaged segment
    with pytest.raises(CorruptLogError, match=path.name):
        PartitionLog(tmp_path, CONFIG)


def test_truncated_older_segment_is_an_error(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    base = log.segment_bases[0]
    crash(log)
    path = seg(tmp_path, base)
    os.truncate(path, path.stat().st_size - 7)
    with pytest.raises(CorruptLogError):
        PartitionLog(tmp_path, CONFIG)


def test_missing_middle_segment_is_an_error(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    middle = log.segment_bases[1]
    crash(log)
    seg(tmp_path, middle).unlink()
    with pytest.raises(CorruptLogError, match="previous segment ends"):
        PartitionLog(tmp_path, CONFIG)


def test_segments_left_below_the_log_start_by_a_crash_are_removed(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    bases = log.segment_bases
    crash(log)
    # The checkpoint was written but the crash came before the old segments were deleted.
    (tmp_path / LOG_START_FILE).write_text(f"{bases[2]}\n")
    reopened = PartitionLog(tmp_path, CONFIG)
    assert reopened.segment_bases == bases[2:]
    assert reopened.recovery.removed_segments == [seg(tmp_path, b).name for b in bases[:2]]
    assert reopened.log_start_offset == bases[2]


def test_recovered_tail_is_durable_after_open(tmp_path: Path) -> None:
    filled_log(tmp_path, batches=5)  # never closed, never synced
    reopened = PartitionLog(tmp_path, CONFIG)
    assert reopened.durable_offset == reopened.next_offset == 10


def count_crc_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = segment.check_crc

    def counting(*args: object) -> None:
        calls.append(1)
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(segment, "check_crc", counting)
    return calls


def test_after_a_clean_close_open_checks_only_the_last_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filled_log(tmp_path).close()
    calls = count_crc_checks(monkeypatch)
    assert PartitionLog(tmp_path, CONFIG).next_offset == 80
    assert len(calls) == 1


def test_after_a_crash_open_crc_checks_the_whole_last_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = filled_log(tmp_path)
    batches_in_last = (log.next_offset - log.segment_bases[-1]) // 2
    crash(log)
    calls = count_crc_checks(monkeypatch)
    PartitionLog(tmp_path, CONFIG)
    assert len(calls) == batches_in_last > 1


def test_damaged_last_batch_after_a_clean_close_is_still_cut(tmp_path: Path) -> None:
    log = filled_log(tmp_path)
    last = seg(tmp_path, log.segment_bases[-1])
    log.close()
    data = bytearray(last.read_bytes())
    data[-3] ^= 0x10
    last.write_bytes(data)
    reopened = PartitionLog(tmp_path, CONFIG)
    assert "CRC" in (reopened.recovery.truncated_reason or "")
    assert reopened.next_offset == 78


def test_clean_shutdown_marker_is_used_once(tmp_path: Path) -> None:
    filled_log(tmp_path).close()
    log = PartitionLog(tmp_path, CONFIG, FileCache())
    log.append(records(2), term=2)
    last = seg(tmp_path, log.segment_bases[-1])
    crash(log)
    os.truncate(last, last.stat().st_size - 4)  # the crash tore the new batch
    reopened = PartitionLog(tmp_path, CONFIG)
    assert reopened.recovery.truncated_bytes > 0
    assert reopened.next_offset == 80
