"""Specification of RecordBatch v2 encoding: what build_batch writes, decode_batch reads back."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.raftlog import batch
from raftline.raftlog.batch import CorruptBatchError
from raftline.raftlog.records import (
    ABORT,
    COMMIT,
    RAFT_CONFIG,
    RAFT_NOOP,
    Codec,
    ControlType,
    DecodedBatch,
    Record,
    build_batch,
    build_batch_buffer,
    build_control_batch,
    build_txn_marker,
    coordinator_epoch_of,
    decode_batch,
    iter_batches,
    python_loops,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
payloads = st.none() | st.binary(max_size=200)
headers = st.lists(st.tuples(st.text(max_size=12), payloads), max_size=4)
# Half-range timestamps so that every delta from the first record still fits in int64.
timestamps = st.integers(-(2**62), 2**62 - 1) | st.integers(1_600_000_000_000, 1_800_000_000_000)


@st.composite
def record_lists(draw: st.DrawFn) -> list[Record]:
    count = draw(st.integers(1, 8))
    offset_delta = draw(st.integers(0, 50))
    records = []
    for _ in range(count):
        records.append(
            Record(
                value=draw(payloads),
                key=draw(payloads),
                headers=draw(headers),
                timestamp=draw(timestamps),
                offset_delta=offset_delta,
            )
        )
        offset_delta += draw(st.integers(1, 70_000))
    return records


batch_options = st.fixed_dictionaries(
    {
        "base_offset": st.integers(0, 2**62),
        "codec": st.sampled_from(Codec),
        "producer_id": INT64,
        "producer_epoch": st.integers(-(2**15), 2**15 - 1),
        "base_sequence": st.integers(-(2**31), 2**31 - 1),
        "transactional": st.booleans(),
        "leader_epoch": st.integers(-(2**31), 2**31 - 1),
        "log_append_time": st.none() | INT64,
    }
)


def _as_records(decoded: DecodedBatch) -> list[Record]:
    base = decoded.header.base_offset
    return [
        Record(r.value, r.key, r.headers, r.timestamp, r.offset - base) for r in decoded.records
    ]


@settings(max_examples=150)
@given(records=record_lists(), options=batch_options)
def test_every_field_survives_a_round_trip(records: list[Record], options: dict) -> None:
    decoded = decode_batch(build_batch(records, **options))
    header = decoded.header
    append_time = options["log_append_time"]
    assert header.codec == options["codec"]
    assert header.is_transactional == options["transactional"]
    assert header.log_append_time == (append_time is not None)
    assert not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        options["producer_id"],
        options["producer_epoch"],
        options["base_sequence"],
    )
    assert header.leader_epoch == options["leader_epoch"]
    assert header.records_count == len(records)
    assert header.last_offset_delta == records[-1].offset_delta
    assert header.base_timestamp == records[0].timestamp
    expected_max = max(r.timestamp for r in records) if append_time is None else append_time
    assert header.max_timestamp == expected_max
    for sent, got in zip(records, decoded.records, strict=True):
        assert got.offset == options["base_offset"] + sent.offset_delta
        assert got.timestamp == (sent.timestamp if append_time is None else append_time)
        assert (got.key, got.value, got.headers) == (sent.key, sent.value, list(sent.headers))


@settings(max_examples=60)
@given(records=record_lists(), codec=st.sampled_from(Codec))
def test_reencoding_a_decoded_batch_gives_the_same_bytes(records: list[Record], codec: int) -> None:
    raw = build_batch(records, codec=codec, base_offset=9)
    assert build_batch(_as_records(decode_batch(raw)), codec=codec, base_offset=9) == raw


def test_a_record_is_laid_out_byte_for_byte_as_kafka_defines() -> None:
    raw = build_batch([Record(b"v", headers=[("h", b"1")], timestamp=5)])
    # length 11, attributes, timestamp delta 0, offset delta 0, null key (-1), value length 1,
    # "v", one header: key length 1 "h", value length 1 "1"; lengths are zigzag varints.
    assert raw[batch.HEADER_SIZE :] == bytes.fromhex("16 00 00 00 01 02 76 02 02 68 02 31")


def test_a_64_byte_value_takes_a_two_byte_length_varint() -> None:
    raw = build_batch([Record(b"x" * 64, timestamp=0)])
    section = raw[batch.HEADER_SIZE :]
    # record length 71 (2 bytes), attributes, timestamp delta, offset delta, null key
    assert section[6:8] == b"\x80\x01"  # zigzag(64) = 128
    assert decode_batch(raw).records[0].value == b"x" * 64


def test_null_and_empty_key_and_value_stay_distinct() -> None:
    records = [Record(None, key=b""), Record(b"", key=None)]
    got = decode_batch(build_batch(records, timestamp=0)).records
    assert [(r.key, r.value) for r in got] == [(b"", None), (None, b"")]


def test_headers_keep_order_duplicates_and_null_values() -> None:
    sent = [("b", b"1"), ("a", None), ("b", b"2"), ("ünï", b"")]
    got = decode_batch(build_batch([Record(b"v", headers=sent)])).records[0]
    assert got.headers == sent


def test_records_without_timestamp_take_the_batch_timestamp() -> None:
    decoded = decode_batch(build_batch([Record(b"a"), Record(b"b", timestamp=7)], timestamp=3))
    assert [r.timestamp for r in decoded.records] == [3, 7]
    assert decoded.header.base_timestamp == 3


def test_negative_timestamp_deltas_are_allowed() -> None:
    decoded = decode_batch(build_batch([Record(b"a", timestamp=100), Record(b"b", timestamp=40)]))
    assert [r.timestamp for r in decoded.records] == [100, 40]
    assert decoded.header.max_timestamp == 100


def test_log_append_time_sets_the_type_bit_and_every_record_time() -> None:
    raw = build_batch([Record(b"a", timestamp=1), Record(b"b", timestamp=2)], log_append_time=99)
    decoded = decode_batch(raw)
    assert decoded.header.attributes & batch.TIMESTAMP_TYPE_MASK
    assert [r.timestamp for r in decoded.records] == [99, 99]


def test_offsets_follow_the_deltas_with_gaps() -> None:
    records = [Record(b"a", offset_delta=2), Record(b"b", offset_delta=5)]
    decoded = decode_batch(build_batch(records, base_offset=100))
    assert [r.offset for r in decoded.records] == [102, 105]
    assert decoded.header.last_offset == 105


@pytest.mark.parametrize("deltas", [(0, 0), (3, 1), (-1,), (2**31,)])
def test_build_batch_rejects_offset_deltas_out_of_order_or_range(deltas: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="offset delta"):
        build_batch([Record(b"v", offset_delta=d) for d in deltas])


def test_build_batch_rejects_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])


@pytest.mark.parametrize(
    "options",
    [{"base_offset": 2**63}, {"producer_epoch": 2**15}, {"base_sequence": -(2**31) - 1}],
)
def test_build_batch_rejects_header_fields_beyond_their_width(options: dict) -> None:
    with pytest.raises(ValueError, match="out of range"):
        build_batch([Record(b"v")], **options)


def test_build_batch_rejects_a_batch_over_the_size_limit() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        build_batch([Record(bytes(batch.MAX_BATCH_SIZE))])


def test_build_batch_rejects_an_unknown_codec() -> None:
    with pytest.raises(ValueError):
        build_batch([Record(b"v")], codec=5)


@pytest.mark.parametrize("control_type", list(ControlType))
def test_control_batch_carries_its_type_in_the_record_key(control_type: ControlType) -> None:
    raw = build_control_batch(control_type, b"payload", base_offset=4, leader_epoch=2)
    decoded = decode_batch(raw)
    assert decoded.header.is_control
    assert decoded.control_type == control_type
    assert decoded.records[0].key == struct.pack(">hh", 0, control_type)
    assert decoded.records[0].value == b"payload"
    assert (decoded.header.base_offset, decoded.header.leader_epoch) == (4, 2)


def test_raft_control_types_are_raftline_numbers_above_kafkas() -> None:
    assert (int(RAFT_NOOP), int(RAFT_CONFIG)) == (100, 101)


@pytest.mark.parametrize(("commit", "control_type"), [(True, COMMIT), (False, ABORT)])
def test_transaction_marker_is_a_transactional_control_batch(
    commit: bool, control_type: ControlType
) -> None:
    raw = build_txn_marker(commit, 17, producer_id=42, producer_epoch=3)
    decoded = decode_batch(raw)
    assert decoded.header.is_transactional and decoded.header.is_control
    assert (decoded.header.producer_id, decoded.header.producer_epoch) == (42, 3)
    assert decoded.control_type == control_type
    assert decoded.records[0].value == struct.pack(">hi", 0, 17)
    assert coordinator_epoch_of(decoded.records[0].value) == 17


@pytest.mark.parametrize("value", [None, b"\x00\x00\x00", struct.pack(">hi", 1, 17)])
def test_a_malformed_marker_value_is_corrupt(value: bytes | None) -> None:
    with pytest.raises(CorruptBatchError):
        coordinator_epoch_of(value)


def test_a_control_batch_with_a_short_key_is_corrupt() -> None:
    raw = build_batch([Record(b"v", key=b"\x00")], control=True)
    with pytest.raises(CorruptBatchError, match="key"):
        _ = decode_batch(raw).control_type


def test_a_data_batch_has_no_control_type() -> None:
    assert decode_batch(build_batch([Record(b"v")])).control_type is None


def test_iter_batches_decodes_a_concatenation_of_codecs() -> None:
    raws = [build_batch([Record(b"%d" % c)], codec=c, base_offset=c) for c in Codec]
    decoded = list(iter_batches(b"".join(raws)))
    assert [(d.header.base_offset, d.records[0].value) for d in decoded] == [
        (c, b"%d" % c) for c in Codec
    ]


def test_decode_batch_rejects_bytes_after_the_batch() -> None:
    with pytest.raises(CorruptBatchError, match="holds a batch of"):
        decode_batch(build_batch([Record(b"v")]) + b"\x00")


def test_a_bytes_item_is_a_record_with_only_that_value() -> None:
    plain = build_batch([b"a", Record(b"b", key=b"k"), b""], timestamp=5)
    assert plain == build_batch([Record(b"a"), Record(b"b", key=b"k"), Record(b"")], timestamp=5)
    assert [
        (r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_batch(plain).records
    ] == [
        (0, 5, None, b"a", []),
        (1, 5, b"k", b"b", []),
        (2, 5, None, b"", []),
    ]


@settings(max_examples=60, deadline=None)
@given(records=record_lists(), codec=st.sampled_from(Codec), pure_python=st.booleans())
def test_build_batch_buffer_holds_the_bytes_of_build_batch(
    records: list[Record], codec: int, pure_python: bool
) -> None:
    options = {"codec": codec, "timestamp": 1_700_000_000_000, "base_offset": 9}
    with python_loops() if pure_python else contextlib.nullcontext():
        buffer = build_batch_buffer(records, **options)
        assert type(buffer) is bytearray
        assert buffer == build_batch(records, **options)
