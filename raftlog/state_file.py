"""A Raft group's small durable state (term, vote, commit, trim point): two slots written in place.

Owns the file layout and its crash rules: a save overwrites the older of two checksummed slots and
syncs the data only, so it costs one fdatasync and no journal commit (a temp file, a rename and a
directory fsync cost three syncs: at tens of thousands of groups electing at once that was most of
the disk's work). A torn save spoils only the slot it wrote: the other slot still holds the last
state whose save returned, which is all Raft relies on. Files written by earlier versions (one
JSON document) are read, and are replaced by the slotted layout at their next save.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

SLOT_BYTES = 1024
_HEADER = struct.Struct(">QII")  # sequence number, payload length, CRC-32 of the payload
MAX_PAYLOAD = SLOT_BYTES - _HEADER.size


class StateFileError(ValueError):
    """Neither slot holds a readable state."""


class StateFile:
    """`load()` once, then `save(payload)` as often as needed; not thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sequence = 0  # of the newest slot on disk; 0: no slotted file yet

    def load(self) -> bytes | None:
        """The payload of the newest intact slot (or of a legacy file); None if no file."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if data[:1] == b"{":  # a single JSON document (earlier versions)
            return data
        best: tuple[int, bytes] | None = None
        for slot in range(2):
            found = _read_slot(data[slot * SLOT_BYTES : (slot + 1) * SLOT_BYTES])
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        if best is None:
            raise StateFileError(f"{self.path}: no intact state slot")
        self._sequence = best[0]
        return best[1]

    def save(self, payload: bytes) -> None:
        """Durably replace the state: returns once `payload` survives a crash."""
        if len(payload) > MAX_PAYLOAD:
            raise StateFileError(f"state of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
        sequence = self._sequence + 1
        slot = _HEADER.pack(sequence, len(payload), zlib.crc32(payload)) + payload
        slot += bytes(SLOT_BYTES - len(slot))
        if self._sequence == 0:
            self._create(slot)
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.pwrite(fd, slot, (sequence % 2) * SLOT_BYTES)
                os.fdatasync(fd)
            finally:
                os.close(fd)
        self._sequence = sequence

    def _create(self, first: bytes) -> None:
        """The first slotted save: both slots written to a temp file renamed into place (the
        file's size and existence then never change again)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, bytes(SLOT_BYTES) + first)  # sequence 1 goes to slot 1
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _read_slot(raw: bytes) -> tuple[int, bytes] | None:
    if len(raw) < _HEADER.size:
        return None
    sequence, length, crc = _HEADER.unpack_from(raw)
    payload = raw[_HEADER.size : _HEADER.size + length]
    if sequence == 0 or length > MAX_PAYLOAD or len(payload) != length:
        return None
    if zlib.crc32(payload) != crc:
        return None
    return sequence, payload
