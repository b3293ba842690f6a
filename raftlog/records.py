"""Encoding and decoding of whole Kafka RecordBatch v2 batches: records, headers, control batches.

Owns the varint/zigzag record layout, control record types and the strict, bounded decoder; its
per-record loops run in C (raftlog/_speedups.c) when that is built, else in Python here.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from types import ModuleType
from typing import Any, NamedTuple

from raftline.raftlog import batch, speedups
from raftline.raftlog.batch import BatchHeader, CorruptBatchError
from raftline.raftlog.compression import DEFAULT_MAX_DECOMPRESSED, BytesLike, Codec
from raftline.raftlog.compression import compress as compress_section
from raftline.raftlog.compression import decompress as decompress_section

__all__ = [
    "ABORT",
    "COMMIT",
    "RAFT_CONFIG",
    "RAFT_NOOP",
    "TIERED",
    "Codec",
    "ControlType",
    "CorruptBatchError",
    "DecodedBatch",
    "DecodedRecord",
    "Header",
    "Record",
    "batch_values",
    "build_batch",
    "build_batch_buffer",
    "build_control_batch",
    "build_txn_marker",
    "check_batch",
    "control_type_of",
    "coordinator_epoch_of",
    "decode_batch",
    "iter_batches",
]


class ControlType(IntEnum):
    """Type field of a control record's key. Kafka defines 0-6; Raftline's own start at 100."""

    ABORT = 0
    COMMIT = 1
    RAFT_NOOP = 100  # the empty entry a new Raft leader appends for its term
    RAFT_CONFIG = 101  # a Raft membership configuration; the value is its JSON
    TIERED = 102  # a change of the partition's tiered-storage manifest; the value is its JSON
    PRODUCER_CLOCK = 103  # a partition leader's wall clock (the batch timestamp), for expiry


ABORT = ControlType.ABORT
COMMIT = ControlType.COMMIT
RAFT_NOOP = ControlType.RAFT_NOOP
RAFT_CONFIG = ControlType.RAFT_CONFIG
TIERED = ControlType.TIERED

Header = tuple[str, bytes | None]

_CONTROL_KEY = struct.Struct(">hh")  # version 0, type
_TXN_MARKER_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch
_INT32_MAX = 2**31 - 1
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_NULL_LENGTH = b"\x01"  # zigzag(-1): a null key, value or header value
# Smallest possible record: length, attributes, timestamp delta, offset delta, key length,
# value length, header count, one byte each.
_MIN_RECORD_SIZE = 7


@dataclass(slots=True, frozen=True)
class Record:
    """A record to encode. Unset timestamp: the batch's; unset offset delta: its position."""

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[Header] = ()
    timestamp: int | None = None  # milliseconds since the epoch
    offset_delta: int | None = None


class DecodedRecord(NamedTuple):
    """A record read from a batch, with its absolute offset and timestamp (a named tuple:
    built once per fetched record, and a tuple is several times cheaper than a frozen
    dataclass to make)."""

    offset: int
    timestamp: int  # the batch's log-append time when the batch uses LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: list[Header]


class Keep(IntEnum):
    """What a walk over a records section builds besides checking every field."""

    CHECK = 0  # nothing: the produce path checks batches it then stores untouched
    RECORDS = 1  # a DecodedRecord per record
    VALUES = 2  # each record's value only: a consumer that wants payloads skips the rest


@dataclass(slots=True, frozen=True)
class DecodedBatch:
    """A whole batch: its header and its records in offset order."""

    header: BatchHeader
    records: list[DecodedRecord]

    @property
    def control_type(self) -> int | None:
        """The control record type of a control batch; None for a data batch."""
        if not self.header.is_control:
            return None
        return control_type_of(self.records)


def control_type_of(records: Sequence[DecodedRecord]) -> int:
    """Type of the (single) control record of a control batch, validating its key."""
    if not records:
        raise CorruptBatchError("control batch without a control record")
    return _version_0_field(_CONTROL_KEY, records[0].key, "control record key", "type")


