"""The Raft core's view of its log: durable entries through LogView plus the unstable tail.

Owns offset/term lookups across both, truncation of conflicting suffixes and the hand-over
of unstable entries (and a received snapshot point) to the driver for persistence, each once:
the driver may still be writing earlier hand-overs when it asks for the next.
"""

from __future__ import annotations

from bisect import bisect_right

from .types import Entry, LogView, SnapshotMeta


class RaftLog:
    """Entries at offsets >= the first unstable entry live only here until persisted;
    durable entries at those offsets are logically replaced. Unstable entries through
    `handed_out` are being written by the driver; later ones are not yet handed out."""

    __slots__ = ("handed_out", "pending_snapshot", "snapshot_handed_out", "stable", "unstable")

    def __init__(self, stable: LogView) -> None:
        self.stable = stable
        self.unstable: list[Entry] = []
        self.handed_out = stable.last_index()
        self.pending_snapshot: SnapshotMeta | None = None  # received, not yet installed
        self.snapshot_handed_out = False

    # -- lookups -----------------------------------------------------------------------
    def snapshot_index(self) -> int:
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        return self.stable.snapshot_meta().index

    def first_index(self) -> int:
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index + 1
        return self.stable.first_index()

    def last_index(self) -> int:
        if self.unstable:
            return self.unstable[-1].last_index
        # persisted_last_index() without an unstable tail, written out: asked several times
        # per message on a leader, whose tail is mostly persisted.
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        return self.stable.last_index()

    def persisted_last_index(self) -> int:
        """Last offset whose entry is durable and not replaced by the unstable tail."""
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        stable_last = self.stable.last_index()
        if self.unstable:
            return min(stable_last, self.unstable[0].index - 1)
        return stable_last

    def last_term(self) -> int:
        term = self.term_at(self.last_index())
        assert term is not None  # the last offset is always known (entry or snapshot point)
        return term

    def term_at(self, index: int) -> int | None:
        """Term of the entry covering `index`; None when trimmed away or beyond the end."""
        if index < 0:
            return 0  # the empty prefix matches every log
        unstable = self.unstable
        if unstable and index >= unstable[0].index:
            if index > unstable[-1].last_index:
                return None
            return unstable[bisect_right(unstable, index, key=_index_of) - 1].term
        snap = self.pending_snapshot
        if snap is not None:
            return snap.term if index == snap.index else None
        return self.stable.term_at(index)

    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries covering [lo, hi] (lo at an entry boundary), at least one, about max_bytes."""
        unstable = self.unstable
        if unstable and lo >= unstable[0].index:
            # From the first unstable entry (a leader's next APPEND, mostly): no search.
            start = 0 if lo == unstable[0].index else bisect_right(unstable, lo, key=_index_of) - 1
            return _take(unstable, start, hi, max_bytes)
        stable_hi = min(hi, unstable[0].index - 1) if unstable else hi
        entries = self.stable.entries(lo, stable_hi, max_bytes)
        if unstable and hi >= unstable[0].index and entries[-1].last_index == stable_hi:
            used = sum(len(e.data) for e in entries)
            if used < max_bytes:
                entries.extend(_take(unstable, 0, hi, max_bytes - used))
        return entries

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest offset <= index whose term is <= term, and its term (the reject hint).

        Terms never decrease along a log, so this is a binary search; offsets below the
        trim point are unknown, so the answer stops at the snapshot point.
        """
        lo = self.first_index() - 1
        lo_term = self.term_at(lo)
        if lo_term is None or lo_term > term or index <= lo:
            return lo, lo_term or 0
        hi = index
        while lo < hi:  # invariant: term_at(lo) <= term
            mid = (lo + hi + 1) // 2
            mid_term = self.term_at(mid)
            if mid_term is not None and mid_term <= term:
                lo = mid
            else:
                hi = mid - 1
        found = self.term_at(lo)
        return lo, found if found is not None else 0

    def probe_point(self, hint: int, hint_term: int) -> int:
        """Leader side of a reject hint: the last offset <= hint that may match a follower whose
        entry ending at `hint` has `hint_term`. Always an entry end in this log."""
        found, found_term = self.find_conflict_by_term(hint, hint_term)
        if found == hint and found_term < hint_term:
            # Our entry there is older and may run past `hint`: back up before its whole term.
            found, _ = self.find_conflict_by_term(hint, found_term - 1)
        return found

    # -- hand-over ---------------------------------------------------------------------
    def has_unhanded(self) -> bool:
        unstable = self.unstable
        return bool(unstable) and unstable[-1].last_index > self.handed_out

    def hand_out(self) -> list[Entry]:
        """Unstable entries not handed out yet, in order; from now on they are being written."""
        unstable = self.unstable
        if not unstable or unstable[-1].last_index <= self.handed_out:
            return []
        start = 0
        if unstable[0].index <= self.handed_out:
            start = bisect_right(unstable, self.handed_out, key=_index_of)
        self.handed_out = unstable[-1].last_index
        return unstable[start:]

    def hand_out_snapshot(self) -> SnapshotMeta | None:
        if self.pending_snapshot is None or self.snapshot_handed_out:
            return None
        self.snapshot_handed_out = True
        return self.pending_snapshot

    # -- mutation ----------------------------------------------------------------------
    def append(self, entries: list[Entry]) -> None:
        """Append entries; the first one replaces every offset >= its index (a replaced entry
        still being written is overwritten by the next hand-over, which starts at `first`)."""
        first = entries[0].index
        if first > self.last_index() + 1:
            raise ValueError(f"append at offset {first} leaves a gap after {self.last_index()}")
        self.handed_out = min(self.handed_out, first - 1)
        unstable = self.unstable
        if unstable and first > unstable[0].index:
            if first <= unstable[-1].last_index:
                keep = bisect_right(unstable, first, key=_index_of) - 1
                if unstable[keep].index != first:
                    raise ValueError(f"append at offset {first} splits an unstable entry")
                del unstable[keep:]
            unstable.extend(entries)
        else:
            self.unstable = list(entries)

    def append_new(self, entry: Entry) -> None:
        """A leader's own entry right after the last one (a leader never truncates)."""
        self.unstable.append(entry)

    def restore(self, snapshot: SnapshotMeta) -> None:
        """A snapshot replaces the whole log; it is pending until the driver installs it."""
        self.pending_snapshot = snapshot
        self.snapshot_handed_out = False
        self.unstable = []
        self.handed_out = snapshot.index

    def persisted(self, last: Entry | None, snapshot: SnapshotMeta | None) -> None:
        """The driver made durable what a Ready handed out (entries through `last`)."""
        if snapshot is not None and self.pending_snapshot is snapshot:
            self.pending_snapshot = None
        if last is None:
            return
        unstable = self.unstable
        for pos in range(len(unstable) - 1, -1, -1):  # usually the tail: search from the end
            if unstable[pos] is last:
                del unstable[: pos + 1]
                return
        # Not found: a newer append replaced it meanwhile; the newer one is still unstable.


def _index_of(entry: Entry) -> int:
    return entry.index


def _take(entries: list[Entry], start: int, hi: int, max_bytes: int) -> list[Entry]:
    used = len(entries[start].data)
    end, n = start + 1, len(entries)
    while end < n:
        entry = entries[end]
        size = len(entry.data)
        if entry.index > hi or used + size > max_bytes:
            break
        used += size
        end += 1
    return entries[start:end]
