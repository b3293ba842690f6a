"""Raft storage over a partition log: the LogView the core reads, hard state and the trim point.

Owns the mapping between Raft entries and record batches, the state file (raftlog.state_file)
and the cache of recent entries that keeps the leader's tail reads off the disk.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from raftline.raftlog.batch import BatchHeader, iter_headers, parse_header
from raftline.raftlog.log import LogConfig, PartitionLog, now_ms
from raftline.raftlog.records import RAFT_CONFIG, RAFT_NOOP, build_control_batch, decode_batch
from raftline.raftlog.segment import FileCache
from raftline.raftlog.state_file import StateFile, StateFileError
from raftline.raftlog.types import Entry, EntryKind, HardState, SnapshotMeta

logger = logging.getLogger(__name__)

STATE_FILE = "raft-state.json"
_CONTROL_TYPES = {EntryKind.NOOP: RAFT_NOOP, EntryKind.CONFIG: RAFT_CONFIG}
_KINDS = {RAFT_NOOP: EntryKind.NOOP, RAFT_CONFIG: EntryKind.CONFIG}


class StorageError(ValueError):
    """A write or read the log cannot represent: a gap, a split entry, a range outside the log."""


class _TailCache:
    """The most recent entries as the core handed them over, contiguous up to the last index.

    Thread-safe: the driver's disk thread extends it while the loop reads a leader's older
    entries (asynchronous storage writes), so every operation holds one short lock."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.entries: list[Entry] = []
        self.bases: list[int] = []
        self.size = 0
        self._lock = threading.Lock()

    def covering(self, index: int) -> Entry | None:
        with self._lock:
            i = bisect.bisect_right(self.bases, index) - 1
            if i < 0 or index > self.entries[i].last_index:
                return None
            return self.entries[i]

    def since(self, index: int) -> list[Entry]:
        """Cached entries starting exactly at `index` (empty if not cached)."""
        with self._lock:
            i = bisect.bisect_left(self.bases, index)
            if i == len(self.bases) or self.bases[i] != index:
                return []
            return self.entries[i:]

    def truncate_from(self, index: int) -> None:
        with self._lock:
            i = bisect.bisect_left(self.bases, index)
            self.size -= sum(len(e.data) for e in self.entries[i:])
            del self.entries[i:], self.bases[i:]

    def drop_below(self, index: int) -> None:
        with self._lock:
            i = bisect.bisect_left(self.bases, index)
            self.size -= sum(len(e.data) for e in self.entries[:i])
            del self.entries[:i], self.bases[:i]

    def extend(self, entries: Sequence[Entry]) -> None:
        with self._lock:
            if self.entries and self.entries[-1].last_index + 1 != entries[0].index:
                self.entries, self.bases, self.size = [], [], 0
            self.entries.extend(entries)
            self.bases.extend(e.index for e in entries)
            self.size += sum(len(e.data) for e in entries)
            evict = 0
            while self.size > self.limit_bytes and evict < len(self.entries) - 1:
                self.size -= len(self.entries[evict].data)
                evict += 1
            del self.entries[:evict], self.bases[:evict]


def _encode_state(hard: HardState, snapshot: SnapshotMeta) -> bytes:
    return json.dumps(
        {
            "term": hard.term,
            "vote": hard.vote,
            "commit": hard.commit,
            "snapshot": {
                "index": snapshot.index,
                "term": snapshot.term,
                "voters": list(snapshot.voters),
                "learners": list(snapshot.learners),
            },
        }
    ).encode()


