"""The whole run's time bound: a run that outlives the sum of its phases' bounds is ended.

Owns what a hang leaves behind: every thread's and every task's stack on stderr, then exit 3.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TextIO

HUNG_EXIT = 3  # apart from 1 (anomalies) and 2 (bad arguments, cluster errors)


class Watchdog:
    """Started before a run and stopped after it. If the run is still going `budget_s` later,
    prints where every thread and asyncio task waits (a hang in CI then names its place
    instead of eating the job's time), calls `cleanup` (the cluster's teardown) and exits."""

    def __init__(
        self,
        budget_s: float,
        cleanup: Callable[[], None],
        out: TextIO = sys.stderr,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.budget_s = budget_s
        self.cleanup = cleanup
        self.out = out
        self.exit = exit
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fired = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="chaos-watchdog", daemon=True)
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def watch_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The run's event loop, whose tasks a dump lists."""
        self.loop = loop

    def _watch(self) -> None:
        if self._stopped.wait(self.budget_s):
            return
        self.fired.set()
        print(
            f"chaos: the run outlived its bound of {self.budget_s:.0f} s; stacks follow",
            file=self.out,
            flush=True,
        )
        self.dump()
        try:
            self.cleanup()
        except Exception as failure:  # the exit below matters more than a clean teardown
            print(f"chaos: teardown after the hang failed: {failure}", file=self.out, flush=True)
        self.exit(HUNG_EXIT)

    def dump(self) -> None:
        """Every thread's stack, then every task's (read from this thread while the loop may be
        stuck: a diagnosis, so a task list that changes under it is tolerated)."""
        self.out.flush()
        try:
            faulthandler.dump_traceback(file=self.out, all_threads=True)
        except (AttributeError, ValueError, OSError):  # no file descriptor (a test's StringIO)
            for ident, frame in sys._current_frames().items():
                print(f"thread {ident}:", file=self.out)
                traceback.print_stack(frame, file=self.out)
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        for task in list(asyncio.all_tasks(loop)):
            print(f"task {task.get_name()}: {task.get_coro()!r}", file=self.out)
            task.print_stack(limit=12, file=self.out)
        self.out.flush()
