"""The log lines of Raft role changes: each one while they are few, a count per second when many.

Owns the budget of role-change lines a node writes. A failover's post-mortem needs who led what
and when, line by line; a node creating tens of thousands of partitions changes roles tens of
thousands of times, and a line each (formatted and written on the event loop) is a cost and a
log nobody reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

LINES_PER_S = 20  # role changes logged one by one per second; the others are counted


class RoleLog:
    def __init__(
        self,
        logger: logging.Logger,
        lines_per_s: int = LINES_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._lines_per_s = lines_per_s
        self._clock = clock
        self._window = clock()
        self._lines = 0  # written one by one in the current window
        self._counted = 0  # not written in the current window
        self._leaders = 0  # of those, changes to leader here

    def changed(
        self, name: str, role: str, term: int, leader: int | None, commit: int, last: int
    ) -> None:
        self.flush()
        if self._lines < self._lines_per_s:
            self._lines += 1
            self._log.info(
                "group %s: %s in term %d, leader %s, commit %d, last %d",
                name,
                role,
                term,
                leader,
                commit,
                last,
            )
            return
        self._counted += 1
        self._leaders += role == "leader"

    def flush(self) -> None:
        """Close the window once a second has passed: one line for the changes counted in it."""
        now = self._clock()
        if now - self._window < 1.0:
            return
        if self._counted:
            self._log.info(
                "%d more Raft role changes in %.1f s not logged one by one (%d to leader here)",
                self._counted,
                now - self._window,
                self._leaders,
            )
        self._window, self._lines, self._counted, self._leaders = now, 0, 0, 0
