"""The metadata group's replica on every node, and the controller duties of its leader.

Owns command encoding (one JSON record per batch), apply results for proposers, leader balancing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
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
) -> list[tuple[str, int, int]]:
    """(group, current leader, preferred leader) for partitions whose preferred replica (the
    first, placed evenly by `place_replicas`) is alive but not leading, and whose leadership
    has been stable for `settle_s`."""
    moves = []
    for topic in state.topics.values():
        for partition, replicas in enumerate(topic.replicas):
            group = topic.group(partition)
            current, preferred = leader_of(group), replicas[0]
            if current is None or current == preferred or not (alive(current) and alive(preferred)):
                continue
            if now - last_change.get(group, 0.0) < settle_s:
                continue
            moves.append((group, current, preferred))
            if len(moves) >= MAX_MOVES_PER_ROUND:
                return moves
    return moves
