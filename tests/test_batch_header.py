"""Specification of the 61-byte batch header: layout, CRC coverage, stamping and iteration."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftline.raftlog import batch
from raftline.raftlog.batch import CorruptBatchError
from raftline.raftlog.records import Record, build_batch


def _sample(**kwargs: object) -> bytearray:
    records = [Record(b"value-%d" % i, key=b"k", timestamp=1_000 + i) for i in range(3)]
    return bytearray(build_batch(records, **kwargs))


def test_header_fields_sit_at_the_offsets_kafka_defines() -> None:
    raw = _sample(base_offset=7, leader_epoch=3, producer_id=11, producer_epoch=2, base_sequence=5)
    assert struct.unpack_from(">q", raw, 0)[0] == 7
    assert struct.unpack_from(">i", raw, 8)[0] == len(raw) - 12
    assert struct.unpack_from(">i", raw, 12)[0] == 3
    assert raw[16] == 2
    assert struct.unpack_from(">i", raw, 23)[0] == 2  # last offset delta
    assert struct.unpack_from(">q", raw, 27)[0] == 1_000  # base timestamp
    assert struct.unpack_from(">q", raw, 35)[0] == 1_002  # max timestamp
    assert struct.unpack_from(">qhi", raw, 43) == (11, 2, 5)
    assert struct.unpack_from(">i", raw, 57)[0] == 3


def test_parse_header_reads_back_what_was_written() -> None:
    header = batch.parse_header(_sample(base_offset=40, leader_epoch=9))
    assert (header.base_offset, header.leader_epoch, header.records_count) == (40, 9, 3)
    assert (header.last_offset, header.offset_count) == (42, 3)


def test_crc_is_crc32c_of_bytes_21_to_the_end() -> None:
    raw = _sample()
    assert batch.parse_header(raw).crc == batch.compute_crc(raw)
    assert batch.parse_header(raw).crc == crc32c.crc32c(bytes(raw[21:]))


@pytest.mark.parametrize("position", [*range(0, 8), *range(12, 16)])
def test_crc_ignores_base_offset_and_leader_epoch_bytes(position: int) -> None:
    raw = _sample()
    raw[position] ^= 0xFF
    batch.check_crc(raw)


@given(st.data())
def test_crc_breaks_when_any_byte_from_21_on_changes(data: st.DataObject) -> None:
    raw = _sample()
    header = batch.parse_header(raw)  # before the change: some header bytes are also checked
    position = data.draw(st.integers(batch.CRC_START, len(raw) - 1))
    raw[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptBatchError, match="CRC"):
        batch.check_crc(raw, header)


@given(base_offset=st.integers(0, 2**63 - 1), term=st.integers(-(2**31), 2**31 - 1))
def test_stamp_sets_offset_and_term_and_keeps_the_crc_valid(base_offset: int, term: int) -> None:
    raw = _sample()
    batch.stamp(raw, base_offset, term)
    header = batch.parse_header(raw)
    assert (header.base_offset, header.leader_epoch) == (base_offset, term)
    batch.check_crc(raw, header)


def test_write_header_stores_a_crc_over_the_body() -> None:
    raw = _sample()
    header = batch.parse_header(raw)
    raw[17:21] = b"\x00\x00\x00\x00"
    batch.write_header(raw, header)
    assert batch.parse_header(raw).crc == header.crc


def test_stamp_log_append_time_sets_type_and_max_timestamp_with_a_fresh_crc() -> None:
    raw = _sample()
    batch.stamp_log_append_time(raw, 9_999)
    header = batch.parse_header(raw)
    assert header.log_append_time and header.max_timestamp == 9_999
    assert header.attributes & ~batch.TIMESTAMP_TYPE_MASK == 0
    batch.check_crc(raw, header)


def test_parse_header_rejects_a_short_buffer() -> None:
    with pytest.raises(CorruptBatchError, match="truncated"):
        batch.parse_header(_sample()[:60])


def test_parse_header_rejects_another_magic() -> None:
    raw = _sample()
    raw[16] = 1
    with pytest.raises(CorruptBatchError, match="magic"):
        batch.parse_header(raw)


@pytest.mark.parametrize("length", [-1, 0, 48, batch.MAX_BATCH_SIZE])
def test_parse_header_rejects_implausible_lengths(length: int) -> None:
    raw = _sample()
    struct.pack_into(">i", raw, 8, length)
    with pytest.raises(CorruptBatchError, match="length"):
        batch.parse_header(raw)


def test_check_crc_rejects_a_truncated_batch() -> None:
    with pytest.raises(CorruptBatchError, match="truncated"):
        batch.check_crc(_sample()[:-1])


def test_iter_headers_walks_a_concatenation() -> None:
    first, second = _sample(base_offset=0), _sample(base_offset=3)
    found = [(pos, h.base_offset) for pos, h in batch.iter_headers(first + second)]
    assert found == [(0, 0), (len(first), 3)]


def test_iter_headers_rejects_a_torn_last_batch() -> None:
    raw = _sample() + _sample()[:-5]
    with pytest.raises(CorruptBatchError, match="past the end"):
        list(batch.iter_headers(raw))


def test_batch_size_at_needs_only_the_length_prefix() -> None:
    raw = _sample()
    assert batch.batch_size_at(raw[:12]) == len(raw)
    assert batch.batch_size_at(raw[:11]) is None
