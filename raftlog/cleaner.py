"""Log compaction: the cleaner that keeps only the latest record per key in sealed segments.

Owns the choice of what is cleanable, the per-key latest-offset map, the rewriting of batches
and the cleaner's first-dirty-offset checkpoint. The file swap itself (and its recovery) is
PartitionLog.replace_segment's: cleaned data goes to `<base>.cleaned`, is fsynced, renamed to
`<base>.swap` (the commit point), the old indexes are removed, and the swap is renamed over
`<base>.log`. Opening a log deletes a leftover `.cleaned` and finishes a leftover `.swap`.

Semantics (Kafka's LogCleaner, cleanup.policy=compact):
- Only sealed segments wholly below `upto` (the caller passes the Raft commit index + 1, i.e.
  the high watermark) whose records are all older than min.compaction.lag.ms are cleaned; the
  active segment never is. A pass runs only when the dirty part (bytes written since the last
  pass's end) is at least min.cleanable.dirty.ratio of the cleanable bytes.
- A keyed record is removed when a later record with the same key lies in the cleanable range;
  the latest record of a key whose value is null (a tombstone) is removed too once its batch's
  max timestamp is older than delete.retention.ms.
- Records without a key are kept (producing them to a compacted topic is refused, but a topic
  switched from delete to compact may hold some). Control batches (transaction markers) are
  kept whole. A transactional data batch that the log's aborted-transaction index
  (raftlog/txnindex.py) shows aborted loses all its records, as in Kafka; any other
  transactional batch is kept whole and supersedes nothing (it may belong to a transaction
  still open, or committed: keeping it can only keep more). Emptied batches keep their
  producer fields and sequence range, so the producer state replayed from a cleaned log is the
  one replayed from the original. Offsets never change, so every segment's transaction index
  stays valid across the swap (PartitionLog.replace_segment carries it over).
- The key map is built from the dirty segments only (those past the checkpoint, which is
  always a segment boundary): the clean ones hold at most one record per key, older than any
  dirty one. It is a dict of every dirty key (Kafka bounds it and cleans in several passes:
  left for later).

Raft: every batch is a Raft entry (storage maps an offset to the term stamped on its batch,
and Raft's log matching, `entries()` and followers' appends need contiguous entries). So the
cleaner never removes a batch: a batch keeps its base offset, lastOffsetDelta, term, producer
fields, attributes and max timestamp; it holds only its kept records at their original offset
deltas (CRC recomputed), and a batch with none left stays as an empty batch (records count 0,
61 bytes, as Kafka leaves for idempotent producers). Entry boundaries and terms are thus the
same on every replica, cleaned or not, and a follower catching up from a cleaned leader receives
the cleaned entries. Cleaning only committed data makes the removal decisions final: nothing
at or above the commit index is read. Dropping empty batches below Raft's trim point (where no
follower needs entries) is left for later.

Invariants: a kept record has the same offset, key, value, headers and timestamp as before;
the latest record per key below the cleaned end is always kept (tombstones: until expired);
offsets and batch boundaries never change; a crash at any step leaves the old or the new file
whole, never both or neither.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from raftline.raftlog.batch import (
    CODEC_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    parse_header,
    write_header,
)
from raftline.raftlog.log import PartitionLog, write_atomically
from raftline.raftlog.records import Record, build_batch_buffer, decode_batch
from raftline.raftlog.segment import Segment, segment_name
from raftline.raftlog.txnindex import AbortedTxn

CHECKPOINT_FILE = "cleaner-offset.checkpoint"
FailPoint = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """Kafka's defaults."""

    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0


@dataclass(slots=True)
class CleanStats:
    """What one pass did; `end` is the offset the cleaned range stops at (0: nothing ran)."""

    end: int = 0
    segments: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0

    @property
    def bytes_freed(self) -> int:
        return self.bytes_read - self.bytes_written


