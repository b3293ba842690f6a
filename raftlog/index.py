"""Sparse per-segment indexes in Kafka's layout: `.index` (offset -> position), `.timeindex`.

Owns the in-memory entry lists, floor lookups, truncation and the byte encoding of both index files.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path

# Kafka's layouts: .index entries are (relative offset int32, position int32);
# .timeindex entries are (timestamp int64, relative offset int32). Big-endian.
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")


class IndexDamagedError(ValueError):
    """An index file that cannot be trusted; the segment rebuilds it from the log."""


class SparseIndex:
    """Sorted (key, value) pairs, both non-decreasing, answering "last entry with key <= k".

    The offset index keys relative offsets and maps them to file positions; the time index
    keys the largest timestamp seen so far and maps it to a relative offset.
    """

    __slots__ = ("entry", "keys", "values")

    def __init__(self, entry: struct.Struct) -> None:
        self.entry = entry
        self.keys: list[int] = []
        self.values: list[int] = []

    def __len__(self) -> int:
        return len(self.keys)

    def append(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)

    def last(self) -> tuple[int, int] | None:
        if not self.keys:
            return None
        return self.keys[-1], self.values[-1]

    def floor(self, key: int) -> tuple[int, int] | None:
        """The last entry whose key is <= `key`, or None if every key is larger."""
        i = bisect.bisect_right(self.keys, key)
        if i == 0:
            return None
        return self.keys[i - 1], self.values[i - 1]

    def floor_value(self, value: int) -> tuple[int, int] | None:
        """The last entry whose value is <= `value`."""
        i = bisect.bisect_right(self.values, value)
        if i == 0:
            return None
        return self.keys[i - 1], self.values[i - 1]

    def last_below(self, key: int) -> tuple[int, int] | None:
        """The last entry whose key is strictly < `key`."""
        i = bisect.bisect_left(self.keys, key)
        if i == 0:
            return None
        return self.keys[i - 1], self.values[i - 1]

    def truncate_values_from(self, value: int) -> None:
        """Drop every entry whose value is >= `value` (values are non-decreasing too)."""
        i = bisect.bisect_left(self.values, value)
        del self.keys[i:], self.values[i:]

    def to_bytes(self) -> bytes:
        pack = self.entry.pack
        return b"".join(pack(k, v) for k, v in zip(self.keys, self.values, strict=True))

    def write(self, path: Path) -> None:
        """Replace the file's contents with the current entries (no fsync: rebuildable)."""
        data = self.to_bytes()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    @classmethod
    def decode(cls, entry: struct.Struct, data: bytes) -> SparseIndex:
        """Parse index bytes; IndexDamagedError on a partial entry or a decreasing key/value."""
        if len(data) % entry.size:
            raise IndexDamagedError(f"size {len(data)} is not a multiple of {entry.size}")
        index = cls(entry)
        prev_key = prev_value = -(1 << 63)
        for key, value in entry.iter_unpack(data):
            if key < prev_key or value < prev_value or value < 0:
                raise IndexDamagedError(f"entry ({key}, {value}) out of order")
            index.append(key, value)
            prev_key, prev_value = key, value
        return index

    @classmethod
    def load(cls, entry: struct.Struct, path: Path) -> SparseIndex:
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise IndexDamagedError(f"{path.name} is missing") from exc
        return cls.decode(entry, data)


def offset_index() -> SparseIndex:
    return SparseIndex(OFFSET_ENTRY)


def time_index() -> SparseIndex:
    return SparseIndex(TIME_ENTRY)
