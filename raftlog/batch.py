"""The fixed 61-byte header of a Kafka RecordBatch v2, read and stamped without decoding records.

Owns header layout, CRC-32C checks and the in-place stamping of base offset and Raft term.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c


class CorruptBatchError(ValueError):
    """Bytes that are not a valid record batch: garbage, truncated, oversized or bad CRC."""


MAGIC = 2
LOG_OVERHEAD = 12  # baseOffset + batchLength; on-disk size = batchLength + 12
HEADER_SIZE = 61  # RECORD_BATCH_OVERHEAD: everything before the records section
CRC_OFFSET = 17
CRC_START = 21  # CRC-32C covers attributes .. end of batch
MAX_TIMESTAMP_OFFSET = 35
MAX_BATCH_SIZE = 16 * 1024 * 1024  # larger than the 10 MB message limit plus overhead

# Attribute bits.
CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08  # set: LogAppendTime
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

# >q i i b I h i q q q h i i : baseOffset .. recordsCount, big-endian like Java's ByteBuffer.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_PREFIX = struct.Struct(">qi")
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_MAX_TIMESTAMP = struct.Struct(">q")


class BatchHeader(NamedTuple):
    """The header fields in layout order. A NamedTuple: built from one unpack without
    per-field setattr, which matters on every read, scan and recovery path."""

    base_offset: int
    batch_length: int
    leader_epoch: int  # Raftline stores the Raft term here
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies on disk and on the wire."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def offset_count(self) -> int:
        return self.last_offset_delta + 1

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Read the header at `pos`, checking magic and lengths but not the CRC."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatchError(f"truncated batch header at {pos}: {len(buf) - pos} bytes")
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptBatchError(f"unsupported magic {header.magic} at {pos}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or header.size > MAX_BATCH_SIZE:
        raise CorruptBatchError(f"implausible batch length {header.batch_length} at {pos}")
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise CorruptBatchError(f"negative offset delta or record count at {pos}")
    return header


def batch_size_at(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """Size of the batch starting at `pos`, or None if fewer than 12 bytes remain."""
    if len(buf) - pos < LOG_OVERHEAD:
        return None
    _, length = _PREFIX.unpack_from(buf, pos)
    return length + LOG_OVERHEAD


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    return crc32c.crc32c(memoryview(batch)[CRC_START:])


def check_crc(batch: bytes | bytearray | memoryview, header: BatchHeader | None = None) -> None:
    header = header or parse_header(batch)
    if len(batch) < header.size:
        raise CorruptBatchError(f"batch truncated: {len(batch)} of {header.size} bytes")
    actual = crc32c.crc32c(memoryview(batch)[CRC_START : header.size])
    if actual != header.crc:
        raise CorruptBatchError(f"CRC mismatch: stored {header.crc:#010x}, computed {actual:#010x}")


def write_header(batch: bytearray, header: BatchHeader) -> None:
    """Pack `header` into the first 61 bytes of `batch`, then compute and store the CRC.

    `header.crc` is ignored; the records section must already follow the header.
    """
    _HEADER.pack_into(
        batch,
        0,
        header.base_offset,
        header.batch_length,
        header.leader_epoch,
        header.magic,
        0,
        header.attributes,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.records_count,
    )
    _CRC.pack_into(batch, CRC_OFFSET, compute_crc(batch))


def stamp(batch: bytearray, base_offset: int, term: int) -> None:
    """Set base offset and Raft term in place. Both lie outside the CRC, so it stays valid."""
    _BASE_OFFSET.pack_into(batch, 0, base_offset)
    _LEADER_EPOCH.pack_into(batch, LOG_OVERHEAD, term)


def stamp_log_append_time(batch: bytearray, timestamp: int) -> None:
    """Make the batch LogAppendTime with `timestamp` (as a broker does on append for topics so
    configured). Attributes and max timestamp lie under the CRC, so it is recomputed."""
    (attributes,) = _ATTRIBUTES.unpack_from(batch, CRC_START)
    _ATTRIBUTES.pack_into(batch, CRC_START, attributes | TIMESTAMP_TYPE_MASK)
    _MAX_TIMESTAMP.pack_into(batch, MAX_TIMESTAMP_OFFSET, timestamp)
    _CRC.pack_into(batch, CRC_OFFSET, compute_crc(batch))


def iter_headers(buf: bytes | bytearray | memoryview):
    """Yield (position, header) for each whole batch in a concatenation of batches."""
    pos = 0
    end = len(buf)
    while pos < end:
        header = parse_header(buf, pos)
        if pos + header.size > end:
            raise CorruptBatchError(f"batch at {pos} runs past the end of the buffer")
        yield pos, header
        pos += header.size
