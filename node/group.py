"""A Raft group as the driver holds it: its core, durable log, state machine and queued inputs.

Owns the per-group record the runtime feeds and the interfaces it needs from a group's storage
and replica; node/runtime.py drives it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from raftline.raftlog.raft import RaftNode
from raftline.raftlog.types import Entry, EntryKind, HardState, LogView, Message


class GroupStorage(LogView, Protocol):
    """What the driver needs from a group's durable log (raftlog.storage.RaftStorage)."""

    @property
    def hard_state(self) -> HardState: ...
    def append(self, entries: list[Entry]) -> Any: ...
    def save(self, hard_state: HardState) -> None: ...
    def install(self, meta: Any) -> Any: ...
    def trim(self, index: int, voters: tuple[int, ...], learners: tuple[int, ...]) -> Any: ...
    def retention_point(self) -> int: ...
    def fsync(self) -> None: ...
    def close(self) -> None: ...


class Replica(Protocol):
    """The state machine a group drives (a partition or the metadata)."""

    def on_commit(self, entries: list[Entry]) -> None: ...
    def on_role(self, role: str, leader: int | None, term: int) -> None: ...


Accepted = Callable[[int, int], None]


@dataclass(slots=True)
class Proposal:
    data: bytes
    count: int
    kind: EntryKind
    future: asyncio.Future[tuple[int, int]]
    on_accept: Accepted | None
    queued_at: float


@dataclass(eq=False)
class Group:
    name: str
    core: RaftNode
    storage: GroupStorage
    replica: Replica
    applied: int
    inbox: list[Message] = field(default_factory=list)
    notices: list[tuple[int, list[Any]]] = field(default_factory=list)
    proposals: list[Proposal] = field(default_factory=list)
    reads: list[tuple[bytes, asyncio.Future[None]]] = field(default_factory=list)
    pending_reads: dict[bytes, asyncio.Future[None]] = field(default_factory=dict)
    waiting_reads: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    ticks: int = 0
    campaign: bool = False
    campaign_pre_vote: bool = True
    transfer_to: int | None = None
    trim_to: int | None = None
    snapshot_state: tuple[int, bytes] | None = None  # (index, state) of a received snapshot
    quiet: bool = False
    waits_for: int | None = None  # a fresh follower's expected first leader (see Runtime.add_group)
    woken_by_link: int | None = None  # the node whose link loss woke this quiet group
    idle_ticks: int = 0
    inbox_since: float | None = None  # when the oldest APPEND in the inbox arrived
    # a leader's rounds with entries not yet applied: (last index, fed at), oldest first
    uncommitted: deque[tuple[int, float]] = field(default_factory=deque)
    role: str = "follower"
    leader: int | None = None
    term: int = 0

    def peers(self, me: int) -> set[int]:
        return set(self.core.voters | self.core.learners) - {me}
