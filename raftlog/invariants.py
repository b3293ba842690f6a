"""Raft safety invariants, checked incrementally as a driver persists, sends and applies.

Owns the global record of committed entries and every rule the simulator enforces after each step.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from raftline.raftlog.memlog import MemLog
from raftline.raftlog.types import Entry, EntryKind, HardState, SnapshotMeta


class InvariantViolation(AssertionError):
    """A Raft safety rule was broken; `rule` names it, the message says where."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule = rule


class Checker:
    """Collects what every replica did and raises InvariantViolation on the first broken rule.

    Log matching is checked by induction: every (offset, term) pair anywhere must always carry the
    same entry and the same predecessor position, so two logs that share a position share the
    whole prefix below it.
    """

    def __init__(self) -> None:
        # The committed log as first applied anywhere, from offset 0 up.
        self.committed: list[Entry] = []
        self._bases: list[int] = []
        # Lowest term any replica had when it learnt each entry was committed (non-decreasing):
        # an entry learnt at term t was committed in a term <= t.
        self._known_terms: list[int] = []
        self._offset_of_data: dict[bytes, int] = {}
        self._positions: dict[tuple[int, int], tuple[int, EntryKind, bytes, int, int]] = {}
        self.leaders: dict[int, int] = {}  # term -> the node that led it
        self._votes: dict[tuple[int, int], int] = {}  # (voter, term) -> candidate
        self._read_floor: dict[tuple[int, bytes], int] = {}  # (node, context) -> commit before

    # Global facts
    def committed_offset(self) -> int:
        return self.committed[-1].last_index if self.committed else -1

    def committed_at(self, offset: int) -> Entry | None:
        """The committed entry covering `offset`, if that offset is known committed."""
        if offset < 0 or offset > self.committed_offset():
            return None
        return self.committed[bisect_right(self._bases, offset) - 1]

    def committed_data(self) -> dict[bytes, int]:
        """Base offset of every committed DATA payload."""
        return dict(self._offset_of_data)

    # Persistence
    def on_append(self, node: int, log: MemLog, entries: list[Entry]) -> None:
        """`entries` were just stored in `log`: check their positions against every other log."""
        prev_index = entries[0].index - 1
        prev_term = log.term_at(prev_index)
        if prev_term is None:
            raise InvariantViolation(
                "log gap", f"node {node} stored {entries[0].index} after a gap"
            )
        for entry in entries:
            shape = (entry.count, entry.kind, entry.data, prev_index, prev_term)
            seen = self._positions.setdefault((entry.index, entry.term), shape)
            if seen != shape:
                raise InvariantViolation(
                    "log matching",
                    f"node {node} stored offset {entry.index} term {entry.term} as "
                    f"{_shape(shape)}, another log holds {_shape(seen)}",
                )
            prev_index, prev_term = entry.last_index, entry.term

    def on_removed(self, node: int, removed: list[Entry], why: str) -> None:
        """Entries left `node`'s log (truncation or crash): none of them may be committed."""
        for entry in removed:
            committed = self.committed_at(entry.index)
            if committed is not None and committed.term == entry.term:
                raise InvariantViolation(
                    "committed entry lost",
                    f"node {node} dropped committed offset {entry.index} term {entry.term} ({why})",
                )

    def on_hard_state(self, node: int, old: HardState, new: HardState) -> None:
        if new.term < old.term:
            raise InvariantViolation("term regressed", f"node {node}: {old.term} -> {new.term}")
        if new.term == old.term and old.vote is not None and new.vote != old.vote:
            raise InvariantViolation(
                "vote changed within a term",
                f"node {node} term {new.term}: {old.vote} -> {new.vote}",
            )
        if new.commit < old.commit:
            raise InvariantViolation(
                "commit index regressed", f"node {node} stored {old.commit} -> {new.commit}"
            )

    # Messages
    def on_vote_granted(self, voter: int, term: int, candidate: int, durable: HardState) -> None:
        """A granted vote leaves `voter`: one candidate per term, and the vote is already synced."""
        if durable.term != term or durable.vote != candidate:
            raise InvariantViolation(
                "vote sent before it was durable",
                f"node {voter} granted term {term} to {candidate}, synced hard state "
                f"term {durable.term} vote {durable.vote}",
            )
        earlier = self._votes.setdefault((voter, term), candidate)
        if earlier != candidate:
            raise InvariantViolation(
                "two votes in one term", f"node {voter} voted {earlier} then {candidate} in {term}"
            )

    def on_campaign(self, candidate: int, term: int, durable: HardState) -> None:
        """A vote request leaves `candidate`: its own term and self-vote must be synced first."""
        if durable.term != term or durable.vote != candidate:
            raise InvariantViolation(
                "vote request sent before the self-vote was durable",
                f"node {candidate} asked for term {term}, synced hard state "
                f"term {durable.term} vote {durable.vote}",
            )

    # Volatile state
    def on_role(self, node: int, role: str, term: int) -> None:
        if role != "leader":
            return
        leader = self.leaders.setdefault(term, node)
        if leader != node:
            raise InvariantViolation("two leaders in one term", f"{leader} and {node} in {term}")

    def check_leader_complete(self, node: int, term: int, log: MemLog) -> None:
        """A leader of `term` holds every entry committed in an earlier term."""
        last = bisect_left(self._known_terms, term) - 1
        if last < 0:
            return
        entry = self.committed[last]
        if entry.last_index <= log.snapshot_meta().index:
            return
        if log.term_at(entry.last_index) != entry.term:
            raise InvariantViolation(
                "leader completeness",
                f"leader {node} of term {term} lacks committed offset {entry.last_index} "
                f"term {entry.term} (has term {log.term_at(entry.last_index)})",
            )

    def on_leader_commit(self, node: int, term: int, commit: int, commit_term: int | None) -> None:
        """A leader advanced its commit index: by counting replicas, so only to its own term."""
        if commit_term != term:
            raise InvariantViolation(
                "previous-term entry committed by counting",
                f"leader {node} of term {term} moved its commit to offset {commit} "
                f"of term {commit_term}",
            )

    # Applying
    def on_applied(self, node: int, applied: int, entry: Entry, node_term: int) -> None:
        """`node`, having applied up to `applied`, now applies `entry` as committed."""
        if entry.index != applied + 1:
            raise InvariantViolation(
                "applied out of order", f"node {node} applied {entry.index} after {applied}"
            )
        known = self.committed_at(entry.index)
        if known is None:
            self._record(entry, node_term)
        elif (known.index, known.term, known.count, known.kind, known.data) != (
            entry.index,
            entry.term,
            entry.count,
            entry.kind,
            entry.data,
        ):
            raise InvariantViolation(
                "committed entry changed",
                f"node {node} applied offset {entry.index} term {entry.term}; "
                f"committed was offset {known.index} term {known.term}",
            )

    def _record(self, entry: Entry, node_term: int) -> None:
        if entry.kind == EntryKind.DATA:
            earlier = self._offset_of_data.setdefault(entry.data, entry.index)
            if earlier != entry.index:
                raise InvariantViolation(
                    "proposal committed twice",
                    f"payload {entry.data!r} at offsets {earlier} and {entry.index}",
                )
        self.committed.append(entry)
        self._bases.append(entry.index)
        floor = self._known_terms[-1] if self._known_terms else 0
        self._known_terms.append(max(floor, node_term))

    def on_snapshot(self, node: int, applied: int, meta: SnapshotMeta) -> None:
        """`node` installs a snapshot: it must be a committed point, not behind what it applied."""
        known = self.committed_at(meta.index)
        if known is None or known.last_index != meta.index or known.term != meta.term:
            raise InvariantViolation(
                "snapshot not committed",
                f"node {node} installed snapshot {meta.index} term {meta.term}; committed up to "
                f"{self.committed_offset()}",
            )
        if meta.index < applied:
            raise InvariantViolation(
                "snapshot behind applied", f"node {node} applied {applied}, snapshot {meta.index}"
            )

    # Reads
    def on_read_request(self, node: int, context: bytes) -> None:
        self._read_floor[(node, context)] = self.committed_offset()

    def on_read_state(self, node: int, index: int, context: bytes) -> None:
        floor = self._read_floor.get((node, context))
        if floor is None:
            raise InvariantViolation("unknown read", f"node {node} answered {context!r}")
        if index < floor:
            raise InvariantViolation(
                "stale read index",
                f"node {node} answered {context!r} at {index}; {floor} was committed before",
            )


def _shape(shape: tuple[int, EntryKind, bytes, int, int]) -> str:
    count, kind, data, prev_index, prev_term = shape
    return f"{kind.name} x{count} {data[:24]!r} after ({prev_index}, {prev_term})"
