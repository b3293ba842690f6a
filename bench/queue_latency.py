"""Diagnostic, not a benchmark: where the time of one queue message goes. Three `raftline serve`
nodes (bench.peers.RaftlinePeer, RF 3, fsync always), a queue over 4 partitions, LOOPS waiting
receive-then-ack loops (LOOPS 0: one pushed stream, prefetch 1,000 per partition, each frame
acked at once, as the bench driver consumes); one message of 1 KB every GAP seconds (PER
messages per send). Per message: publish ack (the produce commit), sent to received (tail
wake-up, delivery-count commit, forwards), publish ack to received (what the queue adds after
the produce commit), received to acked (the settle commit and forwards), end to end; and the
CPU time the three node processes spent per acknowledged message (user + system, from /proc),
which a busy machine delays but does not inflate the way it inflates latencies; and the probe
process's own (its producer and its receivers: what the client spends).

Run: PYTHONPATH=. .venv/bin/python -m bench.queue_latency [messages] [loops] [gap_s] [per_send]
"""

from __future__ import annotations

import asyncio
import os
import time

from bench import positionals
from bench.drivers.base import Endpoint
from bench.drivers.raftline import RaftlineDriver
from bench.peers import RaftlinePeer
from bench.positionals import Positional, non_negative_int, positive_float, positive_int
from raftline.clients.queueing import QueueMessage


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    pick = [ordered[min(int(len(ordered) * q), len(ordered) - 1)] * 1000 for q in (0.5, 0.9, 0.99)]
    return "p50 {:.1f}  p90 {:.1f}  p99 {:.1f} ms".format(*pick)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (Linux /proc)."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def probe(
    endpoint: Endpoint, messages: int, loops: int, gap_s: float, per: int, pids: list[int]
) -> None:
    producer, consumer = RaftlineDriver(endpoint), RaftlineDriver(endpoint)
    await producer.connect()
    await consumer.connect()
    await producer.create_queue("lat", 4)
    streamed = loops == 0
    queue = consumer.client.queue(
        "lat-q", max_messages=1000, wait_ms=2000, stream=streamed, prefetch=4000
    )
    sent: dict[bytes, float] = {}
    acked: dict[bytes, float] = {}
    received: dict[bytes, float] = {}
    settled: dict[bytes, float] = {}
    stop = asyncio.Event()

    async def settle(got: list[QueueMessage]) -> None:
        await queue.ack(got)
        now = time.monotonic()
        settled.update((bytes(m.value or b""), now) for m in got)

    async def loop() -> None:
        acks: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            got = await queue.receive()
            now = time.monotonic()
            received.update((bytes(m.value or b""), now) for m in got)
            if got and streamed:  # the next frame is not held up by this one's ack
                acks.add(task := asyncio.create_task(settle(got)))
                task.add_done_callback(acks.discard)
            elif got:
                await settle(got)

    async def send(i: int) -> None:
        values = [f"m{i}-{k}-".encode().ljust(1024, b"x") for k in range(per)]
        start = time.monotonic()
        sent.update((v, start) for v in values)
        await producer.publish("lat", i % 4, values, "all")
        done = time.monotonic()
        acked.update((v, done) for v in values)

    tasks = [asyncio.create_task(loop()) for _ in range(max(loops, 1))]
    await producer.publish("lat", 0, [b"warm-up"], "all")
    await asyncio.sleep(1.0)
    cpu_start = cpu_seconds(pids)
    own_start = time.process_time()
    started, sends = time.monotonic(), []
    for i in range(messages):
        sends.append(asyncio.ensure_future(send(i)))
        await asyncio.sleep(max(0.0, started + (i + 1) * gap_s - time.monotonic()))
    await asyncio.gather(*sends)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not set(sent) <= set(settled):
        await asyncio.sleep(0.1)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    done = [v for v in sent if v in settled]
    cpu_ms = (cpu_seconds(pids) - cpu_start) * 1000
    print(f"{len(done)} of {len(sent)} messages acknowledged")
    print(f"node CPU per acknowledged message {cpu_ms / max(len(done), 1):.2f} ms")
    own_ms = (time.process_time() - own_start) * 1000
    print(f"probe CPU per acknowledged message {own_ms / max(len(done), 1):.3f} ms")
    print("publish ack      ", percentiles([acked[v] - sent[v] for v in done]))
    print("sent to received ", percentiles([received[v] - sent[v] for v in done]))
    print("publish ack to received", percentiles([received[v] - acked[v] for v in done]))
    print("received to acked", percentiles([settled[v] - received[v] for v in done]))
    print("end to end       ", percentiles([settled[v] - sent[v] for v in done]))
    await producer.close()
    await consumer.close()


if __name__ == "__main__":
    args = positionals.parse(
        "bench.queue_latency",
        __doc__,
        [
            Positional("messages", positive_int, 150),
            Positional("loops", non_negative_int, 8),
            Positional("gap_s", positive_float, 0.04),
            Positional("per_send", positive_int, 1),
        ],
    )
    peer = RaftlinePeer(3)
    try:
        endpoint = peer.start()
        asyncio.run(
            probe(
                endpoint,
                args.messages,
                args.loops,
                args.gap_s,
                args.per_send,
                [p.pid for p in peer.processes],
            )
        )
    finally:
        peer.stop()
