"""Consumers in their own process, so producing and consuming do not share one event loop.

Owns the child's loop (subscribe, count, report progress) and the parent's handle on it.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any, Protocol

from bench.drivers import driver_class
from bench.drivers.base import Endpoint
from bench.histogram import Histogram
from bench.pacing import Window
from bench.tally import Tally

COMMAND_POLL_S = 0.05  # how often the child looks for the parent's commands
READY_TIMEOUT_S = 60.0
RESULT_TIMEOUT_S = 30.0
# Collect the youngest generation after this many new container objects instead of 700.
GC_YOUNG_THRESHOLD = 50_000


def collect_garbage_rarely() -> None:
    """Set up a measuring process (producer or consumer, every system alike) for millions of
    short-lived objects a second: clients build several per message (records, futures,
    tuples), and with the default thresholds the cyclic collector then ran every 700 of
    them, over the whole heap, and took most of a consumer's time."""
    gc.freeze()  # what exists by now (modules, clients) lives on: never scan it again
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 100)


def consumer_main(
    system: str,
    endpoint: Endpoint,
    topics: list[str],
    partitions: int,
    conn: Connection,
    receivers: int = 0,
) -> None:
    """Child process entry point: consume every partition until told to stop (or, with
    `receivers`, that many queue receivers per topic receive and acknowledge)."""
    collect_garbage_rarely()
    try:
        import uvloop

        uvloop.run(_consume(system, endpoint, topics, partitions, conn, receivers))
    except ImportError:
        asyncio.run(_consume(system, endpoint, topics, partitions, conn, receivers))


async def _consume(
    system: str,
    endpoint: Endpoint,
    topics: list[str],
    partitions: int,
    conn: Connection,
    receivers: int = 0,
) -> None:
    tally = Tally(Window(0, 0))
    driver = driver_class(system)(endpoint)
    try:
        await asyncio.wait_for(driver.connect(), READY_TIMEOUT_S)
    except Exception as error:
        tally.on_error(error)
        conn.send(("result", _tally_dict(tally)))
        return
    stop = asyncio.Event()
    if receivers:
        tasks = [
            asyncio.create_task(
                driver.consume_queue(
                    t, partitions, tally.on_delivery, stop, tally.on_received, tally.on_ack_sent
                )
            )
            for t in topics
            for _ in range(receivers)
        ]
    else:
        tasks = [
            asyncio.create_task(driver.consume(t, p, tally.on_delivery, stop))
            for t in topics
            for p in range(partitions)
        ]
    conn.send(("ready",))
    while not stop.is_set() and not all(task.done() for task in tasks):
        serve_parent(conn, tally, stop)
        await asyncio.sleep(COMMAND_POLL_S)
    stop.set()
    _, pending = await asyncio.wait(tasks, timeout=5.0)
    for task in pending:
        task.cancel()
    for task in tasks:
        if task.done() and not task.cancelled() and (error := task.exception()) is not None:
            tally.on_error(error)
    try:
        await asyncio.wait_for(driver.close(), 10)
    except Exception as error:  # the counts matter more than a clean close
        tally.on_error(error)
    conn.send(("result", _tally_dict(tally)))


def serve_parent(conn: Connection, tally: Tally, stop: asyncio.Event) -> None:
    """Carry out the parent's commands. The child writes progress only when asked: the parent
    reads the pipe only while it waits for the child, and unread progress reports once filled
    the socket buffer within seconds and then blocked the consuming loop on `send`."""
    while conn.poll():
        command, *args = conn.recv()
        if command == "window":
            tally.window = Window(*args)
        elif command == "progress":
            conn.send(("progress", tally.received))
        elif command == "stop":
            stop.set()


def _tally_dict(tally: Tally) -> dict[str, Any]:
    return {
        "received": tally.received,
        "received_in_window": tally.received_in_window,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "e2e_latency": asdict(tally.e2e_latency),
        "received_latency": asdict(tally.received_latency),
        "ack_sent_latency": asdict(tally.ack_sent_latency),
    }


class Consumer(Protocol):
    """What a run needs of its consumer: ConsumerProcess, or bench.native.NativeConsumer."""

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> None: ...

    def send_window(self, window: Window) -> None: ...

    async def drain(self, target: int, timeout: float) -> None: ...

    async def stop(self) -> dict[str, Any]: ...


class ConsumerProcess:
    """The parent's handle: start, wait until subscribed, send the window, follow, collect."""

    def __init__(
        self,
        system: str,
        endpoint: Endpoint,
        topics: list[str],
        partitions: int,
        receivers: int = 0,
    ) -> None:
        context = multiprocessing.get_context("spawn")  # no fork from inside a running loop
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=consumer_main,
            args=(system, endpoint, topics, partitions, child, receivers),
            daemon=True,
        )
        self.received = 0
        self.result: dict[str, Any] | None = None
        self.started = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    async def start(self) -> None:
        self.process.start()
        self.started = True
        if not await self._until(lambda kind: kind == "ready", READY_TIMEOUT_S):
            error = (self.result or {}).get("first_error") or f"exit code {self.process.exitcode}"
            raise RuntimeError(f"consumer process did not subscribe: {error}")

    def send_window(self, window: Window) -> None:
        self.conn.send(("window", window.start_ns, window.end_ns))

    async def drain(self, target: int, timeout: float) -> None:
        """Follow progress until `target` messages arrived, the child ended, or time ran out."""
        deadline = time.monotonic() + timeout
        while self.received < target and (left := deadline - time.monotonic()) > 0:
            self.conn.send(("progress",))
            if not await self._until(lambda kind: kind == "progress", left):
                return

    async def stop(self) -> dict[str, Any]:
        """Stop the child and return its tally (received counts, errors, e2e histogram)."""
        if not self.started:
            raise RuntimeError("consumer process never started")
        if self.result is None and self.process.is_alive():
            self.conn.send(("stop",))
            await self._until(lambda _: self.result is not None, RESULT_TIMEOUT_S)
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        if self.result is None:
            raise RuntimeError(f"consumer process ended ({self.process.exitcode}) without result")
        return self.result

    async def _until(self, done: Callable[[str], bool], timeout: float) -> bool:
        """Read the child's messages until `done` holds for one; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while self.conn.poll():
                try:
                    kind, *args = self.conn.recv()
                except EOFError:
                    return False
                if kind == "progress":
                    self.received = args[0]
                elif kind == "result":
                    self.result = args[0]
                    self.received = self.result["received"]
                if done(kind):
                    return True
            if self.result is not None or not self.process.is_alive():
                return False
            await asyncio.sleep(0.02)
        return False


def merge_into(tally: Tally, result: dict[str, Any]) -> None:
    """Fold the child's counts and histogram into the parent's tally."""
    tally.received += result["received"]
    tally.received_in_window += result["received_in_window"]
    tally.errors += result["errors"]
    tally.first_error = tally.first_error or result["first_error"]
    tally.e2e_latency.merge(Histogram(**result["e2e_latency"]))
    tally.received_latency.merge(Histogram(**result["received_latency"]))
    tally.ack_sent_latency.merge(Histogram(**result["ack_sent_latency"]))
