"""The partition log: a directory of Kafka record-batch segments, also its group's Raft log.

Owns offset assignment, reads by offset and time, suffix truncation, prefix drops, rolling,
retention, the swap of segments the cleaner compacted (raftlog/cleaner.py), the fsync policy
with group commit, crash recovery on open (interrupted swaps included), and keeping each
segment's aborted-transaction index (raftlog/txnindex.py) consistent with its segment.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from raftline.raftlog import speedups
from raftline.raftlog.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAX_BATCH_SIZE,
    BatchHeader,
    CorruptBatchError,
    parse_header,
)
from raftline.raftlog.segment import (
    DELETED_SUFFIX,
    MAX_SEGMENT_BYTES,
    Bytes,
    FileCache,
    Segment,
    fsync_dir,
    unlink_later,
)
from raftline.raftlog.txnindex import AbortedTxn, collect

logger = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
LOG_START_FILE = "log-start-offset.checkpoint"
# Written by close(): "<base offset> <size>" of the active segment, all of it fsynced with its
# indexes written. Opening trusts a matching segment instead of CRC-scanning all of it.
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
_DAY_MS = 24 * 3600 * 1000
# The header fields an append needs: batchLength, magic, lastOffsetDelta, maxTimestamp,
# recordsCount. One unpack instead of a full BatchHeader keeps the per-batch cost small.
_APPEND_FIELDS = struct.Struct(">8xi4xb6xi8xq14xi")
_MIN_LENGTH, _MAX_LENGTH = HEADER_SIZE - LOG_OVERHEAD, MAX_BATCH_SIZE - LOG_OVERHEAD  # batchLength


class CorruptLogError(Exception):
    """Damage that recovery must not silently drop: a bad batch inside a sealed segment,
    overlapping or missing segments."""


class OffsetOutOfRangeError(ValueError):
    """An offset below the log start offset or beyond the next offset."""


class LogFailedError(Exception):
    """A write or fsync failed. The kernel may have dropped the dirty pages, so a retried fsync
    could succeed without the data: the log refuses all further writes and syncs until it
    is reopened (recovery then validates what is really on disk)."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Kafka's defaults (LogConfig.java) except fsync, which defaults to every append."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * _DAY_MS
    retention_ms: int = 7 * _DAY_MS  # -1: keep forever
    retention_bytes: int = -1  # -1: no size limit
    index_interval_bytes: int = 4096
    # "interval" buffers small appends between fsyncs (see PartitionLog.append_many).
    fsync: FsyncPolicy = "always"
    flush_interval_ms: int = 100  # "interval": fsync once this old ...
    flush_interval_bytes: int = 256 * 1024  # ... or once this many bytes are unsynced
    # Written bytes further than this behind the log's end leave the page cache once they are
    # on disk (-1: never dropped). A log only grows: kept cached, every write needs fresh
    # pages, and on a VM whose memory is backed on first touch writes slowed 2-3x after the
    # first GBs (bench/README.md, "Sustained runs"). Readers near the end still read memory.
    cache_tail_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.fsync not in ("always", "interval", "never"):
            raise ValueError(f"unknown fsync policy {self.fsync!r}")
        if not 0 < self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be in 1..{MAX_SEGMENT_BYTES}")
        if self.segment_ms <= 0 or self.index_interval_bytes <= 0:
            raise ValueError("segment_ms and index_interval_bytes must be positive")
        if self.cache_tail_bytes < -1:
            raise ValueError("cache_tail_bytes must be -1 (keep all) or at least 0")


@dataclass(slots=True)
class RecoveryReport:
    """What opening the log found and repaired."""

    directory: str
    segments: int = 0
    log_start_offset: int = 0
    next_offset: int = 0
    truncated_bytes: int = 0  # cut from the tail of the last segment
    truncated_reason: str | None = None
    rebuilt_indexes: list[str] = field(default_factory=list)
    removed_segments: list[str] = field(default_factory=list)  # wholly below the log start

    @property
    def clean(self) -> bool:
        return not (self.truncated_bytes or self.rebuilt_indexes or self.removed_segments)


