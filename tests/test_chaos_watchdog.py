"""The chaos run's overall time bound: a hung run names where it waits, cleans up and exits."""

from __future__ import annotations

import asyncio
import io
import threading

from raftline.chaos.watchdog import HUNG_EXIT, Watchdog


def test_a_run_that_outlives_its_bound_prints_its_waiting_tasks_cleans_up_and_exits_3() -> None:
    out = io.StringIO()
    cleaned = threading.Event()
    exits: list[int] = []
    watchdog = Watchdog(0.2, cleaned.set, out=out, exit=exits.append)

    async def waits_for_a_reply_that_never_comes() -> None:
        await asyncio.Event().wait()

    async def run() -> None:
        watchdog.watch_loop(asyncio.get_running_loop())
        stuck = asyncio.create_task(waits_for_a_reply_that_never_comes(), name="stuck-client")
        await asyncio.to_thread(watchdog.fired.wait, 5)
        await asyncio.to_thread(cleaned.wait, 5)
        stuck.cancel()

    watchdog.start()
    asyncio.run(run())
    assert exits == [HUNG_EXIT]
    assert cleaned.is_set()
    dump = out.getvalue()
    assert "outlived its bound of 0 s" in dump
    assert "task stuck-client" in dump and "waits_for_a_reply_that_never_comes" in dump


def test_a_run_that_ends_within_its_bound_is_left_alone() -> None:
    exits: list[int] = []
    watchdog = Watchdog(0.2, lambda: exits.append(-1), out=io.StringIO(), exit=exits.append)
    watchdog.start()
    watchdog.stop()
    assert not watchdog.fired.wait(0.5)
    assert exits == []
