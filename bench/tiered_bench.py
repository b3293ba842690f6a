"""Tiered storage throughput: segment upload against plain PUTs, and sequential fetch from the
bucket against fetch from local disk, through one in-process broker and a real SeaweedFS.

Owns the two measurements of issue 16's targets. Run from the repository root:
`python -m bench.tiered_bench [--mib 64] [--segment-mib 8]` (starts and stops `weed mini`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from aiohttp import web

from raftline.api.app import create_app
from raftline.clients.aio import AsyncClient
from raftline.node.broker import Broker
from raftline.node.config import NodeConfig
from raftline.node.tiering import PartitionTiering
from raftline.raftlog.records import Record, build_batch
from raftline.tiered.store import ObjectStore, S3Config
from tests.inproc_harness import configs, start_all, wait_for
from tests.seaweedfs import running_seaweedfs

RECORD_BYTES = 4096
RECORDS_PER_BATCH = 64  # 256 KiB batches


async def produce(broker: Broker, topic: str, mib: int) -> None:
    value = os.urandom(RECORD_BYTES)
    batch = build_batch([Record(value, key=b"k")] * RECORDS_PER_BATCH)
    for _ in range(mib * (1 << 20) // len(batch)):
        await broker.produce(topic, 0, batch, "all")


async def fetch_everything(broker: Broker, topic: str, upto: int) -> int:
    """Sequential fetches of 1 MiB from offset 0 to `upto`; returns the bytes read."""
    offset, total = 0, 0
    while offset < upto:
        batches, _, _ = await broker.fetch(topic, 0, offset, 1 << 20, 0)
        total += sum(len(b) for b in batches)
        last = batches[-1]
        offset = int.from_bytes(last[:8], "big") + int.from_bytes(last[23:27], "big") + 1
    return total


async def fetch_over_http(url: str, topic: str, upto: int) -> int:
    """The same reads as a consumer makes them: the Python client's value fetches over HTTP
    (raw batches on the wire); returns the values' bytes."""
    total, offset = 0, 0
    async with AsyncClient(url) as client:
        while offset < upto:
            fetched = await client.fetch_values(
                topic, 0, offset, max_messages=100_000, max_bytes=1 << 20
            )
            total += sum(len(v or b"") for v in fetched.values)
            offset = fetched.next_offset
    return total


async def run(
    server_endpoint: str, bucket: str, root: Path, mib: int, segment_mib: int, repeat: int
) -> None:
    [config] = configs(root, 1)
    config.s3_endpoint, config.s3_bucket, config.s3_prefix = server_endpoint, bucket, "bench"
    config.fsync, config.retention_check_s = "never", 0.1
    gates: dict[str, asyncio.Event] = {}
    upload_round = PartitionTiering.upload_round

    async def gated(self: PartitionTiering) -> bool:  # uploads start when the bench says so
        if (gate := gates.get(self.topic.name)) is not None:
            await gate.wait()
        return await upload_round(self)

    PartitionTiering.upload_round = gated  # type: ignore[method-assign]
    [broker] = await start_all([config])
    runner = web.AppRunner(create_app(broker, self_http=config.http))
    await runner.setup()
    host, port = config.http.rsplit(":", 1)
    await web.TCPSite(runner, host, int(port)).start()
    upload_ratios, fetch_ratios, http_ratios = [], [], []
    try:
        for run_number in range(repeat):
            topic = f"up{run_number}"
            gates[topic] = asyncio.Event()
            upload_ratios.append(
                await upload_bench(broker, config, topic, gates[topic], mib, segment_mib)
            )
            raw, http = await fetch_bench(
                broker, f"http://{config.http}", f"read{run_number}", mib, segment_mib
            )
            fetch_ratios.append(raw)
            http_ratios.append(http)
    finally:
        await runner.cleanup()
        await broker.stop()
        PartitionTiering.upload_round = upload_round  # type: ignore[method-assign]
    print(f"median of {repeat} runs:")
    print(f"  upload / plain PUT:                 {statistics.median(upload_ratios):.2f}")
    print(f"  bucket / local fetch (broker.fetch): {statistics.median(fetch_ratios):.2f}")
    print(f"  bucket / local fetch (HTTP client):  {statistics.median(http_ratios):.2f}")


