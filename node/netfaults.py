"""Test-only faults on outgoing node-to-node frames: delay with jitter, reordering, duplication.

Owns the fault parameters, their validation, and when each copy of a held frame is sent.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_DELAY_MS = 60_000  # longer holds only pile frames up in memory; use a partition instead
FIELDS = ("delay_ms", "jitter_ms", "reorder", "duplicate", "peers")


@dataclass(frozen=True)
class LinkFaults:
    """Frames to `peers` (None: every peer) wait delay_ms ± jitter_ms. With probability `reorder`
    a frame skips the wait and overtakes the frames held before it; with probability `duplicate`
    a second copy follows after its own delay."""

    delay_ms: float
    jitter_ms: float = 0.0
    reorder: float = 0.0
    duplicate: float = 0.0
    peers: frozenset[int] | None = None

    @classmethod
    def parse(cls, body: Any) -> LinkFaults | None:
        """The faults a hook body asks for, or None when it clears them ({} or delay_ms 0)."""
        if not isinstance(body, Mapping):
            raise ValueError("body must be a JSON object")
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown fields {unknown}; expected some of {list(FIELDS)}")
        delay = _number(body, "delay_ms", 0, MAX_DELAY_MS)
        if delay == 0:
            return None
        peers = body.get("peers")
        if peers is not None and (
            not isinstance(peers, list) or any(type(p) is not int for p in peers)
        ):
            raise ValueError("peers must be a list of node ids or null")
        return cls(
            delay_ms=delay,
            jitter_ms=_number(body, "jitter_ms", 0, delay),
            reorder=_number(body, "reorder", 0, 1),
            duplicate=_number(body, "duplicate", 0, 1),
            peers=None if peers is None else frozenset(peers),
        )

    def applies_to(self, peer: int) -> bool:
        return self.peers is None or peer in self.peers

    def send_delays_s(self, rng: random.Random, may_duplicate: bool) -> list[float]:
        """Seconds from now at which to send each copy of one frame (0: at once)."""
        copies = 2 if may_duplicate and rng.random() < self.duplicate else 1
        delays = []
        for _ in range(copies):
            if rng.random() < self.reorder:
                delays.append(0.0)
            else:
                jitter = rng.uniform(-self.jitter_ms, self.jitter_ms)
                delays.append((self.delay_ms + jitter) / 1000)
        return delays

    def describe(self) -> dict[str, Any]:
        return {
            "delay_ms": self.delay_ms,
            "jitter_ms": self.jitter_ms,
            "reorder": self.reorder,
            "duplicate": self.duplicate,
            "peers": None if self.peers is None else sorted(self.peers),
        }


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float:
    value = body.get(name, 0)
    if type(value) not in (int, float) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return float(value)
