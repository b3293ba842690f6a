"""Decoder robustness: garbage, truncated, mutated or oversized input only ever raises
CorruptBatchError, promptly and without unbounded allocation.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftline.raftlog import batch
from raftline.raftlog.batch import BatchHeader, CorruptBatchError
from raftline.raftlog.compression import compress
from raftline.raftlog.records import Codec, Record, build_batch, decode_batch, iter_batches

# A hang guard, not a speed target: each example must finish long before this.
pytestmark = pytest.mark.timeout(120)

fuzz_settings = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
VALID = {
    codec: build_batch(
        [
            Record(b"value %d" % i, key=b"k%d" % i, headers=[("h", b"x"), ("n", None)])
            for i in range(5)
        ],
        codec=codec,
        base_offset=10,
        timestamp=1_700_000_000_000,
    )
    for codec in Codec
}


def _sealed(
    section: bytes, *, codec: int = 0, records_count: int = 1, last_offset_delta: int = 0
) -> bytes:
    """A batch with a correct header and CRC around an arbitrary records section, so that the
    fuzzed bytes reach the record parser instead of failing the CRC check."""
    raw = bytearray(batch.HEADER_SIZE) + section
    batch.write_header(
        raw,
        BatchHeader(
            base_offset=0,
            batch_length=len(raw) - batch.LOG_OVERHEAD,
            leader_epoch=0,
            magic=batch.MAGIC,
            crc=0,
            attributes=codec,
            last_offset_delta=last_offset_delta,
            base_timestamp=0,
            max_timestamp=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            records_count=records_count,
        ),
    )
    return bytes(raw)


def _decode_or_corrupt(raw: bytes, **kwargs: object) -> None:
    """Decoding either succeeds or raises CorruptBatchError; anything else fails the test."""
    with contextlib.suppress(CorruptBatchError):
        decode_batch(raw, **kwargs)


@fuzz_settings
@given(st.binary(max_size=400))
def test_random_bytes_are_rejected_cleanly(raw: bytes) -> None:
    with pytest.raises(CorruptBatchError):
        decode_batch(raw)


@fuzz_settings
@given(
    section=st.binary(max_size=300),
    codec=st.sampled_from(Codec),
    records_count=st.integers(0, 2**31 - 1) | st.integers(0, 10),
    last_offset_delta=st.integers(0, 2**31 - 1) | st.integers(0, 10),
)
def test_random_records_sections_behind_a_valid_crc_decode_or_are_corrupt(
    section: bytes, codec: int, records_count: int, last_offset_delta: int
) -> None:
    raw = _sealed(
        section, codec=codec, records_count=records_count, last_offset_delta=last_offset_delta
    )
    _decode_or_corrupt(raw)


@fuzz_settings
@given(codec=st.sampled_from(Codec), data=st.data())
def test_bit_flips_in_a_valid_batch_decode_or_are_corrupt(codec: int, data: st.DataObject) -> None:
    raw = bytearray(VALID[codec])
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(raw) - 1))
        raw[position] ^= 1 << data.draw(st.integers(0, 7))
    _decode_or_corrupt(bytes(raw), verify_crc=False)
    _decode_or_corrupt(bytes(raw))


edits = st.lists(
    st.tuples(st.sampled_from(["set", "cut", "insert"]), st.integers(0), st.binary(max_size=8)),
    min_size=1,
    max_size=4,
)


def _edit_section_and_decode(codec: int, changes: list[tuple[str, int, bytes]]) -> None:
    """Overwrite, cut or insert bytes in a valid records section, reseal it, decode it."""
    section = bytearray(VALID[codec][batch.HEADER_SIZE :])
    for kind, where, payload in changes:
        position = where % (len(section) + 1)
        if kind == "set":
            section[position : position + len(payload)] = payload
        elif kind == "cut":
            del section[position : position + len(payload) + 1]
        else:
            section[position:position] = payload
    _decode_or_corrupt(_sealed(bytes(section), codec=codec, records_count=5, last_offset_delta=4))


@fuzz_settings
@given(codec=st.sampled_from(Codec), changes=edits)
def test_edited_records_sections_with_a_fixed_crc_decode_or_are_corrupt(
    codec: int, changes: list[tuple[str, int, bytes]]
) -> None:
    _edit_section_and_decode(codec, changes)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(codec=st.sampled_from(Codec), changes=edits)
def test_many_edited_records_sections_decode_or_are_corrupt(
    codec: int, changes: list[tuple[str, int, bytes]]
) -> None:
    _edit_section_and_decode(codec, changes)


@pytest.mark.parametrize("codec", list(Codec))
def test_every_truncation_is_corrupt(codec: int) -> None:
    raw = VALID[codec]
    for size in range(len(raw)):
        with pytest.raises(CorruptBatchError):
            decode_batch(raw[:size])


@pytest.mark.parametrize("codec", list(Codec))
def test_a_truncated_last_batch_of_a_concatenation_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptBatchError):
        list(iter_batches(VALID[codec] + VALID[codec][:-1]))


@pytest.mark.parametrize("codec", list(Codec))
def test_a_truncated_section_resealed_with_a_valid_crc_is_corrupt(codec: int) -> None:
    section = VALID[codec][batch.HEADER_SIZE :]
    for cut in range(1, len(section)):
        with pytest.raises(CorruptBatchError):
            decode_batch(_sealed(section[:-cut], codec=codec, records_count=5, last_offset_delta=4))


def _record(body: bytes) -> bytes:
    """Prefix a record body (< 64 bytes) with its zigzag length varint."""
    return bytes([len(body) * 2]) + body


# attributes, timestamp delta, offset delta, null key, value "v", no headers
BODY = bytes.fromhex("00 00 00 01 02 76 00")
RECORD = _record(BODY)
MAX_VARINT32 = bytes.fromhex("fe ff ff ff 0f")  # zigzag 2**31 - 1
FIELDS_TO_VALUE = BODY[:-1]


@pytest.mark.parametrize(
    ("section", "records_count", "reason"),
    [
        (RECORD, 2**31 - 1, "cannot fit"),
        (RECORD + b"\x00", 1, "left after"),
        (RECORD[:-1], 1, "out of range"),
        (MAX_VARINT32 + BODY, 1, "record length"),
        (_record(bytes(3) + MAX_VARINT32 + bytes(2)), 1, "runs past its record"),
        (_record(FIELDS_TO_VALUE + MAX_VARINT32), 1, "header count"),
        (_record(bytes.fromhex("00 00 00 03 02 76 00")), 1, "negative length"),
        (_record(FIELDS_TO_VALUE + b"\x80" * 5 + b"\x01" + bytes(6)), 1, "32 bits"),
        (_record(b"\x00" + b"\xff" * 10 + b"\x01" + bytes(12)), 1, "64 bits"),
        (_record(FIELDS_TO_VALUE + bytes.fromhex("02 01 02 00")), 1, "null header key"),
        (_record(FIELDS_TO_VALUE + bytes.fromhex("02 02 ff 01")), 1, "UTF-8"),
        (_record(bytes.fromhex("00 00 02 01 02 76 00")), 1, "offset delta"),
        (RECORD + RECORD, 2, "offset delta"),
    ],
)
def test_malformed_records_are_corrupt_with_a_reason(
    section: bytes, records_count: int, reason: str
) -> None:
    with pytest.raises(CorruptBatchError, match=reason):
        decode_batch(_sealed(section, records_count=records_count, last_offset_delta=0))


def test_a_well_formed_hand_made_record_decodes() -> None:
    (record,) = decode_batch(_sealed(RECORD)).records
    assert (record.key, record.value, record.headers) == (None, b"v", [])


def test_an_empty_batch_as_compaction_leaves_it_decodes_to_no_records() -> None:
    decoded = decode_batch(_sealed(b"", records_count=0, last_offset_delta=3))
    assert decoded.records == []
    assert decoded.header.offset_count == 4


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_ids_are_corrupt(codec: int) -> None:
    with pytest.raises(CorruptBatchError, match="codec"):
        decode_batch(_sealed(RECORD, codec=codec))


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_a_decompression_bomb_is_corrupt_under_the_bound(codec: int) -> None:
    # 8 MiB of zero-length-varint filler compresses to a few KiB.
    raw = _sealed(compress(codec, bytes(8 << 20)), codec=codec)
    with pytest.raises(CorruptBatchError, match=r"past|declares"):
        decode_batch(raw, max_decompressed=1 << 20)


def test_a_batch_claiming_more_than_the_batch_size_limit_is_corrupt() -> None:
    raw = bytearray(VALID[Codec.NONE])
    raw[8:12] = (batch.MAX_BATCH_SIZE).to_bytes(4, "big")
    with pytest.raises(CorruptBatchError, match="length"):
        decode_batch(bytes(raw))
