"""RPO and RTO of a restore from object storage, on real `raftline serve` processes and SeaweedFS.

Owns the restore benchmark: a 3-node cluster writes ~1 GB to a tiered topic (segment.ms bounds
how long a record waits for its upload), then a trickle of writes; the age of the oldest
acknowledged record not yet in the bucket is sampled every second (the RPO if disaster struck
then). Then every node's disk is lost; a fresh cluster restores the topic from the bucket (RTO:
until every partition serves fetches from offset 0 and takes writes) and reads it all back.
Run: `.venv/bin/python -m bench.restore_bench [--mb 1024] [--segment-ms 10000]` (repo root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.inproc import free_port_base
from bench.node_procs import NodeCluster, http_json, running_nodes
from raftline.clients.client import Client
from raftline.tiered import layout
from raftline.tiered.store import ObjectNotFound, ObjectStore, S3Config
from tests.seaweedfs import running_seaweedfs

TOPIC = "restore-bench"
PARTITIONS = 4
VALUE_BYTES = 1000
BATCH_VALUES = 500  # 0.5 MB per request, under max.message.bytes
MB = 1 << 20


@dataclass
class Acks:
    """When each partition's records were acknowledged: (last offset, time) in order."""

    by_partition: dict[int, list[tuple[int, float]]] = field(
        default_factory=lambda: {p: [] for p in range(PARTITIONS)}
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, partition: int, last_offset: int, at: float) -> None:
        with self.lock:
            self.by_partition[partition].append((last_offset, at))

    def oldest_not_below(self, partition: int, offset: int) -> float | None:
        """Ack time of the first acknowledged record at or above `offset` (None: all below)."""
        with self.lock:
            for last, at in self.by_partition[partition]:
                if last >= offset:
                    return at
        return None

    def last_offset(self, partition: int) -> int:
        with self.lock:
            acked = self.by_partition[partition]
            return acked[-1][0] if acked else -1


