"""Helpers of the Spark data source tests: a local SparkSession, and buckets laid out by
tiered storage's own code (tiered/layout.py, tiered/manifest.py, tiered/store.py).

Owns the session's settings (local[2], UI off, loopback only, UTC) and writing a topic's
batches into a bucket as segment objects, indexes, manifests and the topic object, the way
the brokers' uploader does.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from raftline.raftlog.batch import iter_headers
from raftline.raftlog.records import ControlType, decode_batch
from raftline.tiered import layout
from raftline.tiered.manifest import ManifestState
from raftline.tiered.store import ObjectStore, S3Config
from tests.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedServer


@contextmanager
def local_spark_session() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from raftline.spark.source import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("raftline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def reader_options(seaweed: SeaweedServer, bucket: str, **more: str) -> dict[str, str]:
    return {
        "s3.endpoint": seaweed.endpoint,
        "bucket": bucket,
        "s3.accessKeyId": ACCESS_KEY,
        "s3.secretAccessKey": SECRET_KEY,
        **more,
    }


def row_tuple(row: Any) -> tuple:
    """A Spark row of the raftline source as comparable Python values: (partition, offset,
    key, value, sorted headers, timestamp ms, timestampType)."""
    headers = sorted((h.key, None if h.value is None else bytes(h.value)) for h in row.headers)
    return (
        row.partition,
        row.offset,
        None if row.key is None else bytes(row.key),
        None if row.value is None else bytes(row.value),
        headers,
        round(row.timestamp.timestamp() * 1000),
        row.timestampType,
    )


def aborted_in(batches: Sequence[bytes]) -> list[layout.AbortedRange]:
    """The aborted transactions of a partition's batches, as its producer state records them:
    (producer, first offset of the transaction, offset of its ABORT marker)."""
    open_since: dict[int, int] = {}
    found = []
    for data in batches:
        for position, header in iter_headers(data):
            if not header.is_transactional:
                continue
            pid = header.producer_id
            if not header.is_control:
                open_since.setdefault(pid, header.base_offset)
                continue
            first = open_since.pop(pid, None)
            whole = memoryview(data)[position : position + header.size]
            if first is not None and decode_batch(whole).control_type == ControlType.ABORT:
                found.append(layout.AbortedRange(pid, first, header.base_offset))
    return found


def split_segments(batches: Sequence[bytes], segment_bytes: int) -> list[bytes]:
    """Batches cut into segments of about `segment_bytes` (a batch is never split)."""
    segments: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for batch in batches:
        current.append(batch)
        size += len(batch)
        if size >= segment_bytes:
            segments.append(b"".join(current))
            current, size = [], 0
    if current:
        segments.append(b"".join(current))
    return segments


class BucketWriter:
    """Writes topics into one bucket with tiered storage's layout code."""

    def __init__(self, seaweed: SeaweedServer, bucket: str, prefix: str = "") -> None:
        config = S3Config(
            seaweed.endpoint,
            bucket,
            prefix=prefix,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
        )
        self.store = ObjectStore(config)
        self._topic_ids = iter(range(1, 1_000_000))
        self.states: dict[tuple[str, int], ManifestState] = {}
        self.topic_ids: dict[str, int] = {}

    def create_topic(self, topic: str, partitions: int, created_ms: int = 1) -> int:
        topic_id = next(self._topic_ids)
        self.topic_ids[topic] = topic_id
        document = layout.topic_document(None, topic, topic_id, partitions, 1, {}, created_ms)
        asyncio.run(self.store.put(layout.topic_key(topic, topic_id), _json(document)))
        for partition in range(partitions):
            self.states[(topic, partition)] = ManifestState()
        return topic_id

    def upload(
        self,
        topic: str,
        partition: int,
        batches: Sequence[bytes],
        segment_bytes: int = 1 << 20,
        aborted: Sequence[layout.AbortedRange] | None = None,
    ) -> None:
        """Append `batches` (the partition's next ones, whole) as segment objects, then write
        the manifest naming them."""
        if aborted is None:
            aborted = aborted_in(batches)
        asyncio.run(self._upload(topic, partition, batches, segment_bytes, aborted))

    async def _upload(self, topic, partition, batches, segment_bytes, aborted) -> None:
        topic_id = self.topic_ids[topic]
        state = self.states[(topic, partition)]
        for data in split_segments(batches, segment_bytes):
            last = [h for _, h in iter_headers(data)][-1].last_offset

            def stem(base: int, last: int) -> str:
                return layout.segment_stem(topic, topic_id, partition, base, last)

            objects = layout.build_segment(stem, data, last + 1, aborted)
            await self.store.put(objects.meta.object, objects.log)
            await self.store.put(objects.meta.index, objects.index)
            await self.store.put(objects.meta.time_index, objects.time_index)
            if objects.txn_index is not None:
                await self.store.put(objects.meta.txn_index, objects.txn_index)
            effect = state.apply(
                state.applied_index + 1, {"op": "add", "segment": objects.meta.to_json()}
            )
            assert effect.accepted, effect.reason
        document = state.document(topic, topic_id, partition)
        await self.store.put(layout.manifest_key(topic, topic_id, partition), _json(document))

    def truncate(self, topic: str, partition: int, start_offset: int) -> None:
        """Remote retention moved the partition's start (the manifest says so)."""
        state = self.states[(topic, partition)]
        effect = state.apply(
            state.applied_index + 1, {"op": "truncate", "start_offset": start_offset}
        )
        assert effect.accepted, effect.reason
        document = state.document(topic, self.topic_ids[topic], partition)
        key = layout.manifest_key(topic, self.topic_ids[topic], partition)
        asyncio.run(self.store.put(key, _json(document)))


def _json(document: dict[str, Any]) -> bytes:
    return orjson.dumps(document)
