"""The partition log agrees with an in-memory list of batches under random operation sequences."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftline.raftlog import batch
from raftline.raftlog.log import LogConfig, OffsetOutOfRangeError, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import FileCache

CONFIG = LogConfig(segment_bytes=400, index_interval_bytes=120, fsync="never", retention_ms=-1)


@dataclass
class ModelBatch:
    base: int
    data: bytes  # as stored: stamped with base offset and term

    @property
    def last(self) -> int:
        return batch.parse_header(self.data).last_offset

    @property
    def max_timestamp(self) -> int:
        return batch.parse_header(self.data).max_timestamp


def stamped(data: bytes, base: int, term: int) -> bytes:
    out = bytearray(data)
    batch.stamp(out, base, term)
    return bytes(out)


class LogModel(RuleBasedStateMachine):
    """Model: the batches still visible (last offset >= log start), log start, next offset."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="log-model-"))
        self.files = FileCache(limit=3)  # tiny: handles are evicted and reopened constantly
        self.log = PartitionLog(self.tmp, CONFIG, self.files, clock=lambda: 0)
        self.batches: list[ModelBatch] = []
        self.start = 0
        self.next = 0

    def teardown(self) -> None:
        self.files.close_all()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def containing(self, offset: int) -> int:
        return next(i for i, b in enumerate(self.batches) if b.base <= offset <= b.last)

    @rule(
        sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
        term=st.integers(0, 5),
        ts=st.integers(0, 10_000),
        payload=st.binary(max_size=60),
        follower=st.booleans(),
    )
    def append(self, sizes: list[int], term: int, ts: int, payload: bytes, follower: bool) -> None:
        raw = [
            build_batch([Record(value=payload)] * n, timestamp=ts + i) for i, n in enumerate(sizes)
        ]
        base = self.log.append_many([(r, term) for r in raw], self.next if follower else None)
        assert base == self.next
        for r in raw:
            self.batches.append(ModelBatch(self.next, stamped(r, self.next, term)))
            self.next = self.batches[-1].last + 1

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def truncate_suffix(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.next - 1))
        i = self.containing(offset)
        if self.batches[i].base < self.start:
            try:
                self.log.truncate_suffix(offset)
            except OffsetOutOfRangeError:
                return
            raise AssertionError("truncation into the log-start batch was accepted")
        assert self.log.truncate_suffix(offset) == self.batches[i].base
        self.next = self.batches[i].base
        del self.batches[i:]

    @rule(data=st.data())
    def drop_prefix(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, self.next + 5))
        self.log.drop_prefix(offset)
        if offset <= self.start:
            return
        self.start = offset
        if offset >= self.next:
            self.batches, self.next = [], offset
        else:
            self.batches = [b for b in self.batches if b.last >= offset]

    @rule(max_bytes=st.integers(0, 100_000))
    def retention_by_size(self, max_bytes: int) -> None:
        self.log.config = LogConfig(
            segment_bytes=400, index_interval_bytes=120, fsync="never", retention_bytes=max_bytes
        )
        active = self.log.segment_bases[-1]
        new_start = self.log.apply_retention(now_ms=0)
        assert new_start >= self.start
        assert self.log.segment_bases[-1] == active
        self.log.config = CONFIG
        self.start = new_start
        self.batches = [b for b in self.batches if b.last >= new_start]

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        if clean:
            self.log.close()
        self.log = PartitionLog(self.tmp, CONFIG, self.files, clock=lambda: 0)
        assert self.log.recovery.truncated_bytes == 0
        assert self.log.recovery.rebuilt_indexes == []

    @precondition(lambda self: self.batches)
    @rule(data=st.data(), max_bytes=st.integers(0, 600))
    def read(self, data: st.DataObject, max_bytes: int) -> None:
        """Whole batches from the one holding `offset`: as many as fit in `max_bytes` (at
        least one), within its segment, before the batch holding `upto`."""
        offset = data.draw(st.integers(self.start, self.next - 1))
        upto = data.draw(st.none() | st.integers(self.start, self.next + 1))
        got, following = self.log.read_from(offset, max_bytes, upto)
        i = self.containing(offset)
        segment_end = min((b for b in self.log.segment_bases if b > offset), default=self.next)
        expected, expected_following = b"", offset  # nothing readable before `upto`
        for b in self.batches[i:]:
            too_big = expected and len(expected) + len(b.data) > max_bytes
            if too_big or b.base >= segment_end or (upto is not None and upto <= b.last):
                break
            expected += b.data
            expected_following = b.last + 1
        assert (got, following) == (expected, expected_following)

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def offset_for_timestamp(self, data: st.DataObject) -> None:
        ts = data.draw(st.integers(0, 10_010))
        expected = next(
            (max(b.base, self.start) for b in self.batches if b.max_timestamp >= ts), None
        )
        assert self.log.offset_for_timestamp(ts) == expected

    @invariant()
    def whole_log_reads_back_as_the_model(self) -> None:
        assert (self.log.log_start_offset, self.log.next_offset) == (self.start, self.next)
        got = b""
        offset = self.start
        while offset < self.next:
            chunk, following = self.log.read_from(offset, 1000)
            assert chunk
            got += chunk
            offset = [h for _, h in batch.iter_headers(chunk)][-1].last_offset + 1
            assert following == offset
        assert got == b"".join(b.data for b in self.batches)


LogModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogModel = LogModel.TestCase
