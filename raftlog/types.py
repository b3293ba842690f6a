"""Values the Raft core exchanges with whoever drives it: entries, messages, hard state, Ready.

Owns the contract between the sans-I/O core (raftlog.raft), the node runtime and the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol


class EntryKind(IntEnum):
    """What an entry carries. Only DATA entries are visible to consumers."""

    DATA = 0  # a record batch from a producer (the bytes travel untouched)
    NOOP = 1  # the empty entry a new leader appends to commit its term
    CONFIG = 2  # a membership configuration (voters, learners)
    CONTROL = 3  # other internal batches (transaction markers, etc.), skipped by fetch


@dataclass(slots=True)
class Entry:
    """One log entry. It occupies the offsets index .. index + count - 1.

    The Raft index space is the partition offset space: an entry holding a batch of
    n records takes n consecutive offsets, so `index` is the batch's base offset.
    An entry is never changed once made.
    """

    index: int
    term: int
    kind: EntryKind = EntryKind.DATA
    data: bytes = b""
    count: int = 1
    # index + count - 1, computed once: read about twenty times per entry on a leader's
    # write path, where a property cost a call each time.
    last_index: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.last_index = self.index + self.count - 1


@dataclass(slots=True)
class HardState:
    """State that must be durable before any message depending on it leaves the node."""

    term: int = 0
    vote: int | None = None
    commit: int = -1  # offsets start at 0; -1 means nothing committed


@dataclass(slots=True)
class SnapshotMeta:
    """The point below which the log was trimmed: last included offset and its term.

    `voters`/`learners` are the membership in force at that point. Index -1 means never trimmed.
    """

    index: int = -1
    term: int = 0
    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()


class MessageType(IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    APPEND = 5
    APPEND_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAPSHOT = 9  # carries SnapshotMeta; the runtime ships the state out of band
    SNAPSHOT_RESP = 10
    TIMEOUT_NOW = 11  # leadership transfer: campaign immediately
    READ_INDEX = 12  # a follower asks the leader for a read barrier
    READ_INDEX_RESP = 13


@dataclass(slots=True)
class Message:
    """A message between two replicas of one group. Field meanings follow the Raft paper.

    `group` is filled by the runtime (the core ignores it); one connection carries
    every group's messages between a node pair.
    """

    type: MessageType
    src: int
    dst: int
    term: int
    group: str = ""
    # APPEND: prev log position, entries, leader commit. (PRE_)VOTE: candidate's last offset/term.
    # APPEND_RESP: log_index = last offset now durable on the follower (success) or the rejected
    # prev offset (reject). READ_INDEX_RESP: log_index = the read index. SNAPSHOT_RESP (sent by
    # the leader's runtime to its own core): log_index = snapshot index, reject = shipping failed.
    # HEARTBEAT: commit = min(follower's match, leader commit), never entries.
    log_index: int = 0
    log_term: int = 0
    entries: list[Entry] = field(default_factory=list)
    commit: int = 0
    # *_RESP: rejection and hints for fast conflict backtracking.
    reject: bool = False
    reject_hint: int = 0  # APPEND_RESP: last follower offset whose term <= the probed term
    hint_term: int = 0  # APPEND_RESP: term of the follower's entry at reject_hint (0: none)
    # SNAPSHOT
    snapshot: SnapshotMeta | None = None
    # READ_INDEX / HEARTBEAT: opaque request context echoed back. VOTE: b"transfer" marks a
    # leadership-transfer campaign, which voters grant even while they have a live leader.
    context: bytes = b""


@dataclass(slots=True)
class ReadState:
    """A confirmed read barrier: reads at `context` may be served once applied >= index."""

    index: int
    context: bytes


@dataclass(slots=True)
class Ready:
    """Everything the driver must do after feeding the core, in this order:

    1. persist `entries` (an entry at index i replaces every stored offset >= i) and
       `hard_state` if set; fsync if `must_sync`; install `snapshot` if set;
    2. send `messages`;
    3. apply `committed` entries (in order) and deliver `read_states`;
    4. call `advance(ready)`.

    The core never hands out `snapshot` and `entries` in the same Ready. `must_sync` is False
    when only the commit index changed: it is re-learned from the leader after a crash.
    Messages may depend on everything persisted in step 1, never on anything later.
    """

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: SnapshotMeta | None = None
    messages: list[Message] = field(default_factory=list)
    committed: list[Entry] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    must_sync: bool = False
    # Volatile facts for the runtime (leader known, role); never persisted.
    leader: int | None = None
    role: str = "follower"
    number: int = 0  # its place in the order the core handed Readys out (and takes advances)

    def is_empty(self) -> bool:
        return not (
            self.hard_state
            or self.entries
            or self.snapshot
            or self.messages
            or self.committed
            or self.read_states
        )


class LogView(Protocol):
    """The core's read-only view of durable storage. The segment log and the simulator's
    in-memory log implement it; the core never writes through it (it emits Ready.entries).
    """

    def first_index(self) -> int:
        """Lowest offset still stored (snapshot index + 1 after trimming)."""
        ...

    def last_index(self) -> int:
        """Last stored offset, or the snapshot index when empty (-1 for a new log)."""
        ...

    def term_at(self, index: int) -> int | None:
        """Term of the entry covering `index`; the snapshot term at the snapshot index;
        None when `index` is outside [snapshot index, last_index]."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries whose offsets lie in [lo, hi], `lo` at an entry boundary, stopping once
        `max_bytes` of data is reached (always at least one entry)."""
        ...

    def snapshot_meta(self) -> SnapshotMeta:
        """The current trim point (index -1, term 0 when the log was never trimmed)."""
        ...