def _version_0_field(layout: struct.Struct, raw: bytes | None, what: str, field: str) -> int:
    """The field after the int16 version of a version-0 `layout` (control key, marker value)."""
    if raw is None or len(raw) < layout.size:
        raise CorruptBatchError(f"{what} shorter than version + {field}")
    version, value = layout.unpack_from(raw)
    if version != 0:
        raise CorruptBatchError(f"unsupported {what} version {version}")
    return value


# ---------------------------------------------------------------------------- varints


def _encode_unsigned(u: int) -> bytes:
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


# Zigzag encodings of every value up to 2**13 in magnitude: lengths and deltas of small
# records hit this table instead of a loop.
_SMALL_ZIGZAG = tuple(_encode_unsigned(u) for u in range(1 << 14))


def _zigzag(v: int) -> bytes:
    u = (v << 1) ^ (v >> 63)  # 64-bit zigzag; equals the 32-bit form for int32 values
    return _SMALL_ZIGZAG[u] if u < 0x4000 else _encode_unsigned(u)


def _read_zigzag(data: bytes, pos: int, bits: int = 32) -> tuple[int, int]:
    """Read a zigzag varint of at most `bits` bits (32: Java's readVarint, 64: readVarlong).

    Raises IndexError when the data runs out, CorruptBatchError when the varint is too long.
    """
    b = data[pos]
    if b < 0x80:  # one byte: the common case for deltas, counts and short lengths
        return (b >> 1) ^ -(b & 1), pos + 1
    u = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = data[pos]
        u |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= bits:
            raise CorruptBatchError(f"varint longer than {bits} bits at {pos}")
    if u >> bits:
        raise CorruptBatchError(f"varint exceeds {bits} bits at {pos}")
    return (u >> 1) ^ -(u & 1), pos + 1


# ---------------------------------------------------------------------------- encoding


def _bytes_field(data: bytes | None, parts: list[bytes]) -> int:
    """Append a nullable length-prefixed field; return its encoded size."""
    if data is None:
        parts.append(_NULL_LENGTH)
        return 1
    size = len(data)
    if size > _INT32_MAX:
        raise ValueError(f"field of {size} bytes exceeds the int32 length limit")
    prefix = _zigzag(size)
    parts.append(prefix)
    parts.append(data)
    return len(prefix) + size


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def build_batch(records: Sequence[Record | bytes], **options: Any) -> bytes:
    """The batch of build_batch_buffer (same arguments, see there) as bytes."""
    return bytes(build_batch_buffer(records, **options))


