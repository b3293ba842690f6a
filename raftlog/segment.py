"""One segment of a partition log: a `.log` file of Kafka record batches and its sparse indexes.

Owns positional I/O on segment files, the write buffer of appended batches, index upkeep, tail
scans and the node-wide LRU of handles.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from raftline.raftlog import speedups
from raftline.raftlog.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptBatchError,
    check_crc,
    parse_header,
)
from raftline.raftlog.index import (
    OFFSET_ENTRY,
    TIME_ENTRY,
    IndexDamagedError,
    SparseIndex,
    offset_index,
    time_index,
)
from raftline.raftlog.txnindex import SUFFIX as TXN_INDEX_SUFFIX
from raftline.raftlog.txnindex import TxnIndex

Bytes = bytes | bytearray | memoryview

NO_TIMESTAMP = -1
MAX_SEGMENT_BYTES = (1 << 31) - 1  # index positions are int32
MAX_RELATIVE_OFFSET = (1 << 31) - 1  # index relative offsets are int32
_SCAN_CHUNK = 1 << 20
_IOV_MAX = 1024
# Batches smaller than this are buffered per active segment and written together once this
# many bytes are pending, or before a read, sync, truncation or roll: one write syscall per
# 64 KB of small batches. Buffered batches are unsynced, so a crash may lose them.
WRITE_BUFFER_BYTES = 64 * 1024
# Under fsync "never", the kernel is asked to start writing each this many bytes written, so
# that sealing a segment at a roll (an fsync) finds little dirty data: without it a 1 GiB
# segment sealed in ~0.5 s while every append waited behind the log's lock. Small steps keep
# writeback smooth: at 8 MiB, logs filled at the same pace reached their step together and the
# burst stalled appends (RF 3, 16 partitions, 70k msg/s: end-to-end p99 37 ms, 13 ms at 64 KiB).
WRITEBACK_STEP_BYTES = 64 * 1024
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages, do not wait for it
# Wait for writeback under way in the range, start it for dirty pages, wait for that too.
_SYNC_FILE_RANGE_SETTLE = 1 | 2 | 4
# Cached pages of a segment are dropped in steps of at least this many bytes (one fadvise).
DROP_STEP_BYTES = 8 << 20
_PAGE_BYTES = 4096
_fadvise = getattr(os, "posix_fadvise", None)


def _load_sync_file_range() -> ctypes._CFuncPtr | None:
    """libc's sync_file_range (Linux); None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()
# baseOffset, batchLength, partitionLeaderEpoch: the 16 bytes stamped on a batch.
_STAMPED_PREFIX = struct.Struct(">qii")
_stamp = _STAMPED_PREFIX.pack_into


def _py_buffer_batch(pending: bytearray, data: Bytes, offset: int, length: int, term: int) -> None:
    """Copy a batch into the write buffer and stamp it there (the CRC does not cover the
    stamped prefix)."""
    at = len(pending)
    pending += data
    _stamp(pending, at, offset, length, term)


# Runs for every buffered batch: the C twin when the extension is built.
_buffer_batch = speedups.C.buffer_batch if speedups.C else _py_buffer_batch


# Retired segment files (Segment.retire) carry this suffix until a background thread unlinks
# them; recovery removes any a crash left.
DELETED_SUFFIX = ".deleted"
_unlinker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftline-unlink")


