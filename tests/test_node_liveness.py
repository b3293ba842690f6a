"""The dead-after window of node-pair links: the base on a node that runs on time, wider while
the node's own loop has stalled recently, back to the base once the stalls are past."""

from __future__ import annotations

import pytest

from raftline.node.liveness import MAX_WIDENING_S, STALL_MEMORY_S, DeadAfterWindow


def _ticks(window: DeadAfterWindow, start: float, gaps: list[float]) -> float:
    now = start
    for gap in gaps:
        now += gap
        window.observe_tick(now, gap)
    return now


def test_a_node_whose_ticks_come_on_time_keeps_the_base_window() -> None:
    window = DeadAfterWindow(1.0, 0.05)
    _ticks(window, 0.0, [0.05] * 100)
    assert window.seconds() == 1.0


def test_the_window_widens_by_twice_the_longest_recent_stall() -> None:
    window = DeadAfterWindow(1.0, 0.05)
    _ticks(window, 0.0, [0.05, 0.35, 0.05, 0.25, 0.05])
    assert window.longest_stall() == pytest.approx(0.3)
    assert window.seconds() == pytest.approx(1.6)


def test_the_widening_is_capped_so_a_dead_peer_is_still_noticed() -> None:
    window = DeadAfterWindow(1.0, 0.05)
    _ticks(window, 0.0, [30.0])
    assert window.seconds() == 1.0 + MAX_WIDENING_S


def test_a_stall_is_forgotten_after_the_memory_and_the_next_longest_counts() -> None:
    window = DeadAfterWindow(1.0, 0.05)
    now = _ticks(window, 0.0, [0.55])  # a 0.5 s stall
    now = _ticks(window, now, [0.05] * 200 + [0.15])  # 10 s later, a 0.1 s one
    now = _ticks(window, now, [0.05] * int((STALL_MEMORY_S - 5) / 0.05))
    assert window.longest_stall() == pytest.approx(0.1)  # the 0.5 s one is past the memory
    _ticks(window, now, [0.05] * 200)
    assert window.seconds() == 1.0