def _py_append_fields(data: Bytes) -> tuple[int, int, int] | None:
    """(batchLength, lastOffsetDelta, maxTimestamp) of a sane batch (the checks of
    batch.parse_header on the fields an append needs), else None: one unpack, no call."""
    try:
        length, magic, last_delta, max_timestamp, count = _APPEND_FIELDS.unpack_from(data)
    except struct.error:  # shorter than a header
        return None
    if (
        magic == MAGIC
        and _MIN_LENGTH <= length <= _MAX_LENGTH
        and last_delta >= 0
        and count >= 0
        and len(data) == length + LOG_OVERHEAD
    ):
        return length, last_delta, max_timestamp
    return None


# Runs for every appended batch: the C twin when the extension is built.
_append_fields = speedups.C.append_fields if speedups.C else _py_append_fields


def _bad_batch(data: Bytes) -> CorruptBatchError:
    """The error for a batch _append_fields refused, naming the problem."""
    header = parse_header(data)  # raises with the reason
    if len(data) != header.size:
        return CorruptBatchError(f"batch of {len(data)} bytes declares {header.size}")
    return CorruptBatchError("invalid batch header")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def write_atomically(path: Path, data: bytes) -> None:
    """Write temp, fsync, rename over `path`, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


_shared_files = FileCache()


def shared_file_cache() -> FileCache:
    """The node-wide handle cache logs use unless given one."""
    return _shared_files


class PartitionLog:
    """An append-only log of record batches stored as Kafka segment files in `directory`.

    Thread-safe: appends, reads and truncations serialize on one lock; fsync runs outside
    it so appends continue while a group commit is in flight.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        files: FileCache | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.directory = Path(directory)
        self.config = config or LogConfig()
        self.files = files if files is not None else shared_file_cache()
        self.clock = clock
        self._lock = threading.Lock()
        self._synced = threading.Condition(self._lock)
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._log_start = 0
        self._durable = 0
        self._syncing = False
        self._truncations = 0  # bumped by truncation: an fsync in flight then proves nothing
        self._unsynced_dirs: list[Path] = []  # new directory entries the next sync covers
        self._failure: OSError | None = None  # a failed fsync: the log is unusable
        self._unsynced_bytes = 0
        self._last_sync_ms = clock()
        # Base offset of the first sealed segment found without its transaction index on open
        # (None: all there): producer state replays the log from its start to rebuild them.
        self.txn_index_gap: int | None = None
        # Called after each roll (on the appending thread, lock held: cheap, and never back into
        # this log): a sealed segment more is when retention may drop one.
        self.on_roll: Callable[[], None] | None = None
        self.recovery = self._open()
        level = logging.DEBUG if self.recovery.clean else logging.WARNING
        logger.log(level, "opened %s: %s", self.directory, self.recovery)

    # --- state -----------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def next_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def durable_offset(self) -> int:
        """Every offset below this one has been fsynced."""
        return self._durable

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_bases(self) -> list[int]:
        return list(self._bases)

    def sealed_segments(self) -> list[Segment]:
        """The segments before the active one (read-only files: the cleaner reads them)."""
        with self._lock:
            return self._segments[:-1]

    # --- appending ---------------------------------------------------------------------------

    def append(
        self, batch: Bytes, term: int, base_offset: int | None = None, *, sync: bool = True
    ) -> int:
        """Append one record batch, stamping offsets and the Raft term; return its base offset.

        `base_offset` (a follower copying the leader) must equal the next offset. The fsync
        policy applies as in `append_many`, whose one-batch case this is, in one call: it
        runs once per produced batch.
        """
        fields = _append_fields(batch)
        if fields is None:
            raise _bad_batch(batch)
        length, last_delta, max_timestamp = fields
        config = self.config
        with self._lock:
            if self._failure is not None or base_offset is not None:
                self._check_appendable(base_offset)
            active = self._segments[-1]
            first = active.next_offset
            now = self.clock()
            max_bytes, max_age_ms = config.segment_bytes, config.segment_ms
            try:
                if not active.append(
                    batch, term, length, last_delta, max_timestamp, now, max_bytes, max_age_ms
                ):
                    self._roll().append(
                        batch, term, length, last_delta, max_timestamp, now, max_bytes, max_age_ms
                    )
            except OSError as exc:
                raise self._write_failed(exc) from exc
            self._unsynced_bytes += length + LOG_OVERHEAD
            must_sync = sync and self._apply_policy(now)
        if must_sync:
            self.sync()
        return first

    def append_many(
        self,
        batches: Sequence[tuple[Bytes, int]],
        base_offset: int | None = None,
        *,
        sync: bool = True,
    ) -> int:
        """Append (batch, term) pairs back to back and return the first batch's base offset.

        With `sync` (the default) the fsync policy is applied once for the call: "always"
        fsyncs before returning; "never" writes the batches to the file, so a killed process
        keeps them; "interval" fsyncs when due and until then may leave small batches in the
        active segment's write buffer (reads see them; being unsynced, a crash of the
        process may lose them just as one of the machine may). Without `sync` nothing is
        written or synced beyond the buffer's own 64 KB: the caller ends its round with
        `flush` or `sync`, so a round of appends costs one write and one fsync.
        """
        if not batches:
            raise ValueError("nothing to append")
        fields = [_append_fields(data) for data, _ in batches]  # all valid, or none written
        if None in fields:
            raise _bad_batch(batches[fields.index(None)][0])
        config = self.config
        with self._lock:
            if self._failure is not None or base_offset is not None:
                self._check_appendable(base_offset)
            active = self._segments[-1]
            first = active.next_offset
            now = self.clock()
            max_bytes, max_age_ms = config.segment_bytes, config.segment_ms
            total = 0
            try:
                for (data, term), (length, last_delta, max_timestamp) in zip(
                    batches, fields, strict=True
                ):
                    if not active.append(
                        data, term, length, last_delta, max_timestamp, now, max_bytes, max_age_ms
                    ):
                        active = self._roll()
                        active.append(
                            data,
                            term,
                            length,
                            last_delta,
                            max_timestamp,
                            now,
                            max_bytes,
                            max_age_ms,
                        )
                    total += length + LOG_OVERHEAD
            except OSError as exc:
                raise self._write_failed(exc) from exc
            self._unsynced_bytes += total
            must_sync = sync and self._apply_policy(now)
        if must_sync:
            self.sync()
        return first

    def _check_appendable(self, base_offset: int | None) -> None:
        """Raise if the log failed or `base_offset` is not the next offset (lock held)."""
        self._check_not_failed()
        if base_offset is not None and base_offset != self.next_offset:
            raise ValueError(
                f"append at offset {base_offset}, but the next offset is {self.next_offset}"
            )

    def _write_failed(self, exc: OSError) -> LogFailedError:
        """Fail the log after a write that may have left the active segment half updated."""
        self._failure = exc
        return LogFailedError(f"write to {self._segments[-1].path} failed: {exc}")

    def _apply_policy(self, now: int) -> bool:
        """After an append with `sync` (lock held): write the buffer under "never"; True if
        the policy wants an fsync now ("interval": enough bytes unsynced or the interval
        elapsed; only reads, so `maybe_sync` asks it without the lock)."""
        config = self.config
        policy = config.fsync
        if policy == "interval":
            return (
                self._unsynced_bytes >= config.flush_interval_bytes
                or now - self._last_sync_ms >= config.flush_interval_ms
            )
        if policy == "always":
            return True
        self._flush_active()
        return False

    def _roll(self) -> Segment:
        """Seal the active segment (indexes written, data fsynced) and start a new one."""
        old = self._segments[-1]
        old.write_indexes()
        old.txns.ensure_file()  # a sealed segment always has one: a missing one is lost
        old.sync()
        segment = Segment.create(
            self.directory,
            old.next_offset,
            self.files,
            self.config.index_interval_bytes,
            self.clock(),
        )
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        # A truncation back to the log start can leave sealed segments holding nothing readable.
        while len(self._segments) > 1 and self._segments[0].next_offset <= self._log_start:
            self._segments.pop(0).delete()
            self._bases.pop(0)
        fsync_dir(self.directory)
        if self.on_roll is not None:
            self.on_roll()
        return segment

    def roll_if_older(self, now_ms: int | None = None) -> bool:
        """Seal the active segment once its first batch is segment.ms old, without waiting for
        an append to do it (tiered storage uploads sealed segments only: this bounds how long
        the last records of an idle partition wait). True if it rolled."""
        now = self.clock() if now_ms is None else now_ms
        with self._lock:
            active = self._segments[-1]
            if self._failure is not None or active.size == 0:
                return False
            if now - active.created_ms < self.config.segment_ms:
                return False
            try:
                self._roll()
            except OSError as exc:
                raise self._write_failed(exc) from exc
        return True

    # --- durability --------------------------------------------------------------------------

    def sync(self) -> int:
        """Fsync everything appended so far (group commit) and return the durable offset.

        A caller arriving while another thread's fsync runs waits for it, then one thread
        issues a single fsync covering every caller that arrived meanwhile.
        """
        with self._lock:
            target = self.next_offset
            truncations = self._truncations
            while self._durable < target and truncations == self._truncations:
                self._check_not_failed()
                if self._syncing:
                    self._synced.wait()
                    continue
                covered, segment, before = self.next_offset, self._segments[-1], self._truncations
                self._flush_active()  # under the lock: appends grow the buffer being written
                synced_end = segment.size
                self._syncing = True
                dirs, self._unsynced_dirs = self._unsynced_dirs, []
                self._unsynced_bytes = 0
                self._lock.release()
                try:
                    segment.sync_flushed()
                    for directory in dirs:
                        fsync_dir(directory)
                except OSError as exc:
                    self._failure = exc
                    raise LogFailedError(f"fsync of {segment.path} failed: {exc}") from exc
                finally:
                    self._lock.acquire()
                    self._syncing = False
                    self._synced.notify_all()
                if before == self._truncations:
                    self._durable = max(self._durable, covered)
                    self._last_sync_ms = self.clock()
                    self._drop_cached(segment, synced_end)
            return self._durable

    def _drop_cached(self, segment: Segment, on_disk_end: int, settle: bool = False) -> None:
        """Drop cached pages more than cache_tail_bytes behind `on_disk_end` of the active
        segment `segment` (lock held), the sealed segment before it as a whole once the tail
        lies in `segment` alone. `settle`: `segment` is not fsynced up to there (see
        Segment.drop_cached); a sealed segment was fsynced when it was sealed."""
        tail = self.config.cache_tail_bytes
        if tail < 0:
            return
        segment.drop_cached(on_disk_end - tail, settle=settle)
        if on_disk_end >= tail and len(self._segments) > 1 and segment is self._segments[-1]:
            sealed = self._segments[-2]
            sealed.drop_cached(sealed.size, step=0)

    def flush(self) -> None:
        """Write buffered batches to the file without an fsync: a killed process keeps them."""
        with self._lock:
            self._check_not_failed()
            self._flush_active()

    def _flush_active(self) -> None:
        """Write the active segment's buffer (lock held). A failed write leaves appended
        batches that may never reach the file: like a failed fsync, it fails the log."""
        active = self._segments[-1]
        try:
            active.flush()
        except OSError as exc:
            self._failure = exc
            raise LogFailedError(f"write to {active.path} failed: {exc}") from exc
        if self.config.fsync == "never":
            active.start_writeback()
            # Writeback of what lies a tail behind started long ago: most of it is clean.
            self._drop_cached(active, active.size, settle=True)

    def _check_not_failed(self) -> None:
        if self._failure is not None:
            raise LogFailedError(f"{self.directory}: an earlier fsync failed: {self._failure}")

    def maybe_sync(self) -> None:
        """Fsync if the "interval" policy says it is due; the owner calls this periodically."""
        due = self.config.fsync == "interval" and self._durable < self.next_offset
        if due and self._apply_policy(self.clock()):
            self.sync()

    # --- reading -----------------------------------------------------------------------------

    def _segment_index(self, offset: int) -> int:
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    def _check_range(self, offset: int) -> None:
        if not self._log_start <= offset <= self.next_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} outside [{self._log_start}, {self.next_offset}]"
            )

    def read(self, offset: int, max_bytes: int, upto: int | None = None) -> bytes:
        """Raw bytes of whole batches starting with the one containing `offset`.

        Stops before `max_bytes` would be exceeded but returns at least one whole batch;
        stops before the batch containing `upto` (e.g. the high watermark). Reads one
        segment per call; empty at the end of the log.
        """
        return self.read_from(offset, max_bytes, upto)[0]

    def read_from(self, offset: int, max_bytes: int, upto: int | None = None) -> tuple[bytes, int]:
        """Like `read`, also returning the offset right after the bytes (where to go on;
        `offset` itself when there are none)."""
        with self._lock:
            self._check_range(offset)
            for segment in self._segments[self._segment_index(offset) :]:
                if offset < segment.next_offset:
                    return segment.read_batches(offset, max_bytes, upto)
            return b"", offset

    def header_at(self, offset: int) -> BatchHeader:
        """Header of the batch containing `offset`."""
        with self._lock:
            self._check_range(offset)
            if offset < self.next_offset:
                segment = self._segments[self._segment_index(offset)]
                _, header = segment.locate(offset)
                if header is not None:
                    return header
            raise OffsetOutOfRangeError(f"no batch contains offset {offset}")

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Base offset of the first batch whose max timestamp is >= `timestamp`
        (never below the log start), or None if there is none."""
        with self._lock:
            for segment in self._segments:
                if segment.max_timestamp < timestamp or segment.next_offset <= self._log_start:
                    continue
                found = segment.first_at_or_after(timestamp, self._log_start)
                if found is not None:
                    return found
            return None

    # --- truncation and trimming ---------------------------------------------------------------

    def truncate_suffix(self, offset: int) -> int:
        """Remove every batch at or after the one containing `offset` (a Raft conflict).

        Returns the new next offset (the removed batch's base offset).
        """
        with self._lock:
            if offset >= self.next_offset:
                return self.next_offset
            if offset < self._log_start:
                raise OffsetOutOfRangeError(f"cannot truncate below log start {self._log_start}")
            keep = self._segment_index(offset)
            doomed = self._segments[keep + 1 :]
            segment = self._segments[keep]
            position, header = segment.locate(offset)
            if header is not None and header.base_offset < self._log_start:
                raise OffsetOutOfRangeError(
                    f"offset {offset} lies in the batch holding the log start {self._log_start}"
                )
            del self._segments[keep + 1 :], self._bases[keep + 1 :]
            for old in doomed:
                old.delete()
            if doomed:
                segment.remove_index_files()  # it is the active segment again
                fsync_dir(self.directory)  # truncated batches must not come back after a crash
            segment.truncate(position)
            segment.txns.truncate_from(segment.next_offset)
            self._truncations += 1
            self._durable = min(self._durable, segment.next_offset)
            self._synced.notify_all()
            return segment.next_offset

    def drop_prefix(self, offset: int) -> int:
        """Move the log start up to `offset`, deleting segments wholly below it.

        At or past the end, the log restarts empty at `offset` (e.g. a snapshot installed
        on a lagging follower). Returns the new log start offset.
        """
        with self._lock:
            if offset <= self._log_start:
                return self._log_start
            write_atomically(self.directory / LOG_START_FILE, b"%d\n" % offset)
            self._log_start = offset
            if offset >= self.next_offset:
                doomed = self._segments
                if doomed[-1].base_offset == offset:  # empty active segment already there
                    fresh = doomed.pop()
                else:
                    fresh = Segment.create(
                        self.directory,
                        offset,
                        self.files,
                        self.config.index_interval_bytes,
                        self.clock(),
                    )
                self._segments, self._bases = [fresh], [offset]
                self._truncations += 1
                self._durable = offset
                self._synced.notify_all()
            else:
                keep = self._segment_index(offset)
                doomed = self._segments[:keep]
                del self._segments[:keep], self._bases[:keep]
            retired = [path for old in doomed for path in old.retire()]
            fsync_dir(self.directory)
        # Unlinking gigabytes blocked appends (and the node's disk round) for up to ~1 s.
        unlink_later(retired)
        return offset

    def retention_point(self, now_ms: int | None = None) -> int:
        """The log start offset retention would leave: sealed segments older than
        retention_ms or beyond retention_bytes go, oldest first; never the active one."""
        now = self.clock() if now_ms is None else now_ms
        cfg = self.config
        with self._lock:
            point = self._log_start
            excess = self.size_bytes - cfg.retention_bytes if cfg.retention_bytes >= 0 else -1
            for segment in self._segments[:-1]:
                expired = cfg.retention_ms >= 0 and segment.max_timestamp < now - cfg.retention_ms
                oversize = excess >= segment.size
                if not (expired or oversize):
                    break
                excess -= segment.size
                point = max(point, segment.next_offset)
            return point

    def replace_segment(
        self, segment: Segment, cleaned: Path, fail: Callable[[str], None] | None = None
    ) -> bool:
        """Swap a sealed segment's file for `cleaned` (the same batches at the same offsets,
        fsynced), False and `cleaned` deleted if the segment is no longer a sealed one of
        this log. The new file is CRC-checked and indexed in memory before the lock is
        taken; under it, the rename protocol (`_finish_swaps` completes it after a crash):
        `<base>.cleaned` is renamed `<base>.swap` (from here on the new file wins), the old
        indexes are unlinked, the swap is renamed over `<base>.log`, the new indexes are
        written. `fail(step)` after each step lets tests crash there."""
        fresh = Segment(
            self.directory,
            segment.base_offset,
            self.files,
            self.config.index_interval_bytes,
            segment.created_ms,
        )
        try:
            fresh.index_file(cleaned)
        except CorruptBatchError as exc:
            cleaned.unlink(missing_ok=True)
            raise CorruptLogError(f"cleaned copy of {segment.path.name}: {exc}") from exc
        if fresh.next_offset != segment.next_offset:
            cleaned.unlink(missing_ok=True)
            raise CorruptLogError(f"cleaned copy of {segment.path.name} changed its offsets")
        with self._lock:
            if segment not in self._segments[:-1]:
                cleaned.unlink(missing_ok=True)
                return False
            swap = cleaned.with_suffix(".swap")
            os.replace(cleaned, swap)
            fsync_dir(self.directory)
            if fail is not None:
                fail("swapped")
            segment.remove_index_files()
            if fail is not None:
                fail("indexes_removed")
            self.files.forget(segment.path)
            os.replace(swap, segment.path)
            fsync_dir(self.directory)
            if fail is not None:
                fail("renamed")
            fresh.write_indexes()  # not fsynced: a damaged or missing index is rebuilt on open
            fresh.txns = segment.txns  # offsets are unchanged: so are the aborted transactions
            self._segments[self._segments.index(segment)] = fresh
            return True

    def _finish_swaps(self, names: list[str]) -> None:
        """Recovery of an interrupted clean: a `.cleaned` file may be partial (delete it); a
        `.swap` file is whole and fsynced (rename it over its segment, whose indexes are
        stale), unless that segment was deleted meanwhile. `names`: the directory's files."""
        changed = False
        for name in names:
            if name.endswith(".cleaned"):
                (self.directory / name).unlink()
                changed = True
        for name in names:
            if not name.endswith(".swap"):
                continue
            path = self.directory / name
            target = path.with_suffix(".log")
            if target.exists():
                target.with_suffix(".index").unlink(missing_ok=True)
                target.with_suffix(".timeindex").unlink(missing_ok=True)
                os.replace(path, target)
                logger.warning("finished the interrupted swap of %s", target.name)
            else:
                path.unlink()
            changed = True
        if changed:
            fsync_dir(self.directory)

    # --- aborted transactions ------------------------------------------------------------------

    def record_aborted(self, txn: AbortedTxn) -> bool:
        """Add an aborted transaction to the index of the segment holding its marker (which
        must be in the log); False if that index already has it (a replay). Written at once
        and fsynced by `sync_txn_indexes`: the owner of producer state calls that before it
        snapshots, and replays (re-recording) what follows its snapshot after a crash."""
        with self._lock:
            if not self._log_start <= txn.last_offset < self.next_offset:
                raise OffsetOutOfRangeError(
                    f"abort marker at {txn.last_offset} outside the log "
                    f"[{self._log_start}, {self.next_offset})"
                )
            segment = self._segments[self._segment_index(txn.last_offset)]
            return segment.txns.append(txn)

    def aborted_txns(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with data in [start, end), by first offset: what a
        read_committed fetch of that range drops (raftlog/txnindex.py)."""
        with self._lock:
            first = self._segment_index(max(start, self._log_start))
            return collect([s.txns for s in self._segments[first:]], start, end)

    def sync_txn_indexes(self) -> None:
        """Fsync every transaction index appended to since the last call (and the directory
        for files created or replaced)."""
        with self._lock:
            dirty = [s.txns for s in self._segments if s.txns.dirty]
            for index in dirty:
                index.sync()
        if dirty:
            fsync_dir(self.directory)

    def txn_indexes_rebuilt(self) -> None:
        """Producer state replayed the log past the gap found on open: every sealed segment
        now has its index (an empty file where no marker was found)."""
        with self._lock:
            for segment in self._segments[:-1]:
                segment.txns.ensure_file()
            self.txn_index_gap = None

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete what retention allows; returns the new log start offset."""
        return self.drop_prefix(self.retention_point(now_ms))

    def close(self) -> None:
        """Shut down cleanly: fsync (whatever the policy), write the active segment's
        indexes, leave the clean-shutdown marker and release file handles."""
        self.sync()
        with self._lock:
            segments = list(self._segments)
            active = segments[-1]
            active.write_indexes()
            marker = b"%d %d\n" % (active.base_offset, active.size)
            write_atomically(self.directory / CLEAN_SHUTDOWN_FILE, marker)
        for segment in segments:
            self.files.forget(segment.path)

    # --- recovery ----------------------------------------------------------------------------

    def _take_clean_shutdown_marker(self) -> tuple[int, int] | None:
        """Read and remove the marker close() left: (active segment base, size)."""
        marker = self.directory / CLEAN_SHUTDOWN_FILE
        try:
            text = marker.read_text()
        except FileNotFoundError:
            return None
        marker.unlink()
        # The removal must be durable before anything appended from now on: the next sync.
        self._unsynced_dirs.append(self.directory)
        try:
            base, size = (int(field) for field in text.split())
        except ValueError:
            return None
        return base, size

    @staticmethod
    def _load_clean(segment: Segment, report: RecoveryReport) -> bool:
        """Load the active segment of a cleanly closed log like a sealed one; False if its
        data turns out damaged (then it is recovered like after a crash)."""
        try:
            if segment.load_sealed():
                report.rebuilt_indexes.append(segment.index_path.name)
            segment.check_last_batch()
        except CorruptBatchError:
            return False
        return True

    def _open(self) -> RecoveryReport:
        if not self.directory.exists():
            self.directory.mkdir(parents=True)
            self._unsynced_dirs.append(self.directory.parent)
        report = RecoveryReport(directory=str(self.directory))
        # One listing for every file kind below: three globs were a third of a reopen's CPU,
        # and a node reopens tens of thousands of logs at start.
        names = os.listdir(self.directory)
        if LOG_START_FILE in names:
            self._log_start = int((self.directory / LOG_START_FILE).read_text().strip() or 0)
        clean = self._take_clean_shutdown_marker() if CLEAN_SHUTDOWN_FILE in names else None
        self._finish_swaps(names)
        for name in names:
            if name.endswith(DELETED_SUFFIX):
                # a prefix drop's files a crash kept from the background unlink
                (self.directory / name).unlink(missing_ok=True)
        bases = sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())
        # A crash during a prefix drop can leave segments wholly below the log start.
        while len(bases) > 1 and bases[1] <= self._log_start:
            stale = Segment(self.directory, bases.pop(0), self.files, 1, 0)
            stale.delete()
            report.removed_segments.append(stale.path.name)
        interval = self.config.index_interval_bytes
        now = self.clock()
        for i, base in enumerate(bases):
            segment = Segment(self.directory, base, self.files, interval, now)
            if i < len(bases) - 1:
                try:
                    if segment.load_sealed():
                        report.rebuilt_indexes.append(segment.index_path.name)
                except CorruptBatchError as exc:
                    raise CorruptLogError(f"{segment.path}: {exc}") from exc
            elif clean != (base, segment.path.stat().st_size) or not self._load_clean(
                segment, report
            ):
                clean = None
                cut, reason = segment.recover_tail()
                report.truncated_bytes, report.truncated_reason = cut, reason
                if cut:
                    logger.warning("cut %d bytes from %s: %s", cut, segment.path, reason)
            if not segment.txns.load() and i < len(bases) - 1 and self.txn_index_gap is None:
                self.txn_index_gap = base
            if self._segments and self._segments[-1].next_offset != base:
                raise CorruptLogError(
                    f"{segment.path.name} starts at {base}, but the previous segment ends at "
                    f"{self._segments[-1].next_offset}"
                )
            first_timestamp = segment.first_timestamp()
            if first_timestamp is not None and first_timestamp >= 0:
                segment.created_ms = first_timestamp
            self._segments.append(segment)
            self._bases.append(base)
        if not self._segments or self._segments[-1].next_offset < self._log_start:
            for old in self._segments:
                old.delete()
                report.removed_segments.append(old.path.name)
            fresh = Segment.create(self.directory, self._log_start, self.files, interval, now)
            self._segments, self._bases = [fresh], [self._log_start]
            # Made durable by the first sync: until data is synced nothing depends on it.
            self._unsynced_dirs.append(self.directory)
        self._log_start = max(self._log_start, self._bases[0])
        if self._segments[-1].size and clean is None:
            self._segments[-1].sync()  # whatever survived the crash is durable from here on
        self._durable = self.next_offset
        report.segments = len(self._segments)
        report.log_start_offset = self._log_start
        report.next_offset = self.next_offset
        return report