async def upload_bench(
    broker: Broker, config: NodeConfig, topic: str, gate: asyncio.Event, mib: int, segment_mib: int
) -> float:
    await broker.create_topic(
        topic,
        1,
        1,
        {"remote.storage.enable": "true", "segment.bytes": str(segment_mib << 20)},
    )
    await produce(broker, topic, mib)
    [replica] = [r for r in broker.partitions.values() if r.topic == topic]
    assert broker.tiering is not None
    tiering = broker.tiering.partitions[replica.group]
    sealed = replica.log.sealed_segments()
    end = sealed[-1].next_offset
    sealed_bytes = sum(s.size for s in sealed)
    started = time.perf_counter()
    gate.set()
    await wait_for(lambda: tiering.state.durable_next >= end, timeout=600)
    upload_s = time.perf_counter() - started

    # The baseline: the same segment files, PUT one after another by the same client library.
    assert config.s3_endpoint is not None and config.s3_bucket is not None
    store = ObjectStore(S3Config.from_env(config.s3_endpoint, config.s3_bucket, prefix="plain"))
    files = [(s.base_offset, Path(s.path).read_bytes()) for s in sealed]
    started = time.perf_counter()
    for base, data in files:
        await store.put(f"{topic}/{base}.log", data)
    put_s = time.perf_counter() - started
    mb = sealed_bytes / (1 << 20)
    print(f"upload: {mb:.0f} MiB in {len(sealed)} sealed segments")
    print(f"  tiered upload (objects, Raft entries, manifest): {mb / upload_s:7.1f} MiB/s")
    print(f"  plain sequential PUT of the same files:          {mb / put_s:7.1f} MiB/s")
    print(f"  ratio: {put_s / upload_s:.2f}")
    return put_s / upload_s


async def fetch_bench(
    broker: Broker, url: str, topic: str, mib: int, segment_mib: int
) -> tuple[float, float]:
    await broker.create_topic(
        topic,
        1,
        1,
        {
            "remote.storage.enable": "true",
            "segment.bytes": str(segment_mib << 20),
            "local.retention.bytes": "0",
        },
    )
    [replica] = [r for r in broker.partitions.values() if r.topic == topic]
    await produce(broker, topic, mib)
    upto = replica.log.sealed_segments()[-1].next_offset
    started = time.perf_counter()
    local_bytes = await fetch_everything(broker, topic, upto)
    local_s = time.perf_counter() - started
    started = time.perf_counter()
    local_http = await fetch_over_http(url, topic, upto)
    local_http_s = time.perf_counter() - started
    await wait_for(lambda: replica.log.log_start_offset >= upto, timeout=600)
    assert broker.tiering is not None
    cache = broker.tiering.cache
    cache.drop_all()  # a cold cache: every byte comes from the bucket
    started = time.perf_counter()
    remote_bytes = await fetch_everything(broker, topic, upto)
    remote_s = time.perf_counter() - started
    cache.drop_all()
    started = time.perf_counter()
    remote_http = await fetch_over_http(url, topic, upto)
    remote_http_s = time.perf_counter() - started
    assert (remote_bytes, remote_http) == (local_bytes, local_http)
    mb = local_bytes / (1 << 20)
    print(f"sequential fetch of {mb:.0f} MiB from offset 0 in 1 MiB fetches (cold cache)")
    print(f"  broker.fetch, local disk:  {mb / local_s:8.1f} MiB/s")
    print(f"  broker.fetch, bucket:      {mb / remote_s:8.1f} MiB/s")
    print(f"  ratio: {local_s / remote_s:.2f}")
    print(f"  HTTP client, local disk:   {mb / local_http_s:8.1f} MiB/s")
    print(f"  HTTP client, bucket:       {mb / remote_http_s:8.1f} MiB/s")
    print(f"  ratio: {local_http_s / remote_http_s:.2f}")
    return local_s / remote_s, local_http_s / remote_http_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="data per measurement")
    parser.add_argument("--segment-mib", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs (medians are reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_seaweedfs(Path(tmp) / "weed") as server:
        os.environ.update(server.env())
        bucket = server.create_bucket()
        node_dir = Path(tmp) / "node"
        asyncio.run(run(server.endpoint, bucket, node_dir, args.mib, args.segment_mib, args.repeat))


if __name__ == "__main__":
    main()
