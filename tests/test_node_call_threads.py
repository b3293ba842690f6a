"""node.call_threads: the driver's disk threads, with a hand-off that needs no Future."""

from __future__ import annotations

import asyncio
import threading

import pytest

from raftline.node.call_threads import CallThreads


def test_run_hands_a_call_to_a_pool_thread() -> None:
    pool = CallThreads(2, "test-calls")
    ran = threading.Event()
    names: list[str] = []

    def call(tag: str) -> None:
        names.append(f"{tag} on {threading.current_thread().name}")
        ran.set()

    pool.run(call, "first")
    assert ran.wait(5)
    pool.shutdown()
    assert names[0].startswith("first on test-calls_")


def test_a_failing_run_call_leaves_the_thread_working() -> None:
    pool = CallThreads(1, "test-calls")
    ran = threading.Event()

    def fail() -> None:
        raise ValueError("boom")

    pool.run(fail)
    pool.run(ran.set)
    assert ran.wait(5)
    pool.shutdown()


async def test_submit_serves_run_in_executor_with_results_and_errors() -> None:
    pool = CallThreads(2, "test-calls")
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(pool, sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        await loop.run_in_executor(pool, divmod, 1, 0)
    pool.shutdown()


def test_shutdown_waits_for_calls_handed_over_and_refuses_new_ones() -> None:
    pool = CallThreads(1, "test-calls")
    done: list[int] = []
    for i in range(3):
        pool.run(done.append, i)
    pool.shutdown(wait=True)
    assert done == [0, 1, 2]
    with pytest.raises(RuntimeError):
        pool.run(done.append, 3)
