"""Segment bytes decoded into pyarrow RecordBatches with the columns of Spark's Kafka source.

Owns the Arrow schema of a record row and the read_committed walk of a byte range of batches
(control batches and aborted transactions dropped, an offset range kept), in C through
raftlog/_columns.c or, when that is not built or RAFTLINE_PURE_PYTHON=1, in Python.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Protocol

import crc32c
import numpy as np
import pyarrow as pa

from raftline.raftlog import batch as batch_layout
from raftline.raftlog.batch import BatchHeader, CorruptBatchError
from raftline.raftlog.compression import decompress
from raftline.raftlog.records import decode_batch

# Every field nullable and the list item named "element": exactly what Spark's Arrow
# conversion of the Kafka source schema expects (it compares schemas strictly).
HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
SCHEMA = pa.schema(BASE_FIELDS)
SCHEMA_WITH_HEADERS = pa.schema([*BASE_FIELDS, pa.field("headers", HEADER_TYPE)])
# The same columns as a Spark DDL string (Spark's Kafka source schema).
SPARK_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
SPARK_DDL_WITH_HEADERS = SPARK_DDL + ", headers array<struct<key: string, value: binary>>"

DEFAULT_MAX_ROWS = 65_536  # rows per RecordBatch: Spark's Arrow batches are about this size
NO_END = 2**63 - 1


class Aborted(Protocol):
    """An aborted transaction (a transaction index entry, tiered.layout.AbortedRange): the
    producer's transactional batches from first_offset up to its abort marker at last_offset
    were not committed."""

    producer_id: int
    first_offset: int
    last_offset: int


def _load_c():  # the module or None
    if os.environ.get("RAFTLINE_PURE_PYTHON") == "1":
        return None
    try:
        from raftline.raftlog import _columns
    except ImportError:
        return None
    _columns.bind(CorruptBatchError)
    return _columns


_C = _load_c()
SPEEDUPS = _C is not None


def schema(include_headers: bool) -> pa.Schema:
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA


def record_batches(
    data: bytes | bytearray | memoryview,
    *,
    topic: str,
    partition: int,
    start_offset: int = 0,
    end_offset: int = NO_END,
    aborted: Iterable[Aborted] = (),
    include_headers: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
    verify_crc: bool = True,
) -> Iterator[pa.RecordBatch]:
    """The committed records of the batches in `data` with offsets in [start_offset,
    end_offset), as RecordBatches of about `max_rows` rows (never an empty one). `aborted`:
    the aborted transactions that may reach into the range (a transaction index's entries);
    malformed data raises CorruptBatchError."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for entry in aborted:
        spans.setdefault(entry.producer_id, []).append((entry.first_offset, entry.last_offset))
    walk = _c_walk if _C is not None else _python_walk
    for rows, columns in walk(
        data, start_offset, end_offset, spans, include_headers, max_rows, verify_crc
    ):
        yield _assemble(rows, columns, topic, partition, include_headers)


def _c_walk(data, start_offset, end_offset, spans, include_headers, max_rows, verify_crc):
    pos = 0
    crc = crc32c.crc32c if verify_crc else None
    while pos < len(data):
        out = _C.decode_columns(
            data,
            pos,
            start_offset,
            end_offset,
            max_rows,
            spans,
            include_headers,
            decompress,
            crc,
        )
        rows, pos = out[0], out[1]
        if rows:
            yield rows, _c_columns(rows, out[3:], include_headers)
        if rows < max_rows:
            return  # the walk stopped at the end of the range or of the data


def _binary(buffers, length: int, kind: pa.DataType) -> pa.Array:
    offsets, data, validity, nulls = buffers
    valid = None if validity is None else pa.py_buffer(validity)
    return pa.Array.from_buffers(
        kind, length, [valid, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
    )


def _c_columns(rows: int, out, include_headers: bool) -> list[pa.Array]:
    offsets, timestamps, types, keys, values, header_offsets, header_keys, header_values = out
    columns = [
        _binary(keys, rows, pa.binary()),
        _binary(values, rows, pa.binary()),
        pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), rows, [None, pa.py_buffer(timestamps)]),
        pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(types)]),
    ]
    if include_headers:
        count = (len(header_keys[0]) // 4) - 1
        pairs = pa.StructArray.from_arrays(
            [_binary(header_keys, count, pa.string()), _binary(header_values, count, pa.binary())],
            fields=list(HEADER_TYPE.value_type),
        )
        starts = pa.Array.from_buffers(pa.int32(), rows + 1, [None, pa.py_buffer(header_offsets)])
        columns.append(pa.ListArray.from_arrays(starts, pairs, type=HEADER_TYPE))
    return columns


def _assemble(
    rows: int, columns: list[pa.Array], topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    key, value, offset, timestamp, timestamp_type, *headers = columns
    name = topic.encode()
    starts = np.arange(0, (rows + 1) * len(name), len(name), dtype=np.int32)
    topics = pa.Array.from_buffers(
        pa.string(), rows, [None, pa.py_buffer(starts), pa.py_buffer(name * rows)]
    )
    partitions = pa.array(np.full(rows, partition, dtype=np.int32))
    arrays = [key, value, topics, partitions, offset, timestamp, timestamp_type, *headers]
    return pa.RecordBatch.from_arrays(arrays, schema=schema(include_headers))


def _aborted(spans: dict[int, list[tuple[int, int]]], header: BatchHeader) -> bool:
    """The transaction index rule: a transactional batch whose base offset lies in one of its
    producer's aborted spans [first offset, abort marker offset] was aborted."""
    return any(
        first <= header.base_offset <= last for first, last in spans.get(header.producer_id, ())
    )


def _python_walk(data, start_offset, end_offset, spans, include_headers, max_rows, verify_crc):
    """The same walk with the Python record decoder: per record objects, slow but exact."""
    view = memoryview(data)
    rows: list[tuple] = []
    for pos, header in batch_layout.iter_headers(view):
        if header.base_offset >= end_offset:
            break
        whole = view[pos : pos + header.size]
        skipped = header.is_control or (header.is_transactional and _aborted(spans, header))
        if skipped or header.last_offset < start_offset:
            if verify_crc:
                batch_layout.check_crc(whole, header)
            continue
        kind = int(header.log_append_time)
        for record in decode_batch(whole, verify_crc=verify_crc).records:
            if start_offset <= record.offset < end_offset:
                rows.append((record, kind))
        if len(rows) >= max_rows:
            yield len(rows), _python_columns(rows, include_headers)
            rows = []
    if rows:
        yield len(rows), _python_columns(rows, include_headers)


def _python_columns(rows: list[tuple], include_headers: bool) -> list[pa.Array]:
    columns = [
        pa.array([r.key for r, _ in rows], pa.binary()),
        pa.array([r.value for r, _ in rows], pa.binary()),
        pa.array([r.offset for r, _ in rows], pa.int64()),
        pa.array([r.timestamp * 1000 for r, _ in rows], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")
        ),
        pa.array([kind for _, kind in rows], pa.int32()),
    ]
    if include_headers:
        columns.append(
            pa.array([[{"key": k, "value": v} for k, v in r.headers] for r, _ in rows], HEADER_TYPE)
        )
    return columns
