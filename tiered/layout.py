"""Names and bytes of the bucket's objects (tiered/FORMAT.md, format version 1).

Owns object keys (hash prefix, topic and partition paths), the description of a run of batches
as a SegmentMeta (headers only: records are never unpacked), the offset, time and transaction
index objects, and the topic object.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from raftline.raftlog.batch import iter_headers
from raftline.raftlog.index import OFFSET_ENTRY, TIME_ENTRY

from .manifest import FORMAT_VERSION, SegmentMeta

INDEX_INTERVAL_BYTES = 4096  # as the local log's index_interval_bytes
TXN_ENTRY = struct.Struct(">hqqqq")  # version, producer id, first, last, last stable offset

Bytes = bytes | bytearray | memoryview


class AbortedRange(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the offset of its ABORT marker
    last_stable_offset: int = -1  # the partition's LSO right after the abort; -1: not known


def partition_hash(topic: str, topic_id: int, partition: int) -> str:
    return hashlib.sha256(f"{topic}/{topic_id}/{partition}".encode()).hexdigest()[:8]


def partition_path(topic: str, topic_id: int, partition: int) -> str:
    return f"{partition_hash(topic, topic_id, partition)}/{topic}/{topic_id}/{partition}"


def manifest_key(topic: str, topic_id: int, partition: int) -> str:
    return f"{partition_path(topic, topic_id, partition)}/manifest.json"


def topic_key(topic: str, topic_id: int) -> str:
    return f"topics/{topic}/{topic_id}/topic.json"


def segment_stem(topic: str, topic_id: int, partition: int, base: int, last: int) -> str:
    return f"{partition_path(topic, topic_id, partition)}/{base:020d}-{last:020d}"


class SegmentObjects(NamedTuple):
    """Everything uploaded for one segment, and the manifest entry naming it."""

    meta: SegmentMeta
    log: Bytes
    index: bytes
    time_index: bytes
    txn_index: bytes | None


def build_segment(
    stem: Callable[[int, int], str],
    data: Bytes,
    committed_offset: int,
    aborted: Sequence[AbortedRange] = (),
    index_interval: int = INDEX_INTERVAL_BYTES,
) -> SegmentObjects:
    """Describe and index `data`, a run of whole batches (from the batches' headers only);
    `stem(base offset, last offset)` names its objects."""
    offsets = bytearray()
    times = bytearray()
    terms: list[tuple[int, int]] = []
    base = last = -1
    base_timestamp = max_timestamp = -1
    count = 0
    since_index = index_interval  # index the first batch
    for position, header in iter_headers(data):
        if base < 0:
            base = header.base_offset
        last = header.last_offset
        count += 1
        if not terms or terms[-1][0] != header.leader_epoch:
            terms.append((header.leader_epoch, header.base_offset))
        if header.base_timestamp >= 0 and (
            base_timestamp < 0 or header.base_timestamp < base_timestamp
        ):
            base_timestamp = header.base_timestamp
        if since_index >= index_interval:
            offsets += OFFSET_ENTRY.pack(last - base, position)
            since_index = 0
            if header.max_timestamp > max_timestamp:
                times += TIME_ENTRY.pack(header.max_timestamp, last - base)
        since_index += header.size
        max_timestamp = max(max_timestamp, header.max_timestamp)
    if count == 0:
        raise ValueError("a segment object needs at least one batch")
    relevant = sorted(
        (a for a in aborted if a.first_offset <= last and a.last_offset >= base),
        key=lambda a: a.last_offset,
    )
    name = stem(base, last)
    txn = b"".join(
        TXN_ENTRY.pack(0, a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)
        for a in relevant
    )
    meta = SegmentMeta(
        base_offset=base,
        last_offset=last,
        committed_offset=committed_offset,
        terms=tuple(terms),
        size_bytes=len(data),
        batch_count=count,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        object=f"{name}.log",
        index=f"{name}.index",
        time_index=f"{name}.timeindex",
        txn_index=f"{name}.txnindex" if relevant else None,
        aborted_transactions=len(relevant),
    )
    return SegmentObjects(meta, data, bytes(offsets), bytes(times), txn or None)


def read_txn_index(data: Bytes) -> list[AbortedRange]:
    if len(data) % TXN_ENTRY.size:
        raise ValueError(f"transaction index of {len(data)} bytes is not whole entries")
    return [
        AbortedRange(pid, first, last, lso)
        for _, pid, first, last, lso in TXN_ENTRY.iter_unpack(bytes(data))
    ]


def offset_index_floor(index: Bytes, relative_offset: int) -> int:
    """Byte position to start reading at for `relative_offset` (FORMAT.md §5); 0 if none."""
    position = 0
    for relative, at in OFFSET_ENTRY.iter_unpack(bytes(index)):
        if relative > relative_offset:
            break
        position = at
    return position


def topic_document(
    cluster_id: str | None,
    topic: str,
    topic_id: int,
    partitions: int,
    replication_factor: int,
    config: dict[str, str],
    created_ms: int,
) -> dict[str, Any]:
    """The bucket's topic.json (tiered/FORMAT.md §2)."""
    return {
        "format_version": FORMAT_VERSION,
        "cluster_id": cluster_id,
        "topic": topic,
        "topic_id": topic_id,
        "partitions": partitions,
        "replication_factor": replication_factor,
        "config": dict(sorted(config.items())),
        "manifests": [manifest_key(topic, topic_id, p) for p in range(partitions)],
        "created_ms": created_ms,
    }


def aborted_ranges(items: Iterable[Any]) -> list[AbortedRange]:
    """AbortedRange of each entry of a log's transaction index (raftlog.txnindex.AbortedTxn)."""
    return [
        AbortedRange(a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)
        for a in items
    ]
