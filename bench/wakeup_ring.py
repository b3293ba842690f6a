"""The machine's own wake-up tail: a token passed around a ring of idle processes over pipes.

Owns the ring probe that stands for the hand-offs one replicated produce and its fetch take
(producer -> leader loop -> follower loop -> follower disk thread -> follower loop -> leader
loop -> consumer: six wake-ups) with no work done at any of them, paced like the batches.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from bench.histogram import Histogram

HOPS = 6
TOKEN = b"t"


def _relay(read_fd: int, write_fd: int) -> None:
    while os.read(read_fd, 1):
        os.write(write_fd, TOKEN)


def ring_tail(laps_per_s: float, seconds: float, hops: int = HOPS) -> dict[str, Any]:
    """Send a token around `hops` processes (this one and hops - 1 relays) `laps_per_s` times a
    second for `seconds`; each lap counts from when it was due (a late lap delays the next)."""
    pipes = [os.pipe() for _ in range(hops)]
    fork = multiprocessing.get_context("fork")
    relays = [
        fork.Process(target=_relay, args=(pipes[i][0], pipes[i + 1][1]), daemon=True)
        for i in range(hops - 1)
    ]
    for relay in relays:
        relay.start()
    laps = Histogram()
    interval = 1 / laps_per_s
    try:
        due = time.monotonic() + 0.2
        end = due + seconds
        while due < end:
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            os.write(pipes[0][1], TOKEN)
            os.read(pipes[-1][0], 1)
            laps.record(int((time.monotonic() - due) * 1e6))
            due += interval
    finally:
        for relay in relays:  # each holds every pipe's ends: none would see an end of file
            relay.terminate()
            relay.join(timeout=5)
        for read_fd, write_fd in pipes:
            os.close(read_fd)
            os.close(write_fd)
    return {"hops": hops, "laps_per_s": laps_per_s, "lap_ms": laps.summary_ms()}