def unlink_later(paths: Sequence[Path]) -> Future[None]:
    """Unlink retired files on a background thread, off the log's lock and the disk round."""
    return _unlinker.submit(_unlink_all, list(paths))


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError:  # recovery removes what is left
            logging.getLogger(__name__).warning("could not remove %s", path, exc_info=True)


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def fsync_dir(path: Path) -> None:
    """Make creations, renames and unlinks inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Handle:
    __slots__ = ("closed", "fd", "pins")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pins = 0
        self.closed = False  # evicted or forgotten: close once the last pin is released


class FileCache:
    """An LRU of open segment file descriptors shared by every log on a node.

    At most `limit` descriptors stay open; a descriptor in use (pinned) by another thread
    when evicted is closed as soon as that thread releases it, so the bound can be exceeded
    only by the number of concurrent users.
    """

    def __init__(self, limit: int = 1024) -> None:
        if limit < 1:
            raise ValueError(f"file handle limit must be >= 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._handles: OrderedDict[Path, _Handle] = OrderedDict()

    def __len__(self) -> int:
        return len(self._handles)

    def acquire(self, path: Path) -> _Handle:
        """An open read/write descriptor for `path`, pinned open until `release`."""
        with self._lock:
            handle = self._handles.get(path)
            if handle is None:
                handle = _Handle(os.open(path, os.O_RDWR | os.O_CLOEXEC))
                self._handles[path] = handle
                self._evict_over_limit()
            else:
                self._handles.move_to_end(path)
            handle.pins += 1
        return handle

    def release(self, handle: _Handle) -> None:
        with self._lock:
            handle.pins -= 1
            if handle.closed and handle.pins == 0:
                os.close(handle.fd)

    @contextmanager
    def pin(self, path: Path) -> Iterator[int]:
        """Yield an open descriptor for `path` for the duration of the block."""
        handle = self.acquire(path)
        try:
            yield handle.fd
        finally:
            self.release(handle)

    def forget(self, path: Path) -> None:
        """Close the descriptor of a file about to be deleted, renamed or replaced."""
        with self._lock:
            handle = self._handles.pop(path, None)
            if handle is not None:
                self._retire(handle)

    def close_all(self) -> None:
        with self._lock:
            for handle in self._handles.values():
                self._retire(handle)
            self._handles.clear()

    def _evict_over_limit(self) -> None:
        while len(self._handles) > self.limit:
            _, handle = self._handles.popitem(last=False)
            self._retire(handle)

    @staticmethod
    def _retire(handle: _Handle) -> None:
        handle.closed = True
        if handle.pins == 0:
            os.close(handle.fd)


def _pwrite_all(fd: int, buffers: Sequence[Bytes], position: int, total: int) -> None:
    """Write `buffers` (`total` bytes) at `position`, in IOV_MAX pieces, retrying short writes."""
    if len(buffers) <= _IOV_MAX and os.pwritev(fd, buffers, position) == total:
        return
    data = b"".join(buffers)  # rare: very many buffers, or a short write
    written = 0
    while written < total:
        written += os.pwrite(fd, memoryview(data)[written:], position + written)


class Segment:
    """A `.log` file starting at `base_offset` and its in-memory `.index` / `.timeindex`.

    Index entries follow Kafka: an offset-index entry maps a batch's last offset (relative)
    to the batch's start position; a time-index entry records the largest timestamp seen so
    far with the last offset at that point. Both are added once `index_interval` bytes were
    written since the previous entry.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        files: FileCache,
        index_interval: int,
        created_ms: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.files = files
        self.index_interval = index_interval
        self.created_ms = created_ms
        self.path = directory / segment_name(base_offset, ".log")
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offsets = offset_index()
        self.times = time_index()
        # Aborted transactions whose markers lie here (raftlog/txnindex.py); loaded by the log.
        self.txns = TxnIndex(directory / segment_name(base_offset, TXN_INDEX_SUFFIX))
        self._bytes_since_index = 0
        # Appended batches not yet written to the file; they start at file position _flushed.
        self._pending = bytearray()
        self._flushed = 0
        self._writeback_from = 0  # file position up to which writeback was started
        self._dropped_to = 0  # file position below which cached pages were dropped
        # (offset, position) where the last read stopped: a batch boundary, where a
        # sequential reader asks next. Reset by truncation.
        self._read_stop = (-1, 0)

    @property
    def index_path(self) -> Path:
        return self.directory / segment_name(self.base_offset, ".index")

    @property
    def timeindex_path(self) -> Path:
        return self.directory / segment_name(self.base_offset, ".timeindex")

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, files: FileCache, index_interval: int, now_ms: int
    ) -> Segment:
        segment = cls(directory, base_offset, files, index_interval, now_ms)
        fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        os.close(fd)
        return segment

    # --- writing -------------------------------------------------------------------------

    def append(
        self,
        data: Bytes,
        term: int,
        length: int,
        last_delta: int,
        max_timestamp: int,
        now_ms: int,
        max_bytes: int,
        max_age_ms: int,
    ) -> bool:
        """Append one checked batch (its batchLength, lastOffsetDelta and maxTimestamp given),
        stamping its offset and term and indexing it; False, appending nothing, if the
        segment is due to roll: the batch would take it past `max_bytes` or the relative
        offset range, or its first batch is `max_age_ms` old. An empty segment takes any
        batch and ages from it.

        A small batch is copied into the write buffer and stamped there with one pack; a batch
        of at least WRITE_BUFFER_BYTES goes to the file at once behind the buffer, its payload
        never copied. This runs for every appended batch: only C calls on the common path.
        """
        size = length + LOG_OVERHEAD
        position = self.size
        offset = self.next_offset
        last_offset = offset + last_delta
        if not position:
            self.created_ms = now_ms
        elif (
            position + size > max_bytes
            or now_ms - self.created_ms >= max_age_ms
            or last_offset - self.base_offset > MAX_RELATIVE_OFFSET
        ):
            return False
        if size < WRITE_BUFFER_BYTES:
            _buffer_batch(self._pending, data, offset, length, term)
        else:
            prefix = _STAMPED_PREFIX.pack(offset, length, term)
            self._write_out([self._pending, prefix, memoryview(data)[len(prefix) :]], size)
        if isinstance(data, bytearray):  # the caller's mutable batch shows its stamp too
            _stamp(data, 0, offset, length, term)
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        if self._bytes_since_index >= self.index_interval:
            self._add_index_entry(position, last_offset, self.max_timestamp)
            self._bytes_since_index = size
        else:
            self._bytes_since_index += size
        self.size = position + size
        self.next_offset = last_offset + 1
        if len(self._pending) >= WRITE_BUFFER_BYTES:
            self.flush()
        return True

    def flush(self) -> None:
        """Write the buffered batches to the file (page cache); a no-op when none are."""
        if self._pending:
            self._write_out([self._pending], 0)

    def _write_out(self, buffers: list[Bytes], extra: int) -> None:
        """Write `buffers` (the pending buffer first, then `extra` more bytes) at the flushed
        end and empty the buffer. On failure the file is cut back and the buffer kept."""
        start = self._flushed
        total = len(self._pending) + extra
        handle = self.files.acquire(self.path)
        try:
            _pwrite_all(handle.fd, buffers, start, total)
        except OSError:
            os.ftruncate(handle.fd, start)  # never leave half a batch behind a failed write
            raise
        finally:
            self.files.release(handle)
        self._flushed = start + total
        self._pending = bytearray()

    def _index(self, position: int, last_offset: int, max_timestamp: int, size: int) -> None:
        """Account a recovered batch in the indexes (`append` does this inline)."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        if self._bytes_since_index >= self.index_interval:
            self._add_index_entry(position, last_offset, self.max_timestamp)
            self._bytes_since_index = 0
        self._bytes_since_index += size

    def _add_index_entry(self, position: int, last_offset: int, max_timestamp: int) -> None:
        """Index the batch at `position` (once per index interval of bytes); `max_timestamp`
        is the segment's largest so far."""
        relative = last_offset - self.base_offset
        self.offsets.append(relative, position)
        last_time = self.times.last()
        if last_time is None or max_timestamp > last_time[0]:
            self.times.append(max_timestamp, relative)

    def truncate(self, position: int) -> None:
        """Cut the file at `position`, a batch boundary, and drop index entries past it."""
        self.flush()
        self._read_stop = (-1, 0)
        with self.files.pin(self.path) as fd:
            os.ftruncate(fd, position)
            self.size = self._flushed = position
            self._writeback_from = min(self._writeback_from, position)
            self._dropped_to = min(self._dropped_to, position - position % _PAGE_BYTES)
            self.offsets.truncate_values_from(position)
            restart = self.offsets.last()
            scan_from = restart[1] if restart else 0
            # Time entries are added together with offset entries: keep those not past `restart`.
            self.times.truncate_values_from(restart[0] + 1 if restart else 0)
            last_time = self.times.last()
            self.max_timestamp = last_time[0] if last_time else NO_TIMESTAMP
            self.next_offset = self.base_offset
            if restart is not None:
                self.next_offset = self.base_offset + restart[0] + 1
            for _, header in self._scan(fd, scan_from, position, verify=False):
                self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
                self.next_offset = header.last_offset + 1
        self._bytes_since_index = position - scan_from if restart else position

    def sync(self) -> None:
        self.flush()
        self.sync_flushed()

    def start_writeback(self) -> None:
        """Once WRITEBACK_STEP_BYTES were written since the last call, ask the kernel to start
        writing them to disk without waiting (advisory: no-op where unsupported or refused)."""
        start = self._writeback_from
        if self._flushed - start < WRITEBACK_STEP_BYTES or _sync_file_range is None:
            return
        self._writeback_from = self._flushed
        with self.files.pin(self.path) as fd:
            _sync_file_range(fd, start, self._flushed - start, _SYNC_FILE_RANGE_WRITE)

    def drop_cached(self, below: int, step: int = DROP_STEP_BYTES, settle: bool = False) -> None:
        """Ask the kernel to drop this file's cached pages below file position `below` (only
        clean ones go: advisory, and a no-op where unsupported), once `step` bytes are due.

        With `settle` (pages that may not be on disk yet: fsync "never"), first wait for the
        range's writeback to end. The kernel passes over pages still dirty or being written
        back, and the range is not asked again: those pages then stayed cached until memory
        ran short, and were reclaimed by the kernel's scans or by the allocations of the
        writes themselves. Writeback of the range was started long before (start_writeback,
        cache_tail_bytes ago), so the wait is mostly none."""
        end = min(below, self._flushed)
        end -= end % _PAGE_BYTES
        if end - self._dropped_to < max(step, _PAGE_BYTES) or _fadvise is None:
            return
        start, self._dropped_to = self._dropped_to, end
        try:
            with self.files.pin(self.path) as fd:
                if settle and _sync_file_range is not None:
                    _sync_file_range(fd, start, end - start, _SYNC_FILE_RANGE_SETTLE)
                _fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError:  # e.g. retention deleted a sealed segment meanwhile: nothing to drop
            pass

    def sync_flushed(self) -> None:
        """Fsync what `flush` wrote; safe without the log's lock while appends go on."""
        handle = self.files.acquire(self.path)
        try:
            os.fdatasync(handle.fd)
        finally:
            self.files.release(handle)

    def write_indexes(self) -> None:
        self.offsets.write(self.index_path)
        self.times.write(self.timeindex_path)

    def delete(self) -> None:
        self._pending = bytearray()
        self.files.forget(self.path)
        for path in (self.path, self.index_path, self.timeindex_path):
            path.unlink(missing_ok=True)
        self.txns.delete()

    def retire(self) -> list[Path]:
        """Rename the files to `<name>.deleted` and return them for `unlink_later`: a rename
        is quick, while unlinking a 1 GiB file frees its extents for tens of ms or more."""
        self._pending = bytearray()
        self.files.forget(self.path)
        retired = []
        self.txns.entries = []
        for path in (self.path, self.index_path, self.timeindex_path, self.txns.path):
            target = path.with_name(path.name + DELETED_SUFFIX)
            try:
                os.rename(path, target)
            except FileNotFoundError:
                continue
            retired.append(target)
        return retired

    def remove_index_files(self) -> None:
        """The on-disk indexes go stale when a sealed segment becomes active again."""
        self.index_path.unlink(missing_ok=True)
        self.timeindex_path.unlink(missing_ok=True)

    # --- reading -------------------------------------------------------------------------

    def _scan(
        self, fd: int, start: int, end: int, *, verify: bool, chunk: int = _SCAN_CHUNK
    ) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) of each batch in [start, end), reading `chunk` bytes at a
        time (headers only unless `verify`).

        Raises CorruptBatchError at the first batch that is not sane (or fails its CRC).
        """
        position = start
        buf = b""
        buf_start = start
        while position < end:
            rel = position - buf_start
            if rel + HEADER_SIZE > len(buf):
                buf = os.pread(fd, min(chunk, end - position), position)
                buf_start, rel = position, 0
            header = parse_header(buf, rel)
            if position + header.size > end:
                raise CorruptBatchError(f"batch at {position} runs past the end of the segment")
            if verify:
                if rel + header.size > len(buf):
                    buf = os.pread(fd, max(_SCAN_CHUNK, header.size), position)
                    buf_start, rel = position, 0
                check_crc(memoryview(buf)[rel : rel + header.size], header)
            yield position, header
            position += header.size

    def locate(self, offset: int) -> tuple[int, BatchHeader | None]:
        """Position and header of the batch containing `offset`; (size, None) past the end."""
        if offset >= self.next_offset:
            return self.size, None
        self.flush()
        handle = self.files.acquire(self.path)
        try:
            return self._locate(handle.fd, offset)
        finally:
            self.files.release(handle)

    def _locate(self, fd: int, offset: int) -> tuple[int, BatchHeader | None]:
        """`locate` below the next offset, with the buffer flushed and `fd` pinned."""
        entry = self.offsets.floor(offset - self.base_offset)
        start = entry[1] if entry else 0
        # The target normally lies within one index interval of the entry.
        chunk = self.index_interval + HEADER_SIZE
        for position, header in self._scan(fd, start, self.size, verify=False, chunk=chunk):
            if header.last_offset >= offset:
                return position, header
        return self.size, None

    def read_batches(self, offset: int, max_bytes: int, upto: int | None) -> tuple[bytes, int]:
        """Whole batches from the one containing `offset` (below the next offset), within
        `max_bytes` but at least one, stopping before the batch containing `upto`; with the
        offset right after them.

        A sequential reader asks next for the offset the previous read stopped at: its
        position is remembered, so such a read costs one pread of the batches and, when
        `max_bytes` cuts them, one of the headers within an index interval below the cut.
        """
        self.flush()  # buffered batches are readable
        handle = self.files.acquire(self.path)
        try:
            fd = handle.fd
            if offset == self._read_stop[0]:
                start, base = self._read_stop[1], offset
            else:
                start, header = self._locate(fd, offset)
                base = header.base_offset  # type: ignore[union-attr]  # offset < next_offset
            end, following = self.size, self.next_offset
            if upto is not None and upto < following:
                if upto <= base:
                    return b"", offset
                end, at_upto = self._locate(fd, upto)
                if end == start:  # `upto` lies in the batch at `offset`
                    return b"", offset
                following = at_upto.base_offset  # type: ignore[union-attr]
            if end - start > max_bytes:
                end, following = self._last_boundary(fd, start, start + max_bytes)
            self._read_stop = (following, end)
            return os.pread(fd, end - start, start), following
        finally:
            self.files.release(handle)

    def _last_boundary(self, fd: int, start: int, limit: int) -> tuple[int, int]:
        """The last batch boundary <= `limit` past the batch at `start` (which counts even if
        it ends beyond `limit`), with the offset of the batch there. The sparse index gives a
        batch start at most one interval (plus a batch) below `limit`: headers are read only
        from there, usually with one pread."""
        entry = self.offsets.floor_value(limit)
        scan_from = max(start, entry[1]) if entry else start
        chunk = min(limit - scan_from, 2 * self.index_interval) + HEADER_SIZE
        end = following = -1
        for position, header in self._scan(fd, scan_from, self.size, verify=False, chunk=chunk):
            if position > start and position + header.size > limit:
                return position, header.base_offset
            end, following = position + header.size, header.last_offset + 1
            if end >= limit:  # no further batch fits: its header is not needed
                break
        return end, following

    def read(self, start: int, end: int) -> bytes:
        self.flush()
        with self.files.pin(self.path) as fd:
            return os.pread(fd, end - start, start)

    def first_at_or_after(self, timestamp: int, from_offset: int) -> int | None:
        """Base offset of the first batch at or after `from_offset` with max timestamp >= t."""
        entry = self.times.last_below(timestamp)
        start_offset = max(from_offset, self.base_offset + entry[1] + 1 if entry else 0)
        position, header = self.locate(start_offset)
        if header is None:
            return None  # locate flushed the buffer
        with self.files.pin(self.path) as fd:
            for _, header in self._scan(fd, position, self.size, verify=False):
                if header.max_timestamp >= timestamp:
                    return max(header.base_offset, from_offset)
        return None

    # --- recovery ------------------------------------------------------------------------

    def recover_tail(self) -> tuple[int, str | None]:
        """Scan the whole file with CRC checks, rebuild the indexes and cut a bad tail.

        Returns (bytes cut, reason) where reason is None if the file was intact.
        """
        with self.files.pin(self.path) as fd:
            file_size = os.fstat(fd).st_size
            good_end, reason = self._reindex(fd, file_size)
            if good_end < file_size:
                os.ftruncate(fd, good_end)
        self.size = self._flushed = good_end
        return file_size - good_end, reason

    def load_sealed(self) -> bool:
        """Load a sealed segment's indexes, rebuilding them (CRC-checking every batch) if they
        are missing or damaged.

        Returns True if the indexes were rebuilt. Raises CorruptBatchError if the data
        itself is damaged: a sealed segment was fsynced whole, so damage is real corruption.
        """
        with self.files.pin(self.path) as fd:
            self.size = self._flushed = os.fstat(fd).st_size
            try:
                self._load_indexes(fd)
                rebuilt = False
            except (IndexDamagedError, CorruptBatchError) as index_error:
                _, damage = self._reindex(fd, self.size)
                if damage is not None:
                    raise CorruptBatchError(f"{self.path.name}: {damage}") from index_error
                rebuilt = True
        if rebuilt:
            self.write_indexes()
        return rebuilt

    def index_file(self, path: Path) -> None:
        """Build this (not yet used) segment's in-memory state from `path`, a complete file
        that is to become its `.log` (a cleaned copy), CRC-checking every batch; writes
        nothing. Raises CorruptBatchError if a batch is damaged or out of place."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            _, damage = self._reindex(fd, size)
        finally:
            os.close(fd)
        if damage is not None:
            raise CorruptBatchError(f"{path.name}: {damage}")
        self.size = self._flushed = size

    def check_last_batch(self) -> None:
        """CRC-check the last batch (where a crash would have left damage)."""
        if self.size == 0:
            return
        position, header = self.locate(self.next_offset - 1)
        if header is None:
            raise CorruptBatchError(f"{self.path.name}: last batch not found")
        check_crc(self.read(position, position + header.size), header)

    def _load_indexes(self, fd: int) -> None:
        offsets = SparseIndex.load(OFFSET_ENTRY, self.index_path)
        times = SparseIndex.load(TIME_ENTRY, self.timeindex_path)
        last = offsets.last()
        start = 0
        self.max_timestamp = NO_TIMESTAMP
        if last is not None:
            start = last[1]
            if start >= self.size:
                raise IndexDamagedError(f"index points past the end of {self.path.name}")
            header = parse_header(os.pread(fd, HEADER_SIZE, start))
            if header.last_offset != self.base_offset + last[0]:
                raise IndexDamagedError(f"last index entry of {self.path.name} is stale")
        last_time = times.last()
        if last_time is not None:
            if last is None or last_time[1] > last[0]:
                raise IndexDamagedError(f"time index of {self.path.name} is ahead of its index")
            self.max_timestamp = last_time[0]
        self.offsets, self.times = offsets, times
        self.next_offset = self.base_offset + (last[0] + 1 if last else 0)
        for _, header in self._scan(fd, start, self.size, verify=False):
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
            self.next_offset = header.last_offset + 1
        self._bytes_since_index = self.size - start if last else self.size

    def _reindex(self, fd: int, end: int) -> tuple[int, str | None]:
        """Rebuild the indexes from the batches before `end`, CRC-checking each, up to the
        first bad one. Returns (end of the last good batch, why it stopped early or None)."""
        self.offsets, self.times = offset_index(), time_index()
        self._bytes_since_index = 0
        self.max_timestamp = NO_TIMESTAMP
        self.next_offset = self.base_offset
        good_end = 0
        try:
            for position, header in self._scan(fd, 0, end, verify=True):
                if header.base_offset != self.next_offset:
                    raise CorruptBatchError(
                        f"batch at {position} has base offset {header.base_offset}, "
                        f"expected {self.next_offset}"
                    )
                self._index(position, header.last_offset, header.max_timestamp, header.size)
                self.next_offset = header.last_offset + 1
                good_end = position + header.size
        except CorruptBatchError as exc:
            return good_end, str(exc)
        return good_end, None

    def first_timestamp(self) -> int | None:
        """Max timestamp of the first batch: the age a reopened segment is rolled by."""
        if self.size == 0:
            return None
        with self.files.pin(self.path) as fd:
            return parse_header(os.pread(fd, HEADER_SIZE, 0)).max_timestamp
