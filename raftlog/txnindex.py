"""The aborted-transaction index of one segment: `<base offset>.txnindex`, Kafka's layout.

Owns the file format, its in-memory entry list, appends, truncation and the lookup of the
aborted transactions a read_committed fetch of a range must drop.

Format (identical to Kafka's TransactionIndex, so tools and the tiered copy read it as is): a
file of fixed 34-byte big-endian entries, nothing else (no header, no checksum):

    int16 version (0) | int64 producer id | int64 first offset | int64 last offset
                      | int64 last stable offset

One entry per aborted transaction whose ABORT marker lies in this segment, appended in marker
order (so `last offset`, the marker's offset, increases through the file and across the
segments of a log). `first offset` is the offset of the transaction's first batch on this
partition (possibly in an earlier segment, or below the log start after retention); every
batch of that producer id in [first offset, last offset] is aborted. `last stable offset` is
the partition's LSO right after the abort: a reader collecting entries for a range ending at
`end` may stop at the first entry whose LSO is >= `end`, since every transaction with data
below `end` was complete by then.

A reader drops a data batch of producer P at offset o exactly when an entry (P, first, last) of
this or a later segment has first <= o <= last; control batches (markers) are never records.
A copy of one segment read on its own (tiered storage's `.txnindex` object, tiered/FORMAT.md
section 6, read by the Spark source) needs the entries of every abort with data in the segment,
whose markers may lie in later segments: PartitionLog.aborted_txns(base, next offset) gives
exactly those, in this entry layout. The broker writes an index file (maybe empty) for every
segment it seals, and rebuilds missing ones on open (raftlog/log.py, node/producers.py).

Invariants: entries are whole (a torn tail from a crash is cut on load); last offsets strictly
increase; an entry is never duplicated (a replay appending an entry at or below the last one's
marker is a no-op).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

ENTRY = struct.Struct(">hqqqq")
VERSION = 0
SUFFIX = ".txnindex"


class AbortedTxn(NamedTuple):
    """An aborted transaction's span: its producer's batches in [first, last] are dropped by
    read_committed readers; last_offset is the abort marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int = -1


class TxnIndexDamagedError(ValueError):
    """An index file whose entries cannot be trusted (a bad version)."""


def encode(entries: list[AbortedTxn]) -> bytes:
    return b"".join(ENTRY.pack(VERSION, *entry) for entry in entries)


def decode(data: bytes) -> list[AbortedTxn]:
    """The whole entries of `data` (a torn tail is ignored)."""
    whole = len(data) - len(data) % ENTRY.size
    entries = []
    for version, *fields in ENTRY.iter_unpack(data[:whole]):
        if version != VERSION:
            raise TxnIndexDamagedError(f"unknown transaction index entry version {version}")
        entries.append(AbortedTxn(*fields))
    return entries


class TxnIndex:
    """One segment's aborted transactions, in memory and in its file (not thread-safe: the
    log's lock serializes every call)."""

    __slots__ = ("dirty", "entries", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []
        self.dirty = False  # appended to since the last sync

    def load(self) -> bool:
        """Read the file; False if it is missing or damaged (then the index is empty and the
        owner rebuilds it). A torn tail is cut from the file."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return False
        try:
            self.entries = decode(data)
        except TxnIndexDamagedError:
            self.entries = []
            return False
        if len(data) % ENTRY.size:
            self.rewrite()
        return True

    def ensure_file(self) -> None:
        """Create the file (empty) if it does not exist: a sealed segment always has one."""
        if not self.path.exists():
            self.rewrite()

    def append(self, entry: AbortedTxn) -> bool:
        """Add an entry unless one with a marker at or past its marker is already there (a
        replay of the log); True if added. Written at once, fsynced by sync()."""
        if self.entries and self.entries[-1].last_offset >= entry.last_offset:
            return False
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, ENTRY.pack(VERSION, *entry))
        finally:
            os.close(fd)
        self.entries.append(entry)
        self.dirty = True
        return True

    def truncate_from(self, offset: int) -> None:
        """Forget entries whose marker is at or after `offset` (a truncated log suffix)."""
        keep = [e for e in self.entries if e.last_offset < offset]
        if len(keep) != len(self.entries):
            self.entries = keep
            self.rewrite()

    def rewrite(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(encode(self.entries))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self.dirty = True  # the rename: the directory's fsync makes it durable

    def sync(self) -> None:
        if not self.dirty:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self.dirty = False
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.dirty = False

    def delete(self) -> None:
        self.entries = []
        self.path.unlink(missing_ok=True)


def collect(indexes: list[TxnIndex], start: int, end: int) -> list[AbortedTxn]:
    """Aborted transactions with data in [start, end), from the indexes of the segments from
    the one holding `start` to the end of the log (in order), by first offset."""
    found: list[AbortedTxn] = []
    for index in indexes:
        for entry in index.entries:
            if entry.last_offset >= start and entry.first_offset < end:
                found.append(entry)
            if entry.last_stable_offset >= end:
                return sorted(found, key=lambda a: a.first_offset)
    return sorted(found, key=lambda a: a.first_offset)
