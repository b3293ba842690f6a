"""Partition log behaviour: offsets, reads, time lookup, truncation, prefix drops, retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftline.raftlog import batch
from raftline.raftlog.index import OFFSET_ENTRY, TIME_ENTRY, SparseIndex
from raftline.raftlog.log import LogConfig, OffsetOutOfRangeError, PartitionLog
from raftline.raftlog.records import Record, build_batch, iter_batches
from raftline.raftlog.segment import WRITE_BUFFER_BYTES


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def records(n: int, ts: int = 1000, tag: str = "v") -> bytes:
    return build_batch([Record(value=f"{tag}{i}".encode()) for i in range(n)], timestamp=ts)


def headers(data: bytes) -> list[batch.BatchHeader]:
    return [h for _, h in batch.iter_headers(data)]


def small_log(tmp_path: Path, **config: int | str) -> PartitionLog:
    cfg = {"segment_bytes": 1000, "index_interval_bytes": 150, "fsync": "never"} | config
    return PartitionLog(tmp_path / "p0", LogConfig(**cfg), clock=Clock())  # type: ignore[arg-type]


def test_append_assigns_consecutive_offsets_per_record(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    assert [log.append(records(n), term=1) for n in (3, 1, 5)] == [0, 3, 4]
    assert log.next_offset == 9


def test_append_stamps_base_offset_and_term_without_breaking_the_crc(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    log.append(records(2), term=7)
    log.append(records(2), term=9)
    data = log.read(0, 1 << 20)
    assert [(h.base_offset, h.leader_epoch) for h in headers(data)] == [(0, 7), (2, 9)]
    assert [b.records[0].offset for b in iter_batches(data)] == [0, 2]  # verifies CRCs


def test_mutable_batch_is_stamped_in_place(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    log.append(records(1), term=1)
    mutable = bytearray(records(1))
    log.append(mutable, term=4)
    header = batch.parse_header(mutable)
    assert (header.base_offset, header.leader_epoch) == (1, 4)


def test_follower_append_must_use_the_next_offset(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    assert log.append(records(2), term=1, base_offset=0) == 0
    with pytest.raises(ValueError, match="next offset is 2"):
        log.append(records(1), term=1, base_offset=5)
    assert log.next_offset == 2


def test_append_rejects_a_batch_whose_length_disagrees_with_its_header(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    with pytest.raises(batch.CorruptBatchError):
        log.append(records(2) + b"extra", term=1)
    with pytest.raises(batch.CorruptBatchError):
        log.append(b"\x00" * 70, term=1)
    assert log.next_offset == 0 and log.size_bytes == 0


def test_read_starts_at_the_batch_containing_the_offset(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for _ in range(4):
        log.append(records(3), term=1)
    assert headers(log.read(7, 1 << 20))[0].base_offset == 6


def test_read_stops_at_whole_batches_within_max_bytes(tmp_path: Path) -> None:
    log = small_log(tmp_path, segment_bytes=1 << 20)
    sizes = [len(records(2)) for _ in range(10)]
    for _ in range(10):
        log.append(records(2), term=1)
    data = log.read(0, sizes[0] * 3 + 5)
    assert len(data) == sizes[0] * 3
    assert [h.base_offset for h in headers(data)] == [0, 2, 4]


def test_read_returns_one_whole_batch_even_beyond_max_bytes(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    log.append(records(5), term=1)
    log.append(records(5), term=1)
    data = log.read(0, 10)
    assert [h.base_offset for h in headers(data)] == [0]


def test_read_stops_before_the_batch_containing_upto(tmp_path: Path) -> None:
    log = small_log(tmp_path, segment_bytes=1 << 20)
    for _ in range(5):
        log.append(records(2), term=1)
    assert [h.base_offset for h in headers(log.read(0, 1 << 20, upto=6))] == [0, 2, 4]
    assert log.read(6, 1 << 20, upto=6) == b""


def test_sequential_reads_return_every_batch_once_with_the_offset_to_go_on(
    tmp_path: Path,
) -> None:
    log = small_log(tmp_path, segment_bytes=1 << 20)
    for n in range(1, 40):
        log.append(records(n % 4 + 1, tag="x" * n), term=1)
    offset, seen = 0, []
    while offset < log.next_offset:
        data, offset = log.read_from(offset, 700)
        assert 0 < len(data) <= 700
        seen += headers(data)
        assert offset == seen[-1].last_offset + 1
    assert [h.base_offset for h in seen[1:]] == [h.last_offset + 1 for h in seen[:-1]]
    assert len(seen) == 39


def test_read_where_the_last_read_stopped_sees_batches_rewritten_by_truncation(
    tmp_path: Path,
) -> None:
    log = small_log(tmp_path, segment_bytes=1 << 20)
    for _ in range(3):
        log.append(records(1), term=1)
    _, following = log.read_from(0, len(records(1)) * 2)
    assert following == 2
    log.truncate_suffix(1)
    log.append(records(3), term=2)  # offsets 1 to 3, where offsets 1 and 2 were
    assert [(h.base_offset, h.leader_epoch) for h in headers(log.read(2, 1 << 20))] == [(1, 2)]


def test_read_crosses_into_the_next_segment_when_one_is_exhausted(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    while len(log.segment_bases) < 3:
        log.append(records(3), term=1)
    second = log.segment_bases[1]
    data = log.read(second, 1 << 20)
    assert headers(data)[0].base_offset == second
    assert headers(data)[-1].last_offset == log.segment_bases[2] - 1


def test_read_at_the_end_is_empty_and_beyond_or_below_is_out_of_range(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    log.append(records(2), term=1)
    assert log.read(2, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 100)
    log.drop_prefix(1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)


def test_segments_roll_by_size_and_are_named_by_base_offset(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for _ in range(40):
        log.append(records(2), term=1)
    bases = log.segment_bases
    assert len(bases) > 3
    names = sorted(p.name for p in (tmp_path / "p0").glob("*.log"))
    assert names == [f"{b:020d}.log" for b in bases]
    for path in (tmp_path / "p0").glob("*.log"):
        assert path.stat().st_size <= 1000
        first = headers(path.read_bytes())[0]
        assert first.base_offset == int(path.stem)


def test_segments_roll_by_age(tmp_path: Path) -> None:
    clock = Clock()
    log = PartitionLog(tmp_path, LogConfig(segment_ms=1000, fsync="never"), clock=clock)
    log.append(records(1), term=1)
    clock.now += 999
    log.append(records(1), term=1)
    assert log.segment_bases == [0]
    clock.now += 1
    log.append(records(1), term=1)
    assert log.segment_bases == [0, 2]


def test_append_many_rolls_an_old_segment_before_its_first_batch(tmp_path: Path) -> None:
    clock = Clock()
    log = PartitionLog(tmp_path, LogConfig(segment_ms=1000, fsync="never"), clock=clock)
    log.append(records(1), term=1)
    clock.now += 1000
    assert log.append_many([(records(1), 1), (records(2), 1)]) == 1
    assert log.segment_bases == [0, 1]
    assert [h.base_offset for h in headers(log.read(1, 1 << 20))] == [1, 2]


def test_large_mutable_batch_is_stamped_in_place_and_on_disk(tmp_path: Path) -> None:
    log = small_log(tmp_path, segment_bytes=1 << 20)
    log.append(records(1), term=1)
    large = bytearray(records(1, tag="L" * WRITE_BUFFER_BYTES))
    assert log.append(large, term=6) == 1
    header = batch.parse_header(large)
    assert (header.base_offset, header.leader_epoch) == (1, 6)
    (stored,) = headers(log.read(1, 1 << 20))
    assert (stored.base_offset, stored.leader_epoch, stored.size) == (1, 6, len(large))


def test_sealed_segments_have_kafka_layout_indexes_pointing_at_batch_starts(
    tmp_path: Path,
) -> None:
    log = small_log(tmp_path)
    for i in range(40):
        log.append(records(2, ts=1000 + i), term=1)
    base = log.segment_bases[0]
    directory = tmp_path / "p0"
    data = (directory / f"{base:020d}.log").read_bytes()
    starts = {pos: h for pos, h in batch.iter_headers(data)}
    offsets = SparseIndex.load(OFFSET_ENTRY, directory / f"{base:020d}.index")
    times = SparseIndex.load(TIME_ENTRY, directory / f"{base:020d}.timeindex")
    assert len(offsets) > 0 and len(times) > 0
    for relative, position in zip(offsets.keys, offsets.values, strict=True):
        assert starts[position].last_offset == base + relative
    assert times.keys == sorted(times.keys)


def test_offset_for_timestamp_finds_the_first_batch_at_or_after(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for i in range(30):
        log.append(records(2, ts=1000 + 10 * i), term=1)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(1000) == 0
    assert log.offset_for_timestamp(1001) == 2
    assert log.offset_for_timestamp(1150) == 30
    assert log.offset_for_timestamp(1290) == 58
    assert log.offset_for_timestamp(1291) is None


def test_offset_for_timestamp_uses_max_timestamp_of_out_of_order_batches(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for ts in (5000, 1000, 2000, 7000, 3000):
        log.append(records(1, ts=ts), term=1)
    assert log.offset_for_timestamp(4000) == 0
    assert log.offset_for_timestamp(6000) == 3


def test_offset_for_timestamp_never_answers_below_the_log_start(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for i in range(10):
        log.append(records(2, ts=1000 + i), term=1)
    log.drop_prefix(5)
    assert log.offset_for_timestamp(0) == 5


def test_truncate_suffix_removes_the_whole_batch_containing_the_offset(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for _ in range(3):
        log.append(records(3), term=1)
    assert log.truncate_suffix(4) == 3
    assert log.next_offset == 3
    assert [h.base_offset for h in headers(log.read(0, 1 << 20))] == [0]
    assert log.append(records(1, tag="new"), term=2) == 3


def test_truncate_suffix_deletes_later_segments_and_survives_reopen(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for _ in range(40):
        log.append(records(2), term=1)
    cut = log.segment_bases[1] + 1
    log.truncate_suffix(cut)
    assert log.segment_bases == log.segment_bases[:2]
    assert log.next_offset == cut - 1
    log.append(records(2, tag="after"), term=2)
    log.close()
    reopened = small_log(tmp_path)
    assert reopened.recovery.clean
    assert reopened.next_offset == cut + 1
    assert headers(reopened.read(cut - 1, 1 << 20))[0].leader_epoch == 2


def test_drop_prefix_deletes_only_whole_segments_below(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for _ in range(40):
        log.append(records(2), term=1)
    bases = log.segment_bases
    target = bases[2] + 3
    assert log.drop_prefix(target) == target
    assert log.log_start_offset == target
    assert log.segment_bases == bases[2:]
    assert not (tmp_path / "p0" / f"{bases[0]:020d}.log").exists()
    assert headers(log.read(target, 100))[0].base_offset <= target


def test_drop_prefix_past_the_end_restarts_the_log_there(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    log.append(records(3), term=1)
    log.drop_prefix(100)
    assert (log.log_start_offset, log.next_offset, log.segment_bases) == (100, 100, [100])
    assert log.append(records(1), term=5) == 100
    log.close()
    reopened = small_log(tmp_path)
    assert (reopened.log_start_offset, reopened.next_offset) == (100, 101)


def test_log_start_offset_survives_reopen(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for _ in range(10):
        log.append(records(2), term=1)
    log.drop_prefix(7)
    log.close()
    assert small_log(tmp_path).log_start_offset == 7


def test_time_retention_deletes_old_sealed_segments_never_the_active_one(tmp_path: Path) -> None:
    log = small_log(tmp_path, retention_ms=10_000)
    for i in range(40):
        log.append(records(2, ts=1000 * i), term=1)
    bases = log.segment_bases
    # Everything is older than retention at this time: only the active segment stays.
    assert log.apply_retention(now_ms=10**9) == bases[-1]
    assert log.segment_bases == [bases[-1]]


def test_time_retention_keeps_segments_with_recent_batches(tmp_path: Path) -> None:
    log = small_log(tmp_path, retention_ms=10_000)
    for i in range(40):
        log.append(records(2, ts=1000 * i), term=1)
    bases = log.segment_bases
    ends = [*bases[1:], log.next_offset]
    newest = {
        b: max(h.max_timestamp for h in headers(log.read(b, 1 << 20, upto=e)))
        for b, e in zip(bases, ends, strict=True)
    }
    expected = next(b for b in bases if newest[b] >= 30_000)
    assert expected > 0
    assert log.apply_retention(now_ms=40_000) == expected
    assert log.segment_bases[0] == expected


def test_size_retention_keeps_the_log_within_the_limit(tmp_path: Path) -> None:
    log = small_log(tmp_path, retention_bytes=2500, retention_ms=-1)
    for _ in range(60):
        log.append(records(2), term=1)
    before = log.size_bytes
    log.apply_retention()
    assert log.size_bytes <= 2500 + 1000  # whole segments only: at most one segment over
    assert log.size_bytes < before
    assert len(log.segment_bases) >= 1


def test_retention_with_nothing_expired_keeps_everything(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    for _ in range(40):
        log.append(records(2, ts=1000), term=1)
    bases = log.segment_bases
    assert log.apply_retention(now_ms=2000) == 0
    assert log.segment_bases == bases


def test_append_many_with_one_bad_batch_writes_none_of_them(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    good = records(2)
    with pytest.raises(batch.CorruptBatchError):
        log.append_many([(good, 1)] * 20 + [(b"garbage" * 10, 1)])
    assert (log.next_offset, log.size_bytes, log.segment_bases) == (0, 0, [0])


def test_segments_left_wholly_below_the_log_start_by_truncation_go_at_the_next_roll(
    tmp_path: Path,
) -> None:
    log = small_log(tmp_path)
    while log.size_bytes + len(records(2)) <= 1000:  # fill the first segment
        log.append(records(2), term=1)
    assert log.segment_bases == [0]
    start = log.next_offset - 2
    log.drop_prefix(start)
    log.truncate_suffix(start)  # segment 0 now ends exactly at the log start
    log.append(records(8), term=2)  # does not fit: rolls
    assert log.segment_bases == [start]
    assert not (tmp_path / "p0" / f"{0:020d}.log").exists()
    assert headers(log.read(start, 1000))[0].leader_epoch == 2
