"""A leader's pending read barriers (ReadIndex): reads waiting for a heartbeat quorum.

Owns the FIFO of reads, each under a token of the leader's own (what heartbeats carry),
who confirmed each, and reads parked until the leader has committed an entry of its own term.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class PendingRead:
    index: int  # the leader's commit index when the read arrived
    requester: int  # node that asked (the leader itself or a follower)
    context: bytes  # the requester's name for the read, unique among its own pending reads
    acks: set[int]


class ReadIndexQueue:
    """Reads in arrival order. Confirming one confirms every earlier one: the heartbeat round
    that proved leadership for it left after all of them were recorded.

    Requesters name their reads independently, so two nodes may pick the same context: a read
    is known by (requester, context), and heartbeats carry a token the leader made for it."""

    __slots__ = ("_made", "_order", "_parked", "_reads", "_tokens")

    def __init__(self) -> None:
        self._reads: dict[bytes, PendingRead] = {}  # by token
        self._tokens: dict[tuple[int, bytes], bytes] = {}  # (requester, context) -> token
        self._order: deque[bytes] = deque()
        self._parked: list[tuple[int, bytes]] = []
        self._made = 0  # tokens made by this core; answers of earlier terms never reach it

    def pending(self, requester: int, context: bytes) -> bool:
        return (requester, context) in self._tokens

    def newest_token(self) -> bytes:
        """Token to piggyback on the next heartbeat (b"" when nothing waits)."""
        return self._order[-1] if self._order else b""

    def add(self, index: int, requester: int, context: bytes) -> bytes:
        """Record a read; return the token that heartbeats and their responses carry for it."""
        self._made += 1
        token = self._made.to_bytes(8, "big")
        self._reads[token] = PendingRead(index, requester, context, set())
        self._tokens[(requester, context)] = token
        self._order.append(token)
        return token

    def ack(
        self, peer: int, token: bytes, is_quorum: Callable[[set[int]], bool]
    ) -> list[PendingRead]:
        """Record a confirmation; return the reads it releases (oldest first)."""
        read = self._reads.get(token)
        if read is None:
            return []
        read.acks.add(peer)
        if not is_quorum(read.acks):
            return []
        released = []
        while self._order:
            oldest = self._order.popleft()
            done = self._reads.pop(oldest)
            del self._tokens[(done.requester, done.context)]
            released.append(done)
            if oldest == token:
                break
        return released

    def park(self, requester: int, context: bytes) -> None:
        """Hold a read until the leader commits an entry of its term (its commit may lag)."""
        self._parked.append((requester, context))

    def unpark(self) -> list[tuple[int, bytes]]:
        parked, self._parked = self._parked, []
        return parked

    def has_parked(self) -> bool:
        return bool(self._parked)

    def clear(self) -> None:
        """Leadership is lost: pending reads are dropped (the requester times out and retries)."""
        self._reads.clear()
        self._tokens.clear()
        self._order.clear()
        self._parked.clear()
