"""Coordinated-omission-safe pacing: every message has an intended send time fixed in advance.

Owns the fixed-rate schedule, the stamp groups of a batch, the payload header and latencies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# Intended send time, CLOCK_MONOTONIC ns (shared by every process on the host).
HEADER = struct.Struct("<q")
NS_PER_S = 1_000_000_000
# At a fixed rate, intended times are stamped rounded down to this resolution. Messages of one
# slot then share a payload, so a batch costs a few packs instead of one per message. Rounding
# down can only add latency, and less than this.
STAMP_RESOLUTION_NS = 100_000

# One intended send time and how many messages of a batch carry it.
StampGroup = tuple[int, int]


def encode(intended_ns: int, padding: bytes) -> bytes:
    """A payload of len(padding) bytes whose first 8 carry the intended send time."""
    # A view of the padding: the payload is its only copy (a 1 MB one is built per message).
    return HEADER.pack(intended_ns) + memoryview(padding)[HEADER.size :]


def payloads(groups: list[StampGroup], padding: bytes) -> list[bytes]:
    """The payloads of a batch: for each group, `count` references to one stamped payload."""
    out: list[bytes] = []
    for intended_ns, count in groups:
        out += [encode(intended_ns, padding)] * count
    return out


def intended_ns_of(payload: bytes) -> int:
    """The intended send time a payload was stamped with."""
    if len(payload) < HEADER.size:
        raise ValueError(f"payload of {len(payload)} bytes carries no benchmark header")
    return HEADER.unpack_from(payload)[0]


def stamp_of(prefix: bytes) -> int:
    """The intended send time in a payload's first HEADER.size bytes (see intended_ns_of)."""
    if len(prefix) != HEADER.size:
        raise ValueError(f"payload of {len(prefix)} bytes carries no benchmark header")
    return HEADER.unpack(prefix)[0]


def latency_us(intended_ns: int, observed_ns: int) -> int:
    """Latency measured from the intended send time, so a stalled sender cannot hide its stall."""
    return max(0, observed_ns - intended_ns) // 1000


@dataclass(frozen=True)
class FixedRateSchedule:
    """Message i is due at start_ns + i / rate, whenever the sender actually gets to it."""

    start_ns: int
    rate: float

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"a fixed-rate schedule needs a positive rate, got {self.rate}")

    def intended_ns(self, index: int) -> int:
        return self.start_ns + int(index * NS_PER_S / self.rate)

    def due(self, now_ns: int) -> int:
        """How many messages (indices 0..n-1) are due by now_ns."""
        if now_ns < self.start_ns:
            return 0
        return int((now_ns - self.start_ns) * self.rate / NS_PER_S) + 1

    def stamp_groups(
        self, first: int, count: int, resolution_ns: int = STAMP_RESOLUTION_NS
    ) -> list[StampGroup]:
        """Messages first..first+count-1 grouped by intended time rounded down to resolution_ns.

        Every message's stamp is at most its intended time and less than resolution_ns before
        it; one group per slot, so the work grows with the slots a batch spans, not its size.
        """
        groups: list[StampGroup] = []
        index, end = first, first + count
        while index < end:
            offset = self.intended_ns(index) - self.start_ns
            stamp = self.start_ns + offset - offset % resolution_ns
            # Messages due before the next slot begins; at least this one.
            following = max(index + 1, min(end, self.due(stamp + resolution_ns - 1)))
            groups.append((stamp, following - index))
            index = following
        return groups


@dataclass(frozen=True)
class Window:
    """The measured interval: after warm-up, before the producers stop."""

    start_ns: int
    end_ns: int

    def __contains__(self, t_ns: int) -> bool:
        return self.start_ns <= t_ns < self.end_ns

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S
