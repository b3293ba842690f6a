"""Consumer groups through the Python client, on real `raftline serve` processes: how fast a group
drains a preloaded topic, and how long a rebalance takes as a member sees it.

Owns issue 14's client-side figures. Throughput: a 6-partition topic (replication 3 on 3 nodes)
is preloaded with N 100-byte messages, then a group of 1 and then of 3 members (separate
processes, each a GroupConsumer committing every second) reads it from the start; msgs/s is N
over the time from the members' start to the moment every partition has been consumed to its
end (rejoins at the start may deliver some messages twice: reported as `redelivered`).
Rebalance: with two members, seconds from one member's clean `close()` (commit, leave) to the
other's on_assign of the freed partitions; and from a SIGKILL of a member process (session
timeout 3 s) to the same. Prints one JSON object.
Usage: .venv/bin/python -m bench.groups [messages] [rounds]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import positionals
from bench.node_procs import running_nodes
from bench.positionals import Positional, positive_int
from raftline.clients.client import Client, GroupConsumer

PORT_BASE = 19300
PARTITIONS = 6
VALUE = b"x" * 100
CHUNK = 2000  # messages per produce request while preloading
CRASH_SESSION_MS = 3000
TopicPartition = tuple[str, int]


def preload(url: str, topic: str, count: int) -> dict[TopicPartition, int]:
    """`count` messages spread evenly over the partitions (count // PARTITIONS each); each
    partition's end offset."""
    with Client(url) as client:
        per = count // PARTITIONS
        for partition in range(PARTITIONS):
            for start in range(0, per, CHUNK):
                client.produce_batch(topic, partition, [VALUE] * min(CHUNK, per - start))
        described = client.describe_topic(topic)
    return {(topic, p["partition"]): p["high_watermark"] for p in described["partitions"]}


# ---- throughput ----------------------------------------------------------------------------


def member_loop(url: str, topic: str, group: str, reports: Any, stop: Any) -> None:
    """A member process: poll, and report (monotonic time, messages, consumed offsets) after
    every poll that brought something, until told to stop; then close (commit, leave)."""
    with Client(url) as client:
        consumer = client.consumer(
            topic,
            group=group,
            auto_offset_reset="earliest",
            auto_commit_interval_ms=1000,
            max_messages=2000,
            wait_ms=200,
        )
        while not stop.is_set():
            got = consumer.poll()
            if got:
                reports.put((time.monotonic(), len(got), dict(consumer.consumed)))
        consumer.close()


def drain(
    url: str, topic: str, group: str, members: int, ends: dict[TopicPartition, int], messages: int
) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    reports, stop = context.Queue(), context.Event()
    started = time.monotonic()
    processes = [
        context.Process(target=member_loop, args=(url, topic, group, reports, stop))
        for _ in range(members)
    ]
    for process in processes:
        process.start()
    reached: dict[TopicPartition, int] = {}
    delivered = 0
    finished = None
    deadline = started + 120
    try:
        while finished is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{members} member(s) did not drain the topic")
            try:
                at, count, consumed = reports.get(timeout=1.0)
            except queue.Empty:
                continue
            delivered += count
            for tp, offset in consumed.items():
                reached[tp] = max(reached.get(tp, 0), offset)
            if all(reached.get(tp, 0) >= end for tp, end in ends.items()):
                finished = at
    finally:
        stop.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    total = len(ends) * (messages // len(ends))
    seconds = finished - started
    return {
        "members": members,
        "messages": total,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(total / seconds),
        "redelivered": max(0, delivered - total),
    }


# ---- rebalance -----------------------------------------------------------------------------


class Watcher:
    """A member polling in a thread that notes when on_assign gives it partitions."""

    def __init__(self, url: str, topic: str, group: str) -> None:
        self.client = Client(url)
        self.assigned: list[tuple[float, list[TopicPartition]]] = []
        self.consumer: GroupConsumer = self.client.consumer(
            topic,
            group=group,
            on_assign=lambda parts: self.assigned.append((time.monotonic(), parts)),
            session_timeout_ms=10_000,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll()

    def holds(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.consumer.assignment) != count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the watcher holds {self.consumer.assignment}")
            time.sleep(0.01)

    def gained_after(self, moment: float, timeout: float = 30.0) -> float:
        """Seconds from `moment` to the on_assign that made it hold every partition."""
        self.holds(PARTITIONS, timeout)
        return max(at for at, _ in self.assigned) - moment

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()
        self.client.close()


def clean_leave(url: str, topic: str, group: str) -> float:
    watcher = Watcher(url, topic, group)
    try:
        watcher.holds(PARTITIONS)
        with Client(url) as client:
            other = client.consumer(topic, group=group, wait_ms=200)
            while len(other.assignment) != PARTITIONS // 2:
                other.poll()
            watcher.holds(PARTITIONS // 2)
            left_at = time.monotonic()
            other.close()
        return watcher.gained_after(left_at)
    finally:
        watcher.close()


def crash_member(url: str, topic: str, group: str, ready: Any) -> None:
    """A member process that polls until it is SIGKILLed."""
    with Client(url) as client:
        consumer = client.consumer(
            topic, group=group, wait_ms=200, session_timeout_ms=CRASH_SESSION_MS
        )
        while True:
            consumer.poll()
            if consumer.assignment:
                ready.set()


def crash(url: str, topic: str, group: str) -> float:
    watcher = Watcher(url, topic, group)
    context = multiprocessing.get_context("spawn")  # this process runs threads: no fork
    ready = context.Event()
    process = context.Process(target=crash_member, args=(url, topic, group, ready))
    try:
        watcher.holds(PARTITIONS)
        process.start()
        if not ready.wait(20):
            raise TimeoutError("the second member got no partitions")
        watcher.holds(PARTITIONS // 2)
        killed_at = time.monotonic()
        os.kill(process.pid, signal.SIGKILL)
        return watcher.gained_after(killed_at)
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        watcher.close()


def summary(times: list[float]) -> dict[str, float]:
    return {
        "min_s": round(min(times), 3),
        "median_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = positionals.parse(
        "bench.groups",
        __doc__,
        [Positional("messages", positive_int, 60_000), Positional("rounds", positive_int, 3)],
        argv,
    )
    messages, rounds = args.messages, args.rounds
    report: dict[str, Any] = {"nodes": 3, "partitions": PARTITIONS, "value_bytes": len(VALUE)}
    with tempfile.TemporaryDirectory() as root, running_nodes(Path(root), 3, PORT_BASE) as nodes:
        urls = ",".join(node.url for node in nodes.nodes)
        nodes.create_topic("drain", PARTITIONS)
        ends = preload(urls, "drain", messages)
        report["throughput"] = [
            drain(urls, "drain", f"drain-{n}", n, ends, messages) for n in (1, 3)
        ]
        nodes.create_topic("moves", PARTITIONS)
        leaves = [clean_leave(urls, "moves", f"leave-{i}") for i in range(rounds)]
        report["clean_leave"] = summary(leaves)
        crashes = [crash(urls, "moves", f"crash-{i}") for i in range(max(1, rounds - 1))]
        report["crash"] = {"session_timeout_ms": CRASH_SESSION_MS, **summary(crashes)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
