"""Diagnostic, not a benchmark: three `raftline serve` nodes (bench.peers.RaftlinePeer), 500 msg/s
of 1 KB for 4 s into a queue over 4 partitions, 8 receive-then-ack loops. Prints how many
messages were not acknowledged 8 s after the last publish, the ack errors by code, and the
records received twice: whether a later delivery came while the first one's lock was held or
after an ok ack of the record.

Run: PYTHONPATH=. .venv/bin/python -m bench.queue_diag
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from bench import positionals
from bench.drivers.base import Endpoint
from bench.drivers.raftline import RaftlineDriver
from bench.pacing import encode
from bench.peers import RaftlinePeer

RATE_BATCHES = 20  # batches of 25 per second: 500 msg/s
BATCHES = 80
LOOPS = 8


async def diagnose(endpoint: Endpoint) -> dict[str, Any]:
    producer, consumer = RaftlineDriver(endpoint), RaftlineDriver(endpoint)
    await producer.connect()
    await consumer.connect()
    await producer.create_queue("qd", 4)
    queue = consumer.client.queue("qd-q", max_messages=1000, wait_ms=500)
    errors: collections.Counter[str] = collections.Counter()
    events: dict[tuple[int, int], list[tuple[str, float, bool]]] = collections.defaultdict(list)
    acked: set[bytes] = set()
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            try:
                messages = await queue.receive()
                received = time.monotonic()
                held = await queue.ack(messages) if messages else []
            except Exception as error:  # a diagnostic: count it and go on
                errors[f"call: {type(error).__name__}"] += 1
                continue
            done = time.monotonic()
            for m, ok in zip(messages, held, strict=True):
                events[(m.partition, m.offset)].append(("receive", received, True))
                events[(m.partition, m.offset)].append(("ack", done, ok))
                if ok:
                    acked.add(bytes(m.value or b""))
                else:
                    errors[f"ack result: {m.error}"] += 1

    loops = [asyncio.create_task(loop()) for _ in range(LOOPS)]
    sent: set[bytes] = set()
    started = time.monotonic()
    publishes = []
    for i in range(BATCHES):
        batch = [encode(i * 25 + k + 1, b"x" * 1016) for k in range(25)]
        publishes.append(asyncio.ensure_future(producer.publish("qd", i % 4, batch, "all")))
        sent.update(bytes(b) for b in batch)
        await asyncio.sleep(max(0.0, started + (i + 1) / RATE_BATCHES - time.monotonic()))
    await asyncio.gather(*publishes)
    end = time.monotonic()
    while time.monotonic() - end < 8 and not sent <= acked:
        await asyncio.sleep(0.1)
    twice: collections.Counter[str] = collections.Counter()
    for evs in events.values():
        receives = [t for kind, t, _ in evs if kind == "receive"]
        if len(receives) > 1:
            first_ok = min((t for kind, t, ok in evs if kind == "ack" and ok), default=None)
            late = first_ok is not None and max(receives) > first_ok
            twice["after an ok ack" if late else "while the first lock was held"] += 1
    stop.set()
    await asyncio.wait(loops, timeout=3)
    return {
        "sent": len(sent),
        "not_acked_8s_after": len(sent - acked),
        "errors": dict(errors),
        "received_twice": dict(twice),
        "queue": await producer.client.queue("qd-q").describe(),
    }


if __name__ == "__main__":
    positionals.parse("bench.queue_diag", __doc__, [])
    peer = RaftlinePeer(3)
    try:
        print(asyncio.run(diagnose(peer.start())))
    finally:
        peer.stop()
