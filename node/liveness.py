"""How long a silent peer may stay silent before its link counts as dead, given this node's stalls.

Owns the dead-after window: a base, widened by the longest recent stall of the node's own loop.
"""

from __future__ import annotations

from collections import deque

# Stalls are remembered this long: the collector's full collections and CPU starvation recur
# over tens of seconds, so the widened window must outlast the gap between two of them.
STALL_MEMORY_S = 60.0
# A peer's silence as seen here is its own stall plus this node's late read: both nodes share
# the machine's starvation, so the window widens by twice the longest stall seen here.
STALL_FACTOR = 2.0
# Widening stops here (a window of at most three times the base): a peer that is really gone
# must still be declared dead within seconds; the p100k run's longest collector pause was 1.35 s.
MAX_WIDENING_S = 2.0


class DeadAfterWindow:
    """The silence after which a peer counts as dead: `base_s` on a node whose loop runs on time,
    up to `base_s + MAX_WIDENING_S` on one whose loop stalled within the last STALL_MEMORY_S.

    On a starved node, a tick timer that fires late also reads its sockets late, and its peers
    (starved alike) send late: a fixed window then declared links dead that were only slow,
    and each such loss woke every group the peer leads. A node that runs on time keeps the
    base window, so a dead peer is noticed as fast as before."""

    def __init__(self, base_s: float, tick_s: float) -> None:
        self.base_s = base_s
        self.tick_s = tick_s
        # (when, stall) with stalls strictly decreasing: the front is the longest remembered
        self._stalls: deque[tuple[float, float]] = deque()

    def observe_tick(self, now: float, since_last_tick: float) -> None:
        """A tick ran `since_last_tick` seconds after the previous one."""
        stall = since_last_tick - self.tick_s
        stalls = self._stalls
        if stall > 0:
            while stalls and stalls[-1][1] <= stall:
                stalls.pop()
            stalls.append((now, stall))
        while stalls and now - stalls[0][0] > STALL_MEMORY_S:
            stalls.popleft()

    def longest_stall(self) -> float:
        return self._stalls[0][1] if self._stalls else 0.0

    def seconds(self) -> float:
        return self.base_s + min(MAX_WIDENING_S, STALL_FACTOR * self.longest_stall())
