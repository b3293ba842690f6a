"""An in-memory Raft log with a disk model: writes sit in a volatile buffer until fsync.

Owns the simulator's storage (a LogView for the core): appends, hard state, snapshot install,
prefix trimming, and what a crash keeps (the synced state, optionally plus a prefix of the buffer).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field, replace
from itertools import pairwise

from raftline.raftlog.types import Entry, HardState, SnapshotMeta


class StorageError(ValueError):
    """A write the log cannot represent: a gap, a trim outside the log, a bad range."""


@dataclass(slots=True)
class _LogState:
    """One materialised state of the log: entries after the snapshot point, hard state."""

    entries: list[Entry] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)  # entries[i].index, for bisect
    snapshot: SnapshotMeta = field(default_factory=SnapshotMeta)
    hard_state: HardState = field(default_factory=HardState)

    def copy(self) -> _LogState:
        return _LogState(list(self.entries), list(self.bases), self.snapshot, self.hard_state)

    def last_index(self) -> int:
        return self.entries[-1].last_index if self.entries else self.snapshot.index

    def term_at(self, index: int) -> int | None:
        if index == self.snapshot.index:
            return self.snapshot.term
        if index < self.snapshot.index or index > self.last_index():
            return None
        return self.entries[self.position(index)].term

    def position(self, index: int) -> int:
        """Position in `entries` of the entry covering `index` (caller checks the range)."""
        return bisect_right(self.bases, index) - 1

    def append(self, entries: list[Entry]) -> list[Entry]:
        """Store `entries`, replacing every offset >= the first one's; return what was removed."""
        first = entries[0].index
        if first <= self.snapshot.index or first > self.last_index() + 1:
            raise StorageError(
                f"append at {first} outside ({self.snapshot.index}, {self.last_index() + 1}]"
            )
        for before, after in pairwise(entries):
            if after.index != before.last_index + 1:
                raise StorageError(
                    f"entries not contiguous: {before.last_index} then {after.index}"
                )
        removed: list[Entry] = []
        if first <= self.last_index():
            pos = self.position(first)
            if self.entries[pos].index != first:
                raise StorageError(f"append at {first} splits the entry at {self.bases[pos]}")
            removed = self.entries[pos:]
            del self.entries[pos:]
            del self.bases[pos:]
        self.entries.extend(entries)
        self.bases.extend(e.index for e in entries)
        return removed

    def install(self, meta: SnapshotMeta) -> list[Entry]:
        """Move the snapshot point to `meta`; keep the suffix only if the log agrees at it.

        Returns the entries after the point that were discarded."""
        kept: list[Entry] = []
        if self.snapshot.index < meta.index <= self.last_index():
            pos = self.position(meta.index)
            covering = self.entries[pos]
            if covering.last_index == meta.index and covering.term == meta.term:
                kept = self.entries[pos + 1 :]
        # Entries at or below the point are subsumed by the snapshot, not lost.
        removed = [] if kept else [e for e in self.entries if e.last_index > meta.index]
        self.entries = kept
        self.bases = [e.index for e in kept]
        self.snapshot = meta
        return removed

    def trim(self, meta: SnapshotMeta) -> None:
        """Drop the entries up to meta.index, which must end an entry of term meta.term."""
        pos = self.position(meta.index)
        if not (self.snapshot.index < meta.index <= self.last_index()):
            raise StorageError(f"trim point {meta.index} outside the stored log")
        if self.entries[pos].last_index != meta.index or self.entries[pos].term != meta.term:
            raise StorageError(f"trim point {meta.index} does not end an entry of term {meta.term}")
        del self.entries[: pos + 1]
        del self.bases[: pos + 1]
        self.snapshot = meta


class MemLog:
    """The simulator's durable storage for one replica, implementing LogView for the core.

    Every write (append, hard state, snapshot install, trim) changes the visible state at once
    and is queued in a volatile buffer; `fsync` makes the buffer durable, `crash` loses it.
    """

    def __init__(self) -> None:
        self._current = _LogState()
        self._durable = _LogState()
        self._buffer: list[tuple[str, object]] = []

    # LogView
    def first_index(self) -> int:
        return self._current.snapshot.index + 1

    def last_index(self) -> int:
        return self._current.last_index()

    def term_at(self, index: int) -> int | None:
        return self._current.term_at(index)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        state = self._current
        if lo <= state.snapshot.index or lo > state.last_index() or hi < lo:
            raise StorageError(f"entries [{lo}, {hi}] outside the stored log")
        pos = state.position(lo)
        if state.entries[pos].index != lo:
            raise StorageError(f"entries from {lo}: not an entry boundary")
        end = min(state.position(hi) + 1, len(state.entries))
        out: list[Entry] = [state.entries[pos]]
        size = len(out[0].data)
        for entry in state.entries[pos + 1 : end]:
            size += len(entry.data)
            if size > max_bytes:
                break
            out.append(entry)
        return out

    def snapshot_meta(self) -> SnapshotMeta:
        return self._current.snapshot

    # The driver's writes
    @property
    def hard_state(self) -> HardState:
        return self._current.hard_state

    def append(self, entries: list[Entry]) -> list[Entry]:
        """Store entries (an entry at offset i replaces offsets >= i); return the removed ones."""
        if not entries:
            return []
        removed = self._current.append(entries)
        self._buffer.append(("append", list(entries)))
        return removed

    def save(self, hard_state: HardState) -> None:
        # Copied: the core may keep mutating the object it handed out.
        self._current.hard_state = replace(hard_state)
        self._buffer.append(("save", self._current.hard_state))

    def install(self, meta: SnapshotMeta) -> list[Entry]:
        """Install a snapshot point received from the leader; return the entries dropped."""
        removed = self._current.install(meta)
        self._buffer.append(("install", meta))
        return removed

    def trim(self, index: int, voters: tuple[int, ...], learners: tuple[int, ...]) -> SnapshotMeta:
        """Trim the prefix up to `index` (an entry's last offset); return the new trim point."""
        term = self.term_at(index)
        if term is None:
            raise StorageError(f"trim point {index} outside the stored log")
        meta = SnapshotMeta(index, term, voters, learners)
        self._current.trim(meta)
        self._buffer.append(("trim", meta))
        return meta

    def fsync(self) -> None:
        for op in self._buffer:
            _replay(self._durable, op)
        self._buffer.clear()

    @property
    def unsynced(self) -> int:
        """Writes buffered since the last fsync."""
        return len(self._buffer)

    def durable_hard_state(self) -> HardState:
        return self._durable.hard_state

    def durable_term_at(self, index: int) -> int | None:
        """term_at as a crash right now would leave it."""
        return self._durable.term_at(index)

    def durable_snapshot_index(self) -> int:
        return self._durable.snapshot.index

    def crash(self, keep: int = 0) -> None:
        """Lose the volatile buffer, except its first `keep` writes (they reached the disk)."""
        for op in self._buffer[:keep]:
            _replay(self._durable, op)
        self._buffer.clear()
        self._current = self._durable.copy()

    def all_entries(self) -> list[Entry]:
        """Every stored entry after the trim point, in order (for checks and tests)."""
        return list(self._current.entries)


def _replay(state: _LogState, op: tuple[str, object]) -> None:
    kind, arg = op
    if kind == "append":
        state.append(arg)  # type: ignore[arg-type]
    elif kind == "save":
        state.hard_state = arg  # type: ignore[assignment]
    elif kind == "install":
        state.install(arg)  # type: ignore[arg-type]
    else:
        state.trim(arg)  # type: ignore[arg-type]
