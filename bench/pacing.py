"""Coordinated-omission-safe pacing: every message has an intended send time fixed in advance.

Owns the fixed-rate schedule, the payload header that carries the intended time, and latencies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# Intended send time (CLOCK_MONOTONIC ns, shared by every process on the host) and sequence.
HEADER = struct.Struct("<qq")
NS_PER_S = 1_000_000_000


def encode(intended_ns: int, sequence: int, padding: bytes) -> bytes:
    """A payload of len(padding) bytes whose first 16 carry the intended send time and sequence."""
    return HEADER.pack(intended_ns, sequence) + padding[HEADER.size :]


def intended_ns_of(payload: bytes) -> int:
    """The intended send time a payload was stamped with."""
    if len(payload) < HEADER.size:
        raise ValueError(f"payload of {len(payload)} bytes carries no benchmark header")
    return HEADER.unpack_from(payload)[0]


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