def read_checkpoint(directory: Path) -> int:
    try:
        return int((directory / CHECKPOINT_FILE).read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _iter_batches(segment: Segment) -> Iterator[tuple[BatchHeader, bytes]]:
    """(header, whole batch) of each batch of a sealed segment, one pread per batch."""
    position = 0
    with segment.files.pin(segment.path) as fd:
        while position < segment.size:
            head = os.pread(fd, HEADER_SIZE, position)
            header = parse_header(head)
            data = head + os.pread(fd, header.size - HEADER_SIZE, position + HEADER_SIZE)
            yield header, data
            position += header.size


def _whole(header: BatchHeader) -> bool:
    """A batch the cleaner keeps as it is (and whose records supersede nothing)."""
    return header.is_control or header.is_transactional or header.records_count == 0


def latest_offsets(segments: list[Segment]) -> dict[bytes, int]:
    """key -> offset of its last record in `segments` (data batches only)."""
    latest: dict[bytes, int] = {}
    for segment in segments:
        for header, data in _iter_batches(segment):
            if _whole(header):
                continue
            for record in decode_batch(data).records:
                if record.key is not None:
                    latest[record.key] = record.offset
    return latest


def rewrite_batch(header: BatchHeader, keep: list) -> bytes:
    """The batch holding only `keep` (some of its decoded records), same base offset,
    lastOffsetDelta, term, producer fields and max timestamp; CRC recomputed."""
    if keep:
        out = build_batch_buffer(
            [
                Record(r.value, r.key, r.headers, r.timestamp, r.offset - header.base_offset)
                for r in keep
            ],
            base_offset=header.base_offset,
            codec=header.codec,
            timestamp=keep[0].timestamp,
            log_append_time=header.max_timestamp if header.log_append_time else None,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            transactional=header.is_transactional,
            leader_epoch=header.leader_epoch,
        )
        base_timestamp = parse_header(out).base_timestamp
    else:
        out = bytearray(HEADER_SIZE)
        base_timestamp = header.base_timestamp
    attributes = header.attributes if keep else header.attributes & ~CODEC_MASK
    write_header(
        out,
        header._replace(
            batch_length=len(out) - LOG_OVERHEAD,
            attributes=attributes,
            base_timestamp=base_timestamp,
            records_count=len(keep),
        ),
    )
    return bytes(out)


class Cleaner:
    """Cleans one PartitionLog; called from a background thread, one pass at a time."""

    def __init__(self, log: PartitionLog, config: CleanerConfig | None = None) -> None:
        self.log = log
        self.config = config or CleanerConfig()

    def cleanable(self, upto: int, now_ms: int) -> list[Segment]:
        """The sealed segments a pass may clean: a prefix of the log, each wholly below
        `upto` and older than min.compaction.lag.ms."""
        lag = self.config.min_compaction_lag_ms
        out = []
        for segment in self.log.sealed_segments():
            if segment.next_offset > upto or segment.max_timestamp > now_ms - lag:
                break
            out.append(segment)
        return out

    def dirty_ratio(self, segments: list[Segment]) -> float:
        first_dirty = read_checkpoint(self.log.directory)
        total = sum(s.size for s in segments)
        dirty = sum(s.size for s in segments if s.next_offset > first_dirty)
        return dirty / total if total else 0.0

    def clean(
        self, upto: int, now_ms: int | None = None, fail: FailPoint | None = None
    ) -> CleanStats:
        """One pass: clean what is cleanable below `upto` if dirty enough."""
        now = self.log.clock() if now_ms is None else now_ms
        stats = CleanStats()
        segments = self.cleanable(upto, now)
        if not segments:
            return stats
        first_dirty = read_checkpoint(self.log.directory)
        if segments[-1].next_offset <= first_dirty:
            return stats  # nothing new since the last pass
        if self.dirty_ratio(segments) < self.config.min_cleanable_dirty_ratio:
            return stats
        try:
            latest = latest_offsets([s for s in segments if s.next_offset > first_dirty])
        except FileNotFoundError:
            if all(s in self.log.sealed_segments() for s in segments):
                raise
            return stats  # retention deleted a segment meanwhile: the next pass sees the rest
        horizon = now - self.config.delete_retention_ms
        for segment in segments:
            try:
                self._clean_segment(segment, latest, horizon, stats, fail)
            except FileNotFoundError:
                if segment in self.log.sealed_segments():
                    raise
                # retention deleted it meanwhile: nothing to clean there
        stats.end = segments[-1].next_offset
        write_atomically(self.log.directory / CHECKPOINT_FILE, b"%d\n" % stats.end)
        return stats

    def _clean_segment(
        self,
        segment: Segment,
        latest: dict[bytes, int],
        horizon: int,
        stats: CleanStats,
        fail: FailPoint | None,
    ) -> None:
        """Write the cleaned copy of `segment` to `<base>.cleaned` as it is read (nothing if
        no record goes), fsync it and have the log swap it in."""
        cleaned = segment.directory / segment_name(segment.base_offset, ".cleaned")
        aborted = self.log.aborted_txns(segment.base_offset, segment.next_offset)
        out = _Writer(cleaned)
        removed = 0
        try:
            for header, data in _iter_batches(segment):
                if _is_aborted(header, aborted):
                    removed += header.records_count
                    out.add(rewrite_batch(header, []))
                    continue
                if _whole(header):
                    out.add(data)
                    continue
                records = decode_batch(data).records
                keep = [
                    r
                    for r in records
                    if r.key is None
                    or (
                        latest.get(r.key, r.offset) <= r.offset
                        and not (r.value is None and header.max_timestamp < horizon)
                    )
                ]
                if len(keep) == len(records):
                    out.add(data)
                else:
                    removed += len(records) - len(keep)
                    out.add(rewrite_batch(header, keep))
            if removed:
                out.finish()
        finally:
            out.close()
            if not removed:
                cleaned.unlink(missing_ok=True)
        stats.segments += 1
        stats.bytes_read += segment.size
        if not removed:
            stats.bytes_written += segment.size
            return
        if fail is not None:
            fail("written")
        if self.log.replace_segment(segment, cleaned, fail):
            stats.records_removed += removed
            stats.bytes_written += out.size
        else:
            stats.bytes_written += segment.size


def _is_aborted(header: BatchHeader, aborted: list[AbortedTxn]) -> bool:
    """Whether a transactional data batch with records belongs to an `aborted` transaction."""
    if not header.is_transactional or header.is_control or not header.records_count:
        return False
    offset = header.base_offset
    return any(
        a.producer_id == header.producer_id and a.first_offset <= offset <= a.last_offset
        for a in aborted
    )


class _Writer:
    """Appends batches to a new file in 1 MiB writes; `finish` fsyncs it."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.buffer = bytearray()
        self.size = 0

    def add(self, data: bytes) -> None:
        self.buffer += data
        self.size += len(data)
        if len(self.buffer) >= 1 << 20:
            self._drain()

    def _drain(self) -> None:
        view = memoryview(self.buffer)
        while view:
            view = view[os.write(self.fd, view) :]
        view.release()
        self.buffer = bytearray()

    def finish(self) -> None:
        self._drain()
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