def _decode_state(data: bytes) -> tuple[HardState, SnapshotMeta]:
    try:
        raw = json.loads(data)
        snap = raw["snapshot"]
        hard = HardState(int(raw["term"]), raw["vote"], int(raw["commit"]))
        meta = SnapshotMeta(
            int(snap["index"]),
            int(snap["term"]),
            tuple(int(v) for v in snap["voters"]),
            tuple(int(v) for v in snap["learners"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"unreadable {STATE_FILE}: {exc}") from exc
    return hard, meta


class RaftStorage:
    """The durable side of one Raft group: entries in a PartitionLog, state in a small file.

    Entry kinds map to batches: DATA entries are the producer's batch, stamped with offset
    and term (partitionLeaderEpoch); NOOP and CONFIG become control batches of Raftline's
    control types whose record value is the entry's data; CONTROL entries must already be
    control batches (transaction markers) and are stored like DATA.

    Recent entries are served from a cache holding the core's own Entry objects: an
    immutable DATA payload is not copied to stamp it, so a cached entry's batch header may
    still show the producer's base offset and epoch; Entry.index and Entry.term are
    authoritative (followers stamp again on append).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        files: FileCache | None = None,
        clock: Callable[[], int] = now_ms,
        cache_bytes: int = 8 << 20,
    ) -> None:
        self.directory = Path(directory)
        self.log = PartitionLog(self.directory, config, files, clock)
        self._cache = _TailCache(cache_bytes)
        self._state = StateFile(self.directory / STATE_FILE)
        self._hard = HardState()
        self._snapshot = SnapshotMeta()
        try:
            saved = self._state.load()
        except StateFileError as exc:
            raise StorageError(str(exc)) from exc
        if saved is not None:
            self._hard, self._snapshot = _decode_state(saved)
        self._durable_hard = replace(self._hard)
        self._reconcile_trim_point()
        if self._hard.commit > self.last_index():
            logger.warning(
                "%s: commit %d beyond the recovered log end %d",
                self.directory,
                self._hard.commit,
                self.last_index(),
            )
            self._hard.commit = self.last_index()

    def _reconcile_trim_point(self) -> None:
        """Finish a trim or snapshot install that a crash interrupted (the state file is
        written first, so it is the authority)."""
        first = self._snapshot.index + 1
        if self.log.log_start_offset > first:
            raise StorageError(
                f"{self.directory}: log starts at {self.log.log_start_offset}, "
                f"but the trim point is {self._snapshot.index}"
            )
        if self.log.log_start_offset < first:
            self._move_log_start(self._snapshot)

    # --- LogView -----------------------------------------------------------------------------

    def first_index(self) -> int:
        return self._snapshot.index + 1

    def last_index(self) -> int:
        return self.log.next_offset - 1

    def snapshot_meta(self) -> SnapshotMeta:
        return self._snapshot

    def term_at(self, index: int) -> int | None:
        if index == self._snapshot.index:
            return self._snapshot.term
        # first_index() <= index <= last_index(), written out: a leader asks for a term on
        # every acknowledgement and every APPEND it sends.
        if not self._snapshot.index < index < self.log.next_offset:
            return None
        cached = self._cache.covering(index)
        if cached is not None:
            return cached.term
        return self.log.header_at(index).leader_epoch

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if not self.first_index() <= lo <= hi <= self.last_index():
            raise StorageError(
                f"entries [{lo}, {hi}] outside [{self.first_index()}, {self.last_index()}]"
            )
        out: list[Entry] = []
        size = 0
        offset = lo
        upto: int | None = None  # end of the entry covering hi, found on the first disk read
        while offset <= hi:
            cached = self._cache.since(offset)
            if cached:
                batch_entries = cached
            else:
                if upto is None:
                    upto = self.log.header_at(hi).last_offset + 1
                data = self.log.read(offset, max(max_bytes - size, 1), upto=upto)
                view = memoryview(data)
                batch_entries = [
                    self._entry_of(view[pos : pos + header.size], header)
                    for pos, header in iter_headers(view)
                ]
            if not batch_entries or batch_entries[0].index != offset:
                raise StorageError(f"entries from {offset}: not an entry boundary")
            for entry in batch_entries:
                if entry.index > hi or (out and size + len(entry.data) > max_bytes):
                    return out
                out.append(entry)
                size += len(entry.data)
            offset = out[-1].last_index + 1
        return out

    @staticmethod
    def _entry_of(view: memoryview, header: BatchHeader) -> Entry:
        kind, data = EntryKind.DATA, bytes(view)
        if header.is_control:
            decoded = decode_batch(view)
            control_type = decoded.control_type
            if control_type in _KINDS:
                kind, data = _KINDS[control_type], decoded.records[0].value or b""
            else:
                kind = EntryKind.CONTROL
        return Entry(header.base_offset, header.leader_epoch, kind, data, header.offset_count)

    # --- the driver's writes ---------------------------------------------------------------

    @property
    def hard_state(self) -> HardState:
        return self._hard

    def append(self, entries: Sequence[Entry]) -> None:
        """Store entries; an entry at offset i replaces every stored offset >= i.

        The entries reach the file (a killed process keeps them) in one write, but are never
        fsynced here, whatever the policy: the driver calls `fsync` once per round."""
        if not entries:
            return
        first = entries[0].index
        if not self.first_index() <= first <= self.last_index() + 1:
            raise StorageError(
                f"append at {first} outside [{self.first_index()}, {self.last_index() + 1}]"
            )
        batches = []
        expected = first
        for entry in entries:
            if entry.index != expected:
                raise StorageError(
                    f"entries not contiguous: expected {expected}, got {entry.index}"
                )
            batches.append((self._batch_of(entry), entry.term))
            expected = entry.last_index + 1
        if first <= self.last_index():
            if self.log.header_at(first).base_offset != first:
                raise StorageError(f"append at {first} splits a stored entry")
            self.log.truncate_suffix(first)
            self._cache.truncate_from(first)
        self.log.append_many(batches, base_offset=first, sync=False)
        self.log.flush()
        self._cache.extend(entries)

    @staticmethod
    def _batch_of(entry: Entry) -> bytes | bytearray | memoryview:
        if entry.kind in _CONTROL_TYPES:
            if entry.count != 1:
                raise StorageError(
                    f"{entry.kind.name} entry at {entry.index} has count {entry.count}"
                )
            return build_control_batch(_CONTROL_TYPES[entry.kind], entry.data)
        header = parse_header(entry.data)
        if header.offset_count != entry.count:
            raise StorageError(
                f"entry at {entry.index} has count {entry.count}, its batch {header.offset_count}"
            )
        if (entry.kind == EntryKind.CONTROL) != header.is_control:
            raise StorageError(f"{entry.kind.name} entry at {entry.index}: control flag mismatch")
        return entry.data

    def save(self, hard_state: HardState) -> None:
        """Record the hard state. A term or vote change is written and fsynced at once; a
        commit-only change is written with the next one (losing it is safe: Raft recomputes
        commit), or on close."""
        # A copy (the core may change its own); not dataclasses.replace, which looks the fields
        # up on every call: this runs once per round that moves the commit index.
        self._hard = HardState(hard_state.term, hard_state.vote, hard_state.commit)
        durable = self._durable_hard
        if (hard_state.term, hard_state.vote) != (durable.term, durable.vote):
            self._write_state()

    def _write_state(self) -> None:
        self._state.save(_encode_state(self._hard, self._snapshot))
        self._durable_hard = replace(self._hard)

    def fsync(self) -> None:
        """Make appended entries durable as the log's fsync policy prescribes."""
        policy = self.log.config.fsync
        if policy == "always":
            self.log.sync()
        elif policy == "interval":
            self.log.maybe_sync()

    def install(self, meta: SnapshotMeta) -> None:
        """Move the trim point to a snapshot received from the leader: keep the suffix only if
        the log holds the snapshot's last entry with its term, else start empty after it."""
        if meta.index <= self._snapshot.index:
            return
        self._snapshot = meta
        self._write_state()
        self._move_log_start(meta)

    def trim(self, index: int, voters: tuple[int, ...], learners: tuple[int, ...]) -> SnapshotMeta:
        """Trim the prefix up to `index`, which must end a stored entry; return the new point."""
        term = self.term_at(index)
        if term is None or index == self._snapshot.index:
            raise StorageError(f"trim point {index} outside the stored log")
        if self.log.header_at(index).last_offset != index:
            raise StorageError(f"trim point {index} does not end an entry")
        meta = SnapshotMeta(index, term, voters, learners)
        self.install(meta)
        return meta

    def _move_log_start(self, meta: SnapshotMeta) -> None:
        first = meta.index + 1
        keeps_suffix = (
            self.log.log_start_offset <= meta.index < self.log.next_offset
            and self.log.header_at(meta.index).last_offset == meta.index
            and self.log.header_at(meta.index).leader_epoch == meta.term
        )
        if not keeps_suffix and self.log.next_offset > self.log.log_start_offset:
            self.log.truncate_suffix(self.log.log_start_offset)
            self._cache.truncate_from(self.log.log_start_offset)
        self.log.drop_prefix(first)
        self._cache.drop_below(first)

    def retention_point(self, now_ms: int | None = None) -> int:
        """The last offset the log's retention settings would drop (the trim point when none):
        the runtime passes it to `trim` together with the membership in force there."""
        return max(self.log.retention_point(now_ms), self.first_index()) - 1

    def close(self) -> None:
        if self._hard != self._durable_hard:
            self._write_state()
        self.log.close()