class BucketWatch:
    """Samples, every second, the manifests' next offsets and the age of the oldest
    acknowledged record past them (what a disaster at that moment would lose)."""

    def __init__(self, store: ObjectStore, topic_id: int, acks: Acks) -> None:
        self.store, self.topic_id, self.acks = store, topic_id, acks
        self.samples: list[tuple[float, float]] = []  # (time, worst age over partitions)
        self.next_offsets = [0] * PARTITIONS
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def next_offset(self, partition: int) -> int:
        key = layout.manifest_key(TOPIC, self.topic_id, partition)
        try:
            return int(json.loads(await self.store.get(key))["next_offset"])
        except ObjectNotFound:
            return 0

    async def _run(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            worst = 0.0
            for p in range(PARTITIONS):
                self.next_offsets[p] = await self.next_offset(p)
                since = self.acks.oldest_not_below(p, self.next_offsets[p])
                if since is not None:
                    worst = max(worst, now - since)
            self.samples.append((now, worst))
            await asyncio.sleep(1.0)

    def worst_between(self, start: float, end: float) -> float:
        return max((age for at, age in self.samples if start <= at <= end), default=0.0)


def write(client: Client, acks: Acks, total_bytes: int, pause_s: float = 0.0) -> int:
    """Writes about `total_bytes` round-robin over the partitions (one batch in flight per
    partition); returns the bytes written."""
    producer = client.producer(TOPIC)
    value = os.urandom(VALUE_BYTES)
    pending: list[tuple[int, object]] = []
    written = 0
    batch = 0
    while written < total_bytes:
        partition = batch % PARTITIONS
        pending.append(
            (partition, producer.send_batch([value] * BATCH_VALUES, partition=partition))
        )
        written += VALUE_BYTES * BATCH_VALUES
        batch += 1
        if len(pending) >= PARTITIONS:
            for p, future in pending:
                acked = future.result()  # type: ignore[attr-defined]
                acks.add(p, acked.base_offset + acked.count - 1, time.monotonic())
            pending = []
            if pause_s:
                time.sleep(pause_s)
    for p, future in pending:
        acked = future.result()  # type: ignore[attr-defined]
        acks.add(p, acked.base_offset + acked.count - 1, time.monotonic())
    producer.close()
    return written


@contextmanager
def s3_environment(endpoint: str, bucket: str, access: str, secret: str) -> Iterator[None]:
    """The variables every node process reads its object storage from."""
    settings = {
        "RAFTLINE_S3_ENDPOINT": endpoint,
        "RAFTLINE_S3_BUCKET": bucket,
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def create_topic(cluster: NodeCluster, segment_ms: int, segment_bytes: int) -> None:
    config = {
        "remote.storage.enable": "true",
        "segment.ms": str(segment_ms),
        "segment.bytes": str(segment_bytes),
    }
    body = {"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 3, "config": config}
    status, answer = http_json(f"{cluster.nodes[0].url}/v1/topics", "POST", body, timeout=30)
    if status != 201:
        raise RuntimeError(f"create topic: {status} {answer}")


def topic_id_of(store: ObjectStore) -> int:
    async def find() -> int:
        for info in await store.list("topics/"):
            if info.key.startswith(f"topics/{TOPIC}/"):
                return int(info.key.split("/")[2])
        return 0

    return asyncio.run(find())


def wait_serving(cluster: NodeCluster, client: Client, timeout: float = 300.0) -> None:
    """Until every partition answers a fetch from offset 0 with records and takes a write."""
    deadline = time.monotonic() + timeout
    pending = set(range(PARTITIONS))
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions {sorted(pending)} not serving")
        for p in sorted(pending):
            try:
                leader = cluster.leader(TOPIC, p, timeout=5)
                fetched = client.fetch_values(TOPIC, p, 0, max_messages=1, url=leader.url)
                if fetched.values:
                    client.producer(TOPIC).send_batch([b"after"], partition=p).result()
                    pending.discard(p)
            except Exception:  # not elected yet, or still starting: ask again
                time.sleep(0.2)


def read_back(cluster: NodeCluster, client: Client, ends: list[int]) -> tuple[int, int]:
    """Every record from offset 0 up to `ends` (the restore points): (records, value bytes)."""
    records = total = 0
    for p in range(PARTITIONS):
        url = cluster.leader(TOPIC, p).url
        offset = 0
        while offset < ends[p]:
            fetched = client.fetch_values(
                TOPIC, p, offset, max_messages=100_000, max_bytes=8 * MB, url=url
            )
            values = fetched.values
            records += len(values)
            total += sum(len(v) for v in values if v is not None)
            offset = fetched.next_offset
    return records, total


def run(args: argparse.Namespace, root: Path) -> dict[str, float]:
    with running_seaweedfs(root / "weed") as weed:
        bucket = weed.create_bucket("restore-bench")
        access, secret = weed.env()["AWS_ACCESS_KEY_ID"], weed.env()["AWS_SECRET_ACCESS_KEY"]
        with s3_environment(weed.endpoint, bucket, access, secret):
            store = ObjectStore(S3Config.from_env(weed.endpoint, bucket))
            acks = Acks()
            with running_nodes(root / "before", 3, free_port_base(), fsync="never") as cluster:
                create_topic(cluster, args.segment_ms, args.segment_mb * MB)
                client = Client(",".join(n.url for n in cluster.nodes))
                # The topic object appears with the first upload.
                started = time.monotonic()
                bulk = write(client, acks, 16 * MB)
                while not (topic_id := topic_id_of(store)):
                    time.sleep(0.5)
                watch = BucketWatch(store, topic_id, acks)
                watch.thread.start()
                bulk += write(client, acks, args.mb * MB - bulk)
                bulk_s = time.monotonic() - started
                bulk_end = time.monotonic()
                trickle_start = time.monotonic()
                trickled = write(client, acks, args.trickle_mb * MB, pause_s=args.trickle_pause_s)
                time.sleep(args.segment_ms / 1000 + 5)  # the RPO window, then disaster
                disaster = time.monotonic()
                client.close()
                watch.stopping.set()
                watch.thread.join(30)
                # acknowledged records past the bucket's end (its end may lie past the last acked
                # record: control batches follow it)
                lost = [
                    max(0, acks.last_offset(p) + 1 - watch.next_offsets[p])
                    for p in range(PARTITIONS)
                ]
                ends = list(watch.next_offsets)
            shutil.rmtree(root / "before")  # every node's disk is gone
            bucket_bytes = asyncio.run(_bucket_bytes(store))
            began = time.monotonic()  # RTO: new nodes on empty disks, restore, serving
            with running_nodes(root / "after", 3, free_port_base(), fsync="never") as cluster:
                started_s = time.monotonic() - began
                status, answer = http_json(
                    f"{cluster.nodes[0].url}/v1/restore", "POST", {}, timeout=120
                )
                if status != 200:
                    raise RuntimeError(f"restore: {status} {answer}")
                restored_ends = [p["next_offset"] for p in answer["topics"][0]["partitions"]]
                client = Client(",".join(n.url for n in cluster.nodes))
                wait_serving(cluster, client)
                rto_s = time.monotonic() - began
                read_start = time.monotonic()
                records, value_bytes = read_back(cluster, client, restored_ends)
                read_s = time.monotonic() - read_start
                client.close()
    return {
        "written_mb": (bulk + trickled) / MB,
        "bulk_s": bulk_s,
        "bulk_rpo_s": watch.worst_between(started, bulk_end),
        "trickle_rpo_s": watch.worst_between(trickle_start, disaster),
        "rpo_at_disaster_s": watch.samples[-1][1] if watch.samples else 0.0,
        "records_lost": sum(lost),
        "bucket_mb": bucket_bytes / MB,
        "restore_points_match": float(restored_ends == ends),
        "cluster_start_s": started_s,
        "rto_s": rto_s,
        "read_back_s": read_s,
        "read_back_records": records,
        "read_back_mb": value_bytes / MB,
    }


async def _bucket_bytes(store: ObjectStore) -> int:
    return sum(info.size for info in await store.list() if info.key.endswith(".log"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1024, help="bulk write, MB")
    parser.add_argument("--segment-ms", type=int, default=10_000)
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--trickle-mb", type=int, default=4, help="slow writes after the bulk")
    parser.add_argument("--trickle-pause-s", type=float, default=0.5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="restore-bench-", dir=args.dir))
    try:
        result = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f}; segment.ms {args.segment_ms}")
    for key, value in result.items():
        print(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
