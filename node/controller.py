"""The metadata group's replica on every node, and the controller duties of its leader.

Owns command encoding (one JSON record per batch), apply results for proposers, leader balancing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from raftline.node.errors import BrokerError, OutcomeUnknown
from raftline.node.metadata import MetadataError, MetadataState
from raftline.raftlog.records import Record, build_batch, decode_batch
from raftline.raftlog.types import Entry, EntryKind

MAX_MOVES_PER_ROUND = 8  # leadership transfers the controller starts per balancing round


def encode_command(command: dict[str, Any]) -> bytes:
    """A metadata command as a one-record batch, so the metadata log is an ordinary segment log."""
    return build_batch([Record(value=json.dumps(command, sort_keys=True).encode())])


def decode_command(data: bytes) -> dict[str, Any]:
    value = decode_batch(data).records[0].value
    try:
        command = json.loads(value or b"")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataError("invalid_request", f"undecodable metadata command: {exc}") from exc
    if not isinstance(command, dict):
        raise MetadataError("invalid_request", "a metadata command is a JSON object")
    return command


class MetaReplica:
    """Applies committed metadata commands and hands each proposer its command's result."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.state = MetadataState()
        self.role = "follower"
        self.leader: int | None = None
        self.term = 0
        self.leader_since = time.monotonic()
        self._on_change = on_change
        self._waiters: dict[int, tuple[int, asyncio.Future[dict[str, Any]]]] = {}

    def expect(self, index: int, term: int) -> asyncio.Future[dict[str, Any]]:
        """A future for the result of the command accepted at (index, term)."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[index] = (term, fut)
        return fut

    def on_commit(self, entries: list[Entry]) -> None:
        for entry in entries:
            outcome: dict[str, Any] | MetadataError | None = None
            if entry.kind == EntryKind.DATA:
                try:
                    outcome = self.state.apply(decode_command(entry.data))
                except MetadataError as exc:
                    outcome = exc
            waiter = self._waiters.pop(entry.index, None)
            if waiter is not None and not waiter[1].done():
                term, fut = waiter
                if entry.term != term:
                    fut.set_exception(_lost())
                elif isinstance(outcome, MetadataError):
                    fut.set_exception(BrokerError(outcome.code, outcome.message))
                else:
                    fut.set_result(outcome or {})
        last = entries[-1].last_index
        for index in [i for i in self._waiters if i <= last]:
            _, fut = self._waiters.pop(index)
            if not fut.done():
                fut.set_exception(_lost())
        self._on_change()

    def on_role(self, role: str, leader: int | None, term: int) -> None:
        if role == "leader" and self.role != "leader":
            self.leader_since = time.monotonic()
        if role != "leader":
            # A controller that stepped down answers its proposers now; a command of theirs
            # may still commit under the next controller, so the outcome is unknown.
            waiters, self._waiters = self._waiters, {}
            for _, fut in waiters.values():
                if not fut.done():
                    fut.set_exception(
                        OutcomeUnknown("the controller stepped down before the command committed")
                    )
        self.role, self.leader, self.term = role, leader, term


def _lost() -> BrokerError:
    return BrokerError("leader_unavailable", "the controller changed before the command committed")


def leadership_moves(
    state: MetadataState,
    leader_of: Callable[[str], int | None],
    alive: Callable[[int], bool],
    last_change: dict[str, float],
    now: float,
    settle_s: float,
    groups: Iterable[str] | None = None,
) -> list[tuple[str, int, int]]:
    """(group, current leader, preferred leader) for partitions (all, or those of `groups`)
    whose preferred replica (the first, placed evenly by `place_replicas`) is alive but not
    leading, and whose leadership has been stable for `settle_s`."""
    moves = []
    for group, replicas in _replica_sets(state, groups):
        current, preferred = leader_of(group), replicas[0]
        if current is None or current == preferred or not (alive(current) and alive(preferred)):
            continue
        if now - last_change.get(group, 0.0) < settle_s:
            continue
        moves.append((group, current, preferred))
        if len(moves) >= MAX_MOVES_PER_ROUND:
            return moves
    return moves


def _replica_sets(
    state: MetadataState, groups: Iterable[str] | None
) -> Iterator[tuple[str, list[int]]]:
    if groups is None:
        for topic in state.topics.values():
            for partition, replicas in enumerate(topic.replicas):
                yield topic.group(partition), replicas
        return
    for group in groups:
        if (replicas := state.replicas_of_group(group)) is not None:
            yield group, replicas


class LeaderWatch:
    """When each group's leader last changed as this node saw it, and the groups that may be
    away from their preferred leader. Fed by the runtime's leader-view events, so that an idle
    node with many partitions does no per-partition work: balancing looks only at groups
    whose leader changed and that are not back on their preferred replica yet."""

    def __init__(self) -> None:
        self.last_change: dict[str, float] = {}
        self._leaders: dict[str, int | None] = {}
        self.candidates: set[str] = set()

    def saw(self, group: str, leader: int | None, now: float) -> None:
        if self._leaders.get(group) != leader or group not in self._leaders:
            self._leaders[group] = leader
            self.last_change[group] = now
        self.candidates.add(group)

    def moved(self, group: str, now: float) -> None:
        """A transfer started: the group counts as freshly changed (no second move meanwhile)."""
        self.last_change[group] = now

    def moves(
        self,
        state: MetadataState,
        leader_of: Callable[[str], int | None],
        alive: Callable[[int], bool],
        now: float,
        settle_s: float,
    ) -> list[tuple[str, int, int]]:
        """leadership_moves over the candidates; drops those on their preferred leader and
        those of deleted topics."""
        for group in list(self.candidates):
            replicas = state.replicas_of_group(group)
            if replicas is None or leader_of(group) == replicas[0]:
                self.candidates.discard(group)
                if replicas is None:
                    self.last_change.pop(group, None)
                    self._leaders.pop(group, None)
        return leadership_moves(
            state, leader_of, alive, self.last_change, now, settle_s, self.candidates
        )