def build_batch_buffer(
    records: Sequence[Record | bytes],
    *,
    base_offset: int = 0,
    codec: int = Codec.NONE,
    timestamp: int | None = None,
    log_append_time: int | None = None,
    producer_id: int = batch.NO_PRODUCER_ID,
    producer_epoch: int = batch.NO_PRODUCER_EPOCH,
    base_sequence: int = batch.NO_SEQUENCE,
    transactional: bool = False,
    leader_epoch: int = -1,
    control: bool = False,
) -> bytearray:
    """Encode `records` as one batch, byte for byte what a Kafka v2 producer sends, in the
    bytearray it was built in: a sender that hands it on as it is saves build_batch's copy
    into bytes (a pass over every value: 1 MB for a 1 MB message).

    An item is a Record or plain bytes: a record with only that value (no key, no headers,
    the batch timestamp, its position as offset delta). `timestamp` is used for records
    without one (default: now). `log_append_time` set makes the batch LogAppendTime, every
    record then reads back with that time. `leader_epoch` is the partition leader epoch field,
    which Raftline uses for the Raft term. `control` marks a control batch (use
    build_control_batch). Out-of-range input raises ValueError.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    Codec(codec)  # ValueError for an unknown codec id
    default_timestamp = _now_ms() if timestamp is None else timestamp
    out, last_offset_delta, base_timestamp, max_timestamp = _encode_records(
        records, default_timestamp, batch.HEADER_SIZE
    )
    attributes = codec
    if codec != Codec.NONE:
        section = compress_section(codec, memoryview(out)[batch.HEADER_SIZE :])
        out = bytearray(batch.HEADER_SIZE)
        out += section
    if log_append_time is not None:
        attributes |= batch.TIMESTAMP_TYPE_MASK
        max_timestamp = log_append_time
    if transactional:
        attributes |= batch.TRANSACTIONAL_MASK
    if control:
        attributes |= batch.CONTROL_MASK
    if len(out) > batch.MAX_BATCH_SIZE:
        raise ValueError(f"batch of {len(out)} bytes exceeds {batch.MAX_BATCH_SIZE}")
    header = BatchHeader(
        base_offset=base_offset,
        batch_length=len(out) - batch.LOG_OVERHEAD,
        leader_epoch=leader_epoch,
        magic=batch.MAGIC,
        crc=0,
        attributes=attributes,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=len(records),
    )
    try:
        batch.write_header(out, header)
    except struct.error as err:  # a header field outside its fixed width
        raise ValueError(f"batch header field out of range: {err}") from err
    return out


def _py_encode_records(
    records: Sequence[Record | bytes], default_timestamp: int, reserve: int
) -> tuple[bytearray, int, int, int]:
    """The records section of a non-empty batch of `records` after `reserve` zero bytes (room
    for the batch header), with its last offset delta, base timestamp (the first record's) and
    max timestamp. Out-of-range input: ValueError."""
    first = records[0]
    first_timestamp = None if isinstance(first, bytes) else first.timestamp
    base_timestamp = default_timestamp if first_timestamp is None else first_timestamp
    max_timestamp = _INT64_MIN
    previous_delta = -1
    parts: list[bytes] = [bytes(reserve)]
    zigzag, bytes_field = _zigzag, _bytes_field  # locals: this loop is the hot path
    for position, record in enumerate(records):
        if isinstance(record, bytes):
            value, key, headers, record_timestamp, offset_delta = record, None, (), None, None
        else:
            value, key, headers = record.value, record.key, record.headers
            record_timestamp, offset_delta = record.timestamp, record.offset_delta
        if offset_delta is None:
            offset_delta = position
        if not previous_delta < offset_delta <= _INT32_MAX:
            raise ValueError(f"offset deltas must increase within int32: {offset_delta}")
        previous_delta = offset_delta
        if record_timestamp is None:
            record_timestamp = default_timestamp
        if record_timestamp > max_timestamp:
            max_timestamp = record_timestamp
        timestamp_delta = record_timestamp - base_timestamp
        if not _INT64_MIN <= timestamp_delta <= _INT64_MAX:
            raise ValueError(f"timestamp delta {timestamp_delta} exceeds int64")
        length_slot = len(parts)
        timestamp_field = zigzag(timestamp_delta)
        offset_field = zigzag(offset_delta)
        count_field = zigzag(len(headers))
        parts += (b"", b"\x00", timestamp_field, offset_field)
        size = 1 + len(timestamp_field) + len(offset_field) + len(count_field)
        size += bytes_field(key, parts)
        size += bytes_field(value, parts)
        parts.append(count_field)
        for header_key, header_value in headers:
            size += bytes_field(header_key.encode(), parts)
            size += bytes_field(header_value, parts)
        parts[length_slot] = zigzag(size)  # known only once the body is laid out
    return bytearray().join(parts), previous_delta, base_timestamp, max_timestamp


def build_control_batch(
    control_type: int,
    value: bytes,
    *,
    base_offset: int = 0,
    timestamp: int | None = None,
    producer_id: int = batch.NO_PRODUCER_ID,
    producer_epoch: int = batch.NO_PRODUCER_EPOCH,
    transactional: bool = False,
    leader_epoch: int = -1,
) -> bytes:
    """A control batch of one record: key = int16 version 0 + int16 `control_type`."""
    key = _CONTROL_KEY.pack(0, control_type)
    return build_batch(
        [Record(value=value, key=key)],
        base_offset=base_offset,
        timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=transactional,
        leader_epoch=leader_epoch,
        control=True,
    )


def build_txn_marker(
    commit: bool,
    coordinator_epoch: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_offset: int = 0,
    timestamp: int | None = None,
    leader_epoch: int = -1,
) -> bytes:
    """A COMMIT or ABORT transaction marker: a transactional control batch whose value is
    int16 version 0 + int32 coordinator epoch (Kafka's EndTransactionMarker)."""
    return build_control_batch(
        ControlType.COMMIT if commit else ControlType.ABORT,
        _TXN_MARKER_VALUE.pack(0, coordinator_epoch),
        base_offset=base_offset,
        timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        leader_epoch=leader_epoch,
    )


def coordinator_epoch_of(marker_value: bytes | None) -> int:
    """The coordinator epoch in a transaction marker's record value."""
    return _version_0_field(_TXN_MARKER_VALUE, marker_value, "transaction marker value", "epoch")


# ---------------------------------------------------------------------------- decoding


def _whole_batch_header(buf: BytesLike) -> BatchHeader:
    """The header of a buffer that must hold exactly one batch, nothing more or less."""
    header = batch.parse_header(buf)
    if len(buf) != header.size:
        raise CorruptBatchError(f"buffer of {len(buf)} bytes holds a batch of {header.size}")
    return header


def decode_batch(
    buf: BytesLike,
    *,
    verify_crc: bool = True,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
) -> DecodedBatch:
    """Decode exactly one batch. Anything malformed raises CorruptBatchError."""
    header = _whole_batch_header(buf)
    return _decode(memoryview(buf), header, verify_crc, max_decompressed)


def check_batch(
    buf: BytesLike, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED
) -> tuple[BatchHeader, int]:
    """Check exactly one batch as strictly as decode_batch does (CRC, every record field)
    without building records. Returns its header and its largest record's encoded size."""
    header = _whole_batch_header(buf)
    _, largest = _walk(memoryview(buf), header, True, max_decompressed, Keep.CHECK)
    return header, largest


def batch_values(
    buf: BytesLike,
    header: BatchHeader,
    *,
    verify_crc: bool = True,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
) -> list[bytes | None]:
    """The values of the records of one batch (`header` parsed from `buf`), in offset order,
    checked as strictly as decode_batch checks them but without building record objects."""
    values, _ = _walk(memoryview(buf), header, verify_crc, max_decompressed, Keep.VALUES)
    return values


def iter_batches(
    buf: BytesLike,
    *,
    verify_crc: bool = True,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
) -> Iterator[DecodedBatch]:
    """Decode each batch of a concatenation (a segment file, a fetch response)."""
    view = memoryview(buf)
    for pos, header in batch.iter_headers(view):
        yield _decode(view[pos : pos + header.size], header, verify_crc, max_decompressed)


def _decode(
    view: memoryview, header: BatchHeader, verify_crc: bool, max_decompressed: int
) -> DecodedBatch:
    records, _ = _walk(view, header, verify_crc, max_decompressed, Keep.RECORDS)
    return DecodedBatch(header, records)


def _walk(
    view: memoryview, header: BatchHeader, verify_crc: bool, max_decompressed: int, keep: Keep
) -> tuple[list[Any], int]:
    if verify_crc:
        batch.check_crc(view, header)
    codec = header.codec
    data: BytesLike = view[batch.HEADER_SIZE :]
    if codec != Codec.NONE:
        data = decompress_section(codec, data, max_decompressed)
    if header.records_count * _MIN_RECORD_SIZE > len(data):
        raise CorruptBatchError(f"{header.records_count} records cannot fit in {len(data)} bytes")
    return _decode_records(data, header, keep)


def _py_decode_records(
    section: BytesLike, header: BatchHeader, keep: Keep = Keep.RECORDS
) -> tuple[list[Any], int]:
    """Every record of a records section (or what `keep` asks of each), checked field by
    field, and the largest record's encoded size."""
    try:
        return _walk_records(bytes(section), header, keep)
    except IndexError as err:  # a varint ran off the end of the section
        raise CorruptBatchError("record runs past the end of the records section") from err


def _walk_records(data: bytes, header: BatchHeader, keep: Keep) -> tuple[list[Any], int]:
    end = len(data)
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    append_time = header.max_timestamp if header.log_append_time else None
    last_offset_delta = header.last_offset_delta
    previous_delta = -1
    records: list[Any] = []
    largest = 0
    pos = 0
    read_zigzag = _read_zigzag  # a local: this loop is the hot path
    new_record = tuple.__new__  # DecodedRecord's own __new__ adds a Python-level call
    for _ in range(header.records_count):
        length, pos = read_zigzag(data, pos)
        record_end = pos + length
        if length < _MIN_RECORD_SIZE - 1 or record_end > end:
            raise CorruptBatchError(f"record length {length} out of range at {pos}")
        if length > largest:
            largest = length
        pos += 1  # record attributes: no bits are defined
        timestamp_delta, pos = read_zigzag(data, pos, 64)
        offset_delta, pos = read_zigzag(data, pos)
        if not previous_delta < offset_delta <= last_offset_delta:
            raise CorruptBatchError(f"offset delta {offset_delta} out of order or range")
        previous_delta = offset_delta
        fields: list[bytes | None] = []
        for _ in range(2):  # key, then value: a length (-1: null) and that many bytes
            size, pos = read_zigzag(data, pos)
            if size < 0:
                if size != -1:
                    raise CorruptBatchError(f"negative length {size}")
                fields.append(None)
                continue
            if pos + size > record_end:
                raise CorruptBatchError(f"field of {size} bytes runs past its record")
            if keep:
                fields.append(data[pos : pos + size])
            pos += size
        header_count, pos = read_zigzag(data, pos)
        headers: list[Header] = []
        if header_count:
            if not 0 <= header_count <= (record_end - pos) // 2:
                raise CorruptBatchError(f"header count {header_count} out of range")
            for _ in range(header_count):
                header_key, pos = _read_bytes(data, pos, record_end)
                if header_key is None:
                    raise CorruptBatchError("null header key")
                header_value, pos = _read_bytes(data, pos, record_end)
                try:
                    headers.append((header_key.decode(), header_value))
                except UnicodeDecodeError as err:
                    raise CorruptBatchError("header key is not UTF-8") from err
        if pos != record_end:
            raise CorruptBatchError(f"record declares {length} bytes but holds a different size")
        if keep is Keep.VALUES:
            records.append(fields[1])
        elif keep is Keep.RECORDS:
            timestamp = base_timestamp + timestamp_delta if append_time is None else append_time
            records.append(
                new_record(
                    DecodedRecord,
                    (base_offset + offset_delta, timestamp, fields[0], fields[1], headers),
                )
            )
    if pos != end:
        raise CorruptBatchError(f"{end - pos} bytes left after {header.records_count} records")
    return records, largest


def _read_bytes(data: bytes, pos: int, limit: int) -> tuple[bytes | None, int]:
    size, pos = _read_zigzag(data, pos)
    if size < 0:
        if size != -1:
            raise CorruptBatchError(f"negative length {size}")
        return None, pos
    if pos + size > limit:
        raise CorruptBatchError(f"field of {size} bytes runs past its record")
    return data[pos : pos + size], pos + size


# ---------------------------------------------------------------------------- C accelerator


def _speedups_module() -> ModuleType | None:
    """The C twins of the record loops (raftline.raftlog._speedups), unless they are not built
    or RAFTLINE_PURE_PYTHON=1 asks for the Python ones."""
    if speedups.C is not None:
        speedups.C.bind(Record, DecodedRecord, CorruptBatchError)
    return speedups.C


@contextmanager
def python_loops() -> Iterator[None]:
    """Run the pure-Python record loops meanwhile, C built or not: benchmarks and tests hold
    the two side by side. Not thread-safe (it swaps module globals)."""
    global _encode_records, _decode_records
    saved = _encode_records, _decode_records
    _encode_records, _decode_records = _py_encode_records, _py_decode_records
    try:
        yield
    finally:
        _encode_records, _decode_records = saved


_SPEEDUPS = _speedups_module()
SPEEDUPS = _SPEEDUPS is not None  # True: the C record loops are in use
_encode_records = _SPEEDUPS.encode_records if _SPEEDUPS else _py_encode_records
_decode_records = _SPEEDUPS.decode_records if _SPEEDUPS else _py_decode_records
