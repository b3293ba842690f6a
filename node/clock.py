"""The node's wall clock: message timestamps, log append time, retention and segment age.

Owns the offset that test hooks set to simulate clock skew; timers use time.monotonic, never this.
"""

from __future__ import annotations

import time

MAX_OFFSET_MS = 10 * 365 * 24 * 3600 * 1000  # a skew beyond ten years is a typo, not a test


class WallClock:
    """Real wall-clock time shifted by `offset_ms` (0 unless a test hook set it)."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    def set_offset_ms(self, offset_ms: object) -> None:
        """Shift the clock by `offset_ms` from real time; 0 restores it. ValueError on bad input."""
        if type(offset_ms) is not int or abs(offset_ms) > MAX_OFFSET_MS:
            raise ValueError(f"offset_ms must be an integer within ±{MAX_OFFSET_MS}")
        self.offset_ms = offset_ms
