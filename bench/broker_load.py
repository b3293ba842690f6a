"""Broker-only load: prebuilt binary batches POSTed to real nodes, acks=all, max or fixed rate.

Owns the produce throughput / ack latency figures of issue #6 and, with --latency, the
end-to-end latency through a long-polling binary fetch (send time in each batch's timestamp).

Usage: .venv/bin/python -m bench.broker_load [--nodes 1|3] [--batch 1000] [--connections 8]
  [--seconds 10] [--rate MSGS_PER_S (0 = max)] [--latency] [--port-base 19100] [--fsync always]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.node_procs import running_nodes
from raftline.raftlog.batch import CRC_OFFSET, compute_crc, iter_headers
from raftline.raftlog.records import Record, build_batch

BATCH_TYPE = "application/vnd.raftline.batch"
TOPIC = "load"
WARMUP_S = 1.0
_TIMESTAMPS = struct.Struct(">qq")  # base timestamp, max timestamp: bytes 27..43 of a batch
_TIMESTAMPS_OFFSET = 27


def stamped(batch: bytes, sent_us: int) -> bytes:
    """The batch with both header timestamps set to `sent_us` (microseconds, bench only)."""
    out = bytearray(batch)
    _TIMESTAMPS.pack_into(out, _TIMESTAMPS_OFFSET, sent_us, sent_us)
    struct.pack_into(">I", out, CRC_OFFSET, compute_crc(out))
    return bytes(out)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def now_us() -> int:
    return time.time_ns() // 1000


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0, "n": 0}
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": pick(0.50), "p99": pick(0.99), "max": ordered[-1], "n": len(ordered)}


class Load:
    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        self.url = url
        self.batch = build_batch([Record(b"x" * 100) for _ in range(args.batch)])
        self.start = 0.0
        self.measure_from = 0.0
        self.measure_wall = 0.0  # measure_from on the wall clock (batch timestamps)
        self.deadline = 0.0
        self.acked_records = 0
        self.acked_bytes = 0
        self.ack_ms: list[float] = []
        self.e2e_ms: list[float] = []
        self.errors: dict[str, int] = {}
        self._slot = 0

    def _next_send_at(self) -> float:
        """Fixed rate: the k-th batch is due at start + k * interval (catch up when late)."""
        interval = self.args.batch / self.args.rate
        due = self.start + self._slot * interval
        self._slot += 1
        return due

    async def producer(self, session: aiohttp.ClientSession) -> None:
        produce_url = f"{self.url}/v1/topics/{TOPIC}/messages?partition=0&acks=all"
        headers = {"Content-Type": BATCH_TYPE}
        while True:
            if self.args.rate:
                due = self._next_send_at()
                if due >= self.deadline:
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            elif time.monotonic() >= self.deadline:
                return
            body = stamped(self.batch, now_us()) if self.args.latency else self.batch
            sent = time.monotonic()
            async with session.post(produce_url, data=body, headers=headers) as response:
                await response.read()
                status = response.status
            done = time.monotonic()
            if status != 200:
                self.errors[str(status)] = self.errors.get(str(status), 0) + 1
                continue
            if sent >= self.measure_from:
                self.acked_records += self.args.batch
                self.acked_bytes += len(body)
                self.ack_ms.append((done - sent) * 1000)

    async def consumer(self, session: aiohttp.ClientSession) -> None:
        """Long-polls binary fetches from the end of the log; one e2e sample per record."""
        fetch_url = f"{self.url}/v1/topics/{TOPIC}/partitions/0/messages"
        offset: int | str = "latest"
        while time.monotonic() < self.deadline + 1.0:
            params = {
                "offset": str(offset),
                "wait_ms": "500",
                "max_bytes": str(1024 * 1024),  # the default; a batch is returned whole anyway
                "max_messages": "100000",
            }
            async with session.get(fetch_url, params=params, headers={"Accept": BATCH_TYPE}) as r:
                body = await r.read()
                if r.status != 200:
                    self.errors[f"fetch {r.status}"] = self.errors.get(f"fetch {r.status}", 0) + 1
                    await asyncio.sleep(0.05)
                    continue
                offset = int(r.headers["Raftline-Next-Offset"])
            received = now_us()
            for _, header in iter_headers(body):
                if header.base_timestamp / 1e6 >= self.measure_wall:
                    latency = (received - header.base_timestamp) / 1000
                    self.e2e_ms.extend([latency] * header.records_count)

    async def run(self) -> dict[str, object]:
        connector = aiohttp.TCPConnector(limit=self.args.connections + 2)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self.start = time.monotonic()
            self.measure_from = self.start + WARMUP_S
            self.measure_wall = time.time() + WARMUP_S
            self.deadline = self.measure_from + self.args.seconds
            tasks = [self.producer(session) for _ in range(self.args.connections)]
            if self.args.latency:
                tasks.append(self.consumer(session))
            await asyncio.gather(*tasks)
        elapsed = self.args.seconds
        return {
            "nodes": self.args.nodes,
            "batch_records": self.args.batch,
            "batch_bytes": len(self.batch),
            "connections": self.args.connections,
            "target_rate": self.args.rate or "max",
            "msgs_per_s": round(self.acked_records / elapsed),
            "mb_per_s": round(self.acked_bytes / elapsed / 1e6, 1),
            "ack_ms": {k: round(v, 2) for k, v in percentiles(self.ack_ms).items()},
            "e2e_ms": {k: round(v, 2) for k, v in percentiles(self.e2e_ms).items()}
            if self.args.latency
            else None,
            "errors": self.errors,
        }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    parser.add_argument("--batch", type=int, default=1000, help="records of 100 B per batch")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=0.0, help="msgs/s; 0 = as fast as acked")
    parser.add_argument("--latency", action="store_true", help="also measure e2e via fetch")
    parser.add_argument("--port-base", type=int, default=19100)
    parser.add_argument("--fsync", default="always", choices=("always", "interval", "never"))
    parser.add_argument("--pid-file", help="write the leader's pid here once loading starts")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="broker-load-") as root,
        running_nodes(Path(root), args.nodes, args.port_base, args.fsync) as cluster,
    ):
        cluster.create_topic(TOPIC, 1, args.nodes)
        leader = cluster.leader(TOPIC)
        if args.pid_file:
            Path(args.pid_file).write_text(str(leader.pid))
        pids = [node.pid for node in cluster.nodes]
        cpu_before = [cpu_seconds(pid) for pid in pids]
        result = asyncio.run(Load(args, leader.url).run())
        # CPU per million messages: a cost measure that a loaded machine distorts less.
        used = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
        messages = int(result["msgs_per_s"]) * args.seconds or 1  # type: ignore[call-overload]
        result["node_cpu_s_per_M_msgs"] = [round(u / messages * 1e6, 2) for u in used]
        result["loadavg"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
