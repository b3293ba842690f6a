"""A leader's view of one follower's replication: matched offset, next offset and flow control.

Owns the probe / replicate / snapshot states and the in-flight window of pipelined APPENDs,
bounded in messages and in bytes.
"""

from __future__ import annotations

from collections import deque
from enum import Enum


class ProgressState(Enum):
    PROBE = "probe"  # next is a guess: one APPEND at a time until the follower answers
    REPLICATE = "replicate"  # next is known: pipeline APPENDs up to max_inflight(_bytes)
    SNAPSHOT = "snapshot"  # needed entries are trimmed: wait for the snapshot to land


class Progress:
    """Replication state of one follower (or learner) as seen by the leader."""

    __slots__ = (
        "inflight",
        "inflight_bytes",
        "match",
        "max_inflight",
        "max_inflight_bytes",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "snapshot_ticks",
        "state",
    )

    def __init__(self, next_index: int, max_inflight: int, max_inflight_bytes: int) -> None:
        self.match = -1  # highest offset known durable on the follower
        self.next = next_index  # first offset to send next
        self.state = ProgressState.PROBE
        self.probe_sent = False
        # (last offset, entry bytes) of each unacknowledged APPEND
        self.inflight: deque[tuple[int, int]] = deque()
        self.inflight_bytes = 0
        self.max_inflight = max_inflight
        self.max_inflight_bytes = max_inflight_bytes
        self.pending_snapshot = -1
        self.snapshot_ticks = 0
        self.recent_active = False

    def paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return (
                len(self.inflight) >= self.max_inflight
                or self.inflight_bytes >= self.max_inflight_bytes
            )
        return True

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            # The snapshot may have landed: probe right after it rather than re-send it.
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self._reset(ProgressState.PROBE)

    def become_replicate(self) -> None:
        self.next = self.match + 1
        self._reset(ProgressState.REPLICATE)

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.inflight.clear()
        self.inflight_bytes = 0
        self.pending_snapshot = -1
        self.snapshot_ticks = 0

    def sent(self, last_index: int, size: int) -> None:
        """An APPEND carrying entries (`size` bytes of them) through last_index left for this
        follower."""
        if self.state is ProgressState.REPLICATE:
            self.next = last_index + 1
            self.inflight.append((last_index, size))
            self.inflight_bytes += size
        else:
            self.probe_sent = True

    def free_one(self) -> None:
        """Count the oldest APPEND in flight as gone (it may have been lost)."""
        _, size = self.inflight.popleft()
        self.inflight_bytes -= size

    def acknowledged(self, index: int) -> bool:
        """The follower has durably everything through index. Returns whether match grew."""
        while self.inflight and self.inflight[0][0] <= index:
            self.free_one()
        self.probe_sent = False
        if index <= self.match:
            return False
        self.match = index
        self.next = max(self.next, index + 1)
        return True

    def rejected(self, rejected: int, next_probe: int) -> bool:
        """The follower refused an APPEND whose previous offset was `rejected`.

        `next_probe` is the leader's best guess of the last matching offset from the hints.
        Returns False for a stale rejection (an answer to an APPEND already superseded).
        """
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.become_probe()
        elif self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, next_probe + 1), self.match + 1)
        self.probe_sent = False
        return True
