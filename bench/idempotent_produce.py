"""Produce throughput with and without idempotence on real `raftline serve` processes.

Starts a 3-node cluster (fsync always), one topic of 4 partitions (replication 3), then runs in
turns, each for --seconds:
- "http": --workers concurrent HTTP clients posting JSON requests of --batch 100-byte messages
  to the partition leaders' node; idempotent runs give every worker its own producer id and
  number its requests. Same concurrency both ways: the difference is the broker's cost.
- "large": the same with requests of 500 messages of 1 KB, plain and transactional (each
  worker its own transactional id, committing after every 5 requests: 2 500 messages).
- "client": one AsyncProducer per partition set, as users run it (idempotent=True keeps up to 5
  batches in flight per partition, without idempotence 1).
Usage: .venv/bin/python -m bench.idempotent_produce [--seconds 4] [--workers 32] [--batch 10]
Under a minute with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.node_procs import NodeCluster, http_json, running_nodes
from raftline.clients.client import AsyncClient

PORT_BASE = 19400
TOPIC = "idem-bench"
PARTITIONS = 4


async def _http_run(
    cluster: NodeCluster, seconds: float, workers: int, batch: int, idempotent: bool
) -> float:
    leaders = [cluster.leader(TOPIC, p).url for p in range(PARTITIONS)]
    value = "x" * 100
    sent = 0
    deadline = time.monotonic() + seconds

    async def worker(index: int, session: aiohttp.ClientSession) -> None:
        nonlocal sent
        partition = index % PARTITIONS
        url = f"{leaders[partition]}/v1/topics/{TOPIC}/messages"
        fields: dict[str, Any] = {}
        if idempotent:
            async with session.post(f"{leaders[0]}/v1/producers", json={}) as response:
                answer = await response.json()
            fields = {"producer_id": answer["producer_id"], "producer_epoch": 0, "sequence": 0}
        messages = [{"value": value, "partition": partition} for _ in range(batch)]
        while time.monotonic() < deadline:
            async with session.post(url, json={**fields, "messages": messages}) as response:
                body = await response.json()
                if response.status != 200 or body.get("duplicate"):
                    raise RuntimeError(f"produce answered {response.status}: {body}")
            sent += batch
            if idempotent:
                fields["sequence"] += batch

    connector = aiohttp.TCPConnector(limit=workers + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.monotonic()
        await asyncio.gather(*(worker(i, session) for i in range(workers)))
        return sent / (time.monotonic() - started)


async def _large_run(
    cluster: NodeCluster, seconds: float, workers: int, transactional: bool
) -> float:
    leaders = [cluster.leader(TOPIC, p).url for p in range(PARTITIONS)]
    value = "x" * 1000
    sent = 0
    deadline = time.monotonic() + seconds

    async def worker(index: int, session: aiohttp.ClientSession) -> None:
        nonlocal sent
        partition = index % PARTITIONS
        url = f"{leaders[partition]}/v1/topics/{TOPIC}/messages"
        tid = f"bench-{index}-{time.monotonic_ns()}"
        fields: dict[str, Any] = {}
        if transactional:
            body = {"transactional_id": tid}
            async with session.post(f"{leaders[0]}/v1/producers", json=body) as response:
                answer = await response.json()
            fields = {
                "transactional": True,
                "transactional_id": tid,
                "producer_id": answer["producer_id"],
                "producer_epoch": answer["producer_epoch"],
                "sequence": 0,
            }
        messages = [{"value": value, "partition": partition} for _ in range(500)]
        requests = 0
        while time.monotonic() < deadline:
            async with session.post(url, json={**fields, "messages": messages}) as response:
                body = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"produce answered {response.status}: {body}")
            sent += len(messages)
            requests += 1
            if transactional:
                fields["sequence"] += len(messages)
                if requests % 5 == 0 or time.monotonic() >= deadline:
                    end = {k: fields[k] for k in ("producer_id", "producer_epoch")}
                    path = f"{leaders[0]}/v1/transactions/{tid}/commit"
                    async with session.post(path, json=end) as response:
                        answer = await response.json()
                        if response.status != 200:
                            raise RuntimeError(f"commit answered {response.status}: {answer}")
                    fields["producer_epoch"] = answer["producer_epoch"]
                    fields["sequence"] = 0

    connector = aiohttp.TCPConnector(limit=workers + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.monotonic()
        await asyncio.gather(*(worker(i, session) for i in range(workers)))
        return sent / (time.monotonic() - started)


async def _client_run(cluster: NodeCluster, seconds: float, idempotent: bool) -> float:
    urls = ",".join(node.url for node in cluster.nodes)
    async with AsyncClient(urls) as client:
        producer = client.producer(TOPIC, idempotent=idempotent, linger_ms=2, batch_messages=200)
        sent = 0
        deadline = time.monotonic() + seconds
        started = time.monotonic()
        pending: list[Any] = []
        while time.monotonic() < deadline:
            for i in range(500):
                pending.append(await producer.send(b"x" * 100, partition=i % PARTITIONS))
            sent += 500
            if len(pending) > 20_000:
                await asyncio.gather(*pending[:10_000])
                del pending[:10_000]
            await asyncio.sleep(0)
        await producer.flush()
        await asyncio.gather(*pending)
        return sent / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, running_nodes(Path(root), 3, PORT_BASE) as cluster:
        status, body = http_json(
            f"{cluster.nodes[0].url}/v1/topics",
            "POST",
            {"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 3},
            timeout=15,
        )
        if status != 201:
            raise RuntimeError(f"creating the topic failed: {status} {body}")
        results: dict[str, list[float]] = {}
        for idempotent in (False, True) * 2:
            name = "idempotent" if idempotent else "plain"
            rate = asyncio.run(
                _http_run(cluster, args.seconds, args.workers, args.batch, idempotent)
            )
            results.setdefault(f"http {name}", []).append(rate)
        for transactional in (False, True) * 2:
            name = "transactional" if transactional else "plain"
            rate = asyncio.run(_large_run(cluster, args.seconds, 8, transactional))
            results.setdefault(f"large {name}", []).append(rate)
        for idempotent in (False, True):
            name = "idempotent" if idempotent else "plain"
            rate = asyncio.run(_client_run(cluster, args.seconds, idempotent))
            results.setdefault(f"client {name}", []).append(rate)
    for name, rates in results.items():
        shown = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"{name:18s} best {max(rates):>10,.0f} msgs/s  (runs: {shown})")
    plain, idem = max(results["http plain"]), max(results["http idempotent"])
    print(f"http: idempotent / plain = {idem / plain:.0%}")
    plain, idem = max(results["client plain"]), max(results["client idempotent"])
    print(f"client: idempotent / plain = {idem / plain:.0%}")
    plain, txn = max(results["large plain"]), max(results["large transactional"])
    print(f"large batches: transactional / plain = {txn / plain:.0%}")


if __name__ == "__main__":
    main()
