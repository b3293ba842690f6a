"""records.check_batch: a whole batch checked as strictly as decoding it, without record objects."""

import pytest

from raftline.raftlog import batch
from raftline.raftlog.records import (
    CorruptBatchError,
    Record,
    build_batch,
    check_batch,
    decode_batch,
)


def _restamp_crc(data: bytearray) -> bytes:
    data[batch.CRC_OFFSET : batch.CRC_OFFSET + 4] = batch.compute_crc(data).to_bytes(4, "big")
    return bytes(data)


def test_a_built_batch_passes_and_reports_its_header_and_largest_record() -> None:
    built = build_batch([Record(value=b"x" * 10), Record(value=b"y" * 300, key=b"k")])
    header, largest = check_batch(built)
    assert header.records_count == 2
    assert largest > 300  # the 300-byte value plus its key and record framing
    assert largest < 320


def test_a_broken_record_under_a_valid_crc_is_rejected_like_decode_rejects_it() -> None:
    data = bytearray(build_batch([Record(value=b"value", key=b"key")]))
    data[batch.HEADER_SIZE + 4] = 0x7F  # the key length becomes -64: no such length
    broken = _restamp_crc(data)
    with pytest.raises(CorruptBatchError):
        decode_batch(broken)
    with pytest.raises(CorruptBatchError):
        check_batch(broken)


def test_a_bad_crc_is_rejected() -> None:
    data = bytearray(build_batch([Record(value=b"value")]))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError):
        check_batch(bytes(data))


def test_trailing_bytes_after_the_batch_are_rejected() -> None:
    with pytest.raises(CorruptBatchError):
        check_batch(build_batch([Record(value=b"value")]) + b"\x00")
