"""Produce and fetch throughput of one `raftline serve` node through clients/client.py.

Owns the bounded loopback run: start a node, batching producers for a fixed time, then consumers.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from raftline.clients.client import AsyncClient, AsyncProducer

READY_TIMEOUT_S = 90.0  # a loaded shared machine can take a while


@dataclass(slots=True)
class Rate:
    messages: int
    bytes: int
    seconds: float

    def line(self, what: str) -> str:
        return (
            f"{what:8s} {self.messages / self.seconds:12,.0f} msgs/s "
            f"{self.bytes / self.seconds / 1e6:8.1f} MB/s  "
            f"({self.messages:,} in {self.seconds:.1f} s)"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_node(data_dir: str, fsync: str) -> tuple[subprocess.Popen[bytes], str]:
    http, raft = _free_port(), _free_port()
    command = [
        os.path.join(os.path.dirname(sys.executable), "raftline"), "serve", "--node-id", "1",
        "--data-dir", data_dir, "--http", f"127.0.0.1:{http}", "--raft", f"127.0.0.1:{raft}",
        "--peers", f"1=127.0.0.1:{raft}", "--fsync", fsync,
    ]  # fmt: skip
    node = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as answer:
                if answer.status == 200:
                    return node, url
        except OSError:
            time.sleep(0.2)
    node.kill()
    node.wait()
    raise RuntimeError("the node did not become ready")


def _wire(args: argparse.Namespace) -> dict[str, str]:
    """The client's body format, when one is forced (default: the client's own choice)."""
    return {} if args.wire is None else {"wire": args.wire}


async def produce(url: str, topic: str, args: argparse.Namespace, first: int = 0) -> Rate:
    """`args.producers` producers, each on its own partition (counting from `first`)."""
    payload = os.urandom(args.size // 2).hex().encode()[: args.size]
    stop_at = time.monotonic() + args.seconds
    acked = 0

    async def one_producer(index: int) -> None:
        nonlocal acked
        async with AsyncClient(url, **_wire(args)) as client:
            producer = AsyncProducer(
                client, topic, linger_ms=args.linger_ms, batch_messages=args.batch
            )
            partition = (first + index) % args.partitions
            window: list[asyncio.Future[object]] = []
            while time.monotonic() < stop_at:
                round_ = [
                    await producer.send(payload, partition=partition) for _ in range(args.batch)
                ]
                window.append(asyncio.gather(*round_))
                if len(window) > args.in_flight:
                    await window.pop(0)
                    acked += args.batch
            for pending in window:
                await pending
                acked += args.batch
            await producer.close()

    started = time.monotonic()
    await asyncio.gather(*(one_producer(i) for i in range(args.producers)))
    return Rate(acked, acked * args.size, time.monotonic() - started)


async def fetch(url: str, topic: str, args: argparse.Namespace) -> Rate:
    stop_at = time.monotonic() + args.seconds
    received = 0
    payload_bytes = 0

    async def one_consumer(partition: int) -> None:
        nonlocal received, payload_bytes
        async with AsyncClient(url, **_wire(args)) as client:
            offset: int | str = "earliest"
            while time.monotonic() < stop_at:
                result = await client.fetch(
                    topic, partition, offset, max_messages=args.fetch_messages
                )
                if not result.messages:
                    return
                received += len(result.messages)
                payload_bytes += sum(len(m.value or b"") for m in result.messages)
                offset = result.next_offset

    started = time.monotonic()
    await asyncio.gather(*(one_consumer(p) for p in range(args.partitions)))
    return Rate(received, payload_bytes, time.monotonic() - started)


TOPIC = "bench-produce-fetch"


def _produce_process(url: str, args: argparse.Namespace, first: int) -> Rate:
    return asyncio.run(produce(url, TOPIC, args, first))


def run(url: str, args: argparse.Namespace) -> None:
    """Producers in `args.processes` client processes (one Python process saturates a core
    long before the node does), then one consumer per partition."""

    async def create() -> None:
        async with AsyncClient(url) as admin:
            await admin.create_topic(TOPIC, args.partitions, 1)

    asyncio.run(create())
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.processes) as pool:
        firsts = [i * args.producers for i in range(args.processes)]
        rates = pool.starmap(_produce_process, [(url, args, first) for first in firsts])
    total = Rate(
        sum(r.messages for r in rates), sum(r.bytes for r in rates), max(r.seconds for r in rates)
    )
    print(total.line("produce"), flush=True)
    print(asyncio.run(fetch(url, TOPIC, args)).line("fetch"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--producers", type=int, default=4, help="per client process")
    parser.add_argument("--processes", type=int, default=1, help="client processes producing")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="message bytes")
    parser.add_argument("--batch", type=int, default=1000, help="messages per producer round")
    parser.add_argument("--in-flight", type=int, default=2, help="unacknowledged rounds")
    parser.add_argument("--linger-ms", type=float, default=2.0)
    parser.add_argument("--fetch-messages", type=int, default=5000)
    parser.add_argument("--wire", choices=("batch", "json"), help="default: the client's")
    parser.add_argument("--fsync", default="always")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftline-bench-") as data_dir:
        node, url = start_node(data_dir, args.fsync)
        try:
            run(url, args)
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(10)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()


if __name__ == "__main__":
    main()
