"""A leader's pending read barriers (ReadIndex): reads waiting for a heartbeat quorum.

Owns the FIFO of reads keyed by context, who confirmed each, and reads parked until the leader
has committed an entry of its own term.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class PendingRead:
    index: int  # the leader's commit index when the read arrived
    requester: int  # node that asked (the leader itself or a follower)
    context: bytes
    acks: set[int]


class ReadIndexQueue:
    """Reads in arrival order. Confirming one confirms every earlier one: the heartbeat round
    that proved leadership for it left after all of them were recorded."""

    __slots__ = ("_order", "_parked", "_reads")

    def __init__(self) -> None:
        self._reads: dict[bytes, PendingRead] = {}
        self._order: deque[bytes] = deque()
        self._parked: list[tuple[int, bytes]] = []

    def __contains__(self, context: bytes) -> bool:
        return context in self._reads

    def newest_context(self) -> bytes:
        """Context to piggyback on the next heartbeat (b"" when nothing waits)."""
        return self._order[-1] if self._order else b""

    def add(self, index: int, requester: int, context: bytes) -> None:
        self._reads[context] = PendingRead(index, requester, context, set())
        self._order.append(context)

    def ack(
        self, peer: int, context: bytes, is_quorum: Callable[[set[int]], bool]
    ) -> list[PendingRead]:
        """Record a confirmation; return the reads it releases (oldest first)."""
        read = self._reads.get(context)
        if read is None:
            return []
        read.acks.add(peer)
        if not is_quorum(read.acks):
            return []
        released = []
        while self._order:
            done = self._reads.pop(self._order.popleft())
            released.append(done)
            if done.context == context:
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
        self._order.clear()
        self._parked.clear()
