"""What producers and consumers observed in one workload run, split by the measured window.

Owns the counting rules: rates by ack or receipt time, latencies by intended send time.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from bench.histogram import Histogram
from bench.pacing import Window, intended_ns_of, latency_us


@dataclass
class Tally:
    """What producers and consumers observed during one workload run."""

    window: Window
    publish_latency: Histogram = field(default_factory=Histogram)
    e2e_latency: Histogram = field(default_factory=Histogram)
    sent: int = 0
    acked: int = 0
    acked_in_window: int = 0
    received: int = 0
    received_in_window: int = 0
    errors: int = 0
    first_error: str = ""

    def on_acked(self, intended: list[int], ack_ns: int) -> None:
        self.acked += len(intended)
        if ack_ns in self.window:
            self.acked_in_window += len(intended)
        for intended_ns, count in Counter(intended).items():
            if intended_ns in self.window:
                self.publish_latency.record(latency_us(intended_ns, ack_ns), count)

    def on_delivery(self, payloads: list[bytes]) -> None:
        now = time.monotonic_ns()
        self.received += len(payloads)
        if now in self.window:
            self.received_in_window += len(payloads)
        # Messages of one batch share their intended time at max rate: record each time once.
        for intended_ns, count in Counter(map(intended_ns_of, payloads)).items():
            if intended_ns in self.window:
                self.e2e_latency.record(latency_us(intended_ns, now), count)

    def on_error(self, error: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(error).__name__}: {error}"[:300]
