"""What producers and consumers observed in one workload run, split by the measured window.

Owns the counting rules: rates by ack or receipt time, latencies by intended send time.
"""

from __future__ import annotations

import operator
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.histogram import Histogram
from bench.pacing import HEADER, StampGroup, Window, intended_ns_of, latency_us, stamp_of

_stamp_prefix = operator.itemgetter(slice(0, HEADER.size))


@dataclass
class Tally:
    """What producers and consumers observed during one workload run."""

    window: Window
    publish_latency: Histogram = field(default_factory=Histogram)
    e2e_latency: Histogram = field(default_factory=Histogram)
    # Queue workloads: to the moment the receiver has the message, before any acknowledgement
    # (e2e_latency there ends when the acknowledgement counts: see each driver's durability).
    received_latency: Histogram = field(default_factory=Histogram)
    # ... and to the moment the receiver sent its acknowledgement (before any confirmation).
    ack_sent_latency: Histogram = field(default_factory=Histogram)
    sent: int = 0
    acked: int = 0
    acked_in_window: int = 0
    received: int = 0
    received_in_window: int = 0
    errors: int = 0
    first_error: str = ""

    def on_acked(self, groups: list[StampGroup], ack_ns: int) -> None:
        """One acknowledged batch: its messages by intended time, each group weighted by size."""
        count = sum(n for _, n in groups)
        self.acked += count
        if ack_ns in self.window:
            self.acked_in_window += count
        for intended_ns, n in groups:
            if intended_ns in self.window:
                self.publish_latency.record(latency_us(intended_ns, ack_ns), n)

    def on_delivery(self, payloads: list[bytes]) -> None:
        now = time.monotonic_ns()
        self.received += len(payloads)
        if now in self.window:
            self.received_in_window += len(payloads)
        self._record(self.e2e_latency, payloads, now)

    def on_received(self, payloads: list[bytes]) -> None:
        """A queue receiver has these messages (not yet acknowledged): latency only."""
        self._record(self.received_latency, payloads, time.monotonic_ns())

    def on_ack_sent(self, payloads: list[bytes]) -> None:
        """A queue receiver sent the acknowledgement of these messages: latency only."""
        self._record(self.ack_sent_latency, payloads, time.monotonic_ns())

    def _record(self, histogram: Histogram, payloads: list[bytes], now: int) -> None:
        if len(payloads) == 1:  # push consumers deliver one message per call
            intended_ns = intended_ns_of(payloads[0])
            if intended_ns in self.window:
                histogram.record(latency_us(intended_ns, now))
            return
        # Many messages share a stamp: count equal stamp bytes (in C), unpack each one once.
        for prefix, count in Counter(map(_stamp_prefix, payloads)).items():
            intended_ns = stamp_of(prefix)
            if intended_ns in self.window:
                histogram.record(latency_us(intended_ns, now), count)

    def on_error(self, error: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(error).__name__}: {error}"[:300]
