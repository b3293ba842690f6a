"""A fixed set of threads taking calls from one queue: the disk threads of a node's driver.

Owns the threads and their queue. `run` hands over a call that reports its own outcome (a
driver round's write wakes the loop itself), with no Future and no lock: one queue put.
`submit` is the Executor's, on the same threads (asyncio's run_in_executor: logs opened and
closed). ThreadPoolExecutor.submit cost about 14 Python calls of the loop per write, each
message's write on the leader and on every follower.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any

log = logging.getLogger(__name__)

_Call = tuple[Callable[..., Any], tuple[Any, ...]]


class CallThreads(Executor):
    """`size` daemon threads, started with the pool; calls run in the order handed over."""

    def __init__(self, size: int, name: str) -> None:
        self._queue: SimpleQueue[_Call | None] = SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on a thread of the pool; what it raises is only logged."""
        if self._closed:
            raise RuntimeError("cannot schedule new calls after shutdown")
        self._queue.put((fn, args))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        self.run(call)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let the threads finish what was handed over, then end (joined if `wait`)."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        while (call := self._queue.get()) is not None:
            fn, args = call
            try:
                fn(*args)
            except BaseException:
                log.exception("a call on %s failed", threading.current_thread().name)
