"""Rough produce throughput of one in-process broker (no HTTP): acks=all, fsync always.

Concurrent producers each send one-record batches (or batches of --batch records) to one
partition; concurrent requests share Raft appends and fsyncs. Usage:
.venv/bin/python -m bench.node_produce [seconds] [producers] [records per batch]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench import positionals
from bench.inproc import configs, leading, start_all
from bench.positionals import Positional, positive_float, positive_int
from raftline.node.broker import Broker
from raftline.node.config import NodeConfig
from raftline.raftlog.records import Record, build_batch

PORT_BASE = 19100  # Raft ports 19151..; nothing else binds in this range


async def run(seconds: float, producers: int, per_batch: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg: NodeConfig = configs(Path(tmp), 1, PORT_BASE)[0]
        (broker,) = await start_all([cfg])
        await broker.create_topic("bench", 1, 1, {})
        while leading([broker], "bench") is None:
            await asyncio.sleep(0.01)
        batch = build_batch([Record(b"x" * 100) for _ in range(per_batch)])
        sent = 0
        deadline = time.monotonic() + seconds

        async def producer(b: Broker) -> None:
            nonlocal sent
            while time.monotonic() < deadline:
                await b.produce("bench", 0, batch, "all")
                sent += per_batch

        start = time.monotonic()
        await asyncio.gather(*(producer(broker) for _ in range(producers)))
        elapsed = time.monotonic() - start
        fsyncs = broker.runtime.stats["fsyncs"]
        await broker.stop()
    print(
        f"{producers} producers x {per_batch}-record batches of 100 B, acks=all: "
        f"{sent / elapsed:,.0f} msgs/s ({fsyncs} fsyncs in {elapsed:.1f} s)"
    )


if __name__ == "__main__":
    args = positionals.parse(
        "bench.node_produce",
        __doc__,
        [
            Positional("seconds", positive_float, 5.0),
            Positional("producers", positive_int, 64),
            Positional("per_batch", positive_int, 1),
        ],
    )
    asyncio.run(run(args.seconds, args.producers, args.per_batch))
