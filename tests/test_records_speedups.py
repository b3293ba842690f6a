"""The C record loops (raftline.raftlog._speedups) behave exactly as the pure-Python ones:
byte-identical batches, equal decoded records, the same errors on malformed input.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftline.raftlog import batch, records
from raftline.raftlog.batch import BatchHeader, CorruptBatchError, parse_header
from raftline.raftlog.compression import compress, decompress
from raftline.raftlog.records import (
    Codec,
    DecodedRecord,
    Record,
    batch_values,
    build_batch,
    check_batch,
    decode_batch,
    iter_batches,
    python_loops,
)

PURE_PYTHON = os.environ.get("RAFTLINE_PURE_PYTHON") == "1"
try:
    from raftline.raftlog import _speedups
except ImportError as err:
    if PURE_PYTHON:
        pytest.skip(
            "RAFTLINE_PURE_PYTHON=1 and the extension is not built", allow_module_level=True
        )
    # CI must not quietly lose the fast path: an unbuilt extension fails this module.
    raise ImportError(
        "raftline.raftlog._speedups is not built: run `make install` "
        "(or set RAFTLINE_PURE_PYTHON=1 to test the pure-Python records codec alone)"
    ) from err

# records.py binds the extension on import unless asked for pure Python; the tests compare
# both paths either way.
_speedups.bind(Record, DecodedRecord, CorruptBatchError)

# A hang guard, not a speed target.
pytestmark = pytest.mark.timeout(120)
equivalence = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

INT64 = st.integers(-(2**63), 2**63 - 1)
payloads = st.none() | st.binary(max_size=100) | st.binary(max_size=3).map(bytearray)
header_lists = st.lists(st.tuples(st.text(max_size=8), payloads), max_size=20).map(
    lambda pairs: pairs if len(pairs) % 2 else tuple(pairs)
)
timestamps = st.none() | st.integers(-(2**62), 2**62 - 1) | st.integers(0, 2000)


@st.composite
def items(draw: st.DrawFn) -> list[Record | bytes]:
    """A valid batch's items: Records with every kind of field, and plain bytes."""
    out: list[Record | bytes] = []
    explicit_delta = draw(st.booleans())
    delta = -1
    for position in range(draw(st.integers(1, 12))):
        if draw(st.integers(0, 3)) == 0 and not explicit_delta:
            out.append(draw(st.binary(max_size=100)))
            continue
        delta = delta + draw(st.integers(1, 70_000)) if explicit_delta else position
        out.append(
            Record(
                value=draw(payloads),
                key=draw(payloads),
                headers=draw(header_lists),
                timestamp=draw(timestamps),
                offset_delta=delta if explicit_delta else draw(st.sampled_from([None, position])),
            )
        )
    return out


def _outcome(action: Callable[[], object]) -> tuple[object, ...]:
    """What an action returns, or the type and message of what it raises."""
    try:
        return ("returned", action())
    except (ValueError, TypeError, AttributeError) as err:
        return ("raised", type(err), str(err))


def test_records_uses_the_c_loops_unless_pure_python_is_asked_for() -> None:
    assert records.SPEEDUPS is not PURE_PYTHON
    expected = _speedups.decode_records if records.SPEEDUPS else records._py_decode_records
    assert records._decode_records is expected


# ---------------------------------------------------------------------------- encoding


@equivalence
@given(batch_items=items(), default_timestamp=st.integers(-(2**62), 2**62))
def test_the_records_section_is_byte_identical(
    batch_items: list[Record | bytes], default_timestamp: int
) -> None:
    assert _speedups.encode_records(batch_items, default_timestamp, 3) == (
        records._py_encode_records(batch_items, default_timestamp, 3)
    )


@settings(max_examples=40, deadline=None)
@given(batch_items=items(), codec=st.sampled_from(Codec), append_time=st.none() | INT64)
def test_whole_batches_are_byte_identical_for_every_codec(
    batch_items: list[Record | bytes], codec: int, append_time: int | None
) -> None:
    options = {"codec": codec, "timestamp": 77, "log_append_time": append_time, "base_offset": 5}
    built = _outcome(lambda: build_batch(batch_items, **options))
    with python_loops():
        assert _outcome(lambda: build_batch(batch_items, **options)) == built


@equivalence
@given(
    deltas=st.lists(st.none() | st.integers(-3, 5) | st.integers(2**31 - 3, 2**31 + 1), max_size=5),
    stamps=st.lists(st.none() | INT64 | st.integers(2**63 - 2, 2**64), max_size=5),
    default_timestamp=INT64 | st.just(2**63),
)
def test_out_of_range_deltas_and_timestamps_raise_value_error_in_both(
    deltas: list[int | None], stamps: list[int | None], default_timestamp: int
) -> None:
    batch_items = [
        Record(b"v", offset_delta=delta, timestamp=stamp)
        for delta, stamp in zip(deltas, stamps, strict=False)
    ] or [b"v"]
    c = _outcome(lambda: build_batch(batch_items, timestamp=default_timestamp))
    with python_loops():
        python = _outcome(lambda: build_batch(batch_items, timestamp=default_timestamp))
    assert c[:2] == python[:2]  # the same batch or the same error type


def test_objects_with_a_records_attributes_encode_like_records() -> None:
    class Lookalike:
        value, key, headers, timestamp, offset_delta = b"v", b"k", [("h", b"x")], 3, 0

    assert _speedups.encode_records([Lookalike()], 1, 0) == records._py_encode_records(
        [Record(b"v", b"k", [("h", b"x")], 3, 0)], 1, 0
    )


@pytest.mark.parametrize(
    "bad",
    [
        Record(b"v", headers=[("h",)]),
        Record(b"v", headers=[(b"not str", b"x")]),
        Record(b"v", headers=(pair for pair in [("h", b"x")])),  # type: ignore[arg-type]
        Record("not bytes"),  # type: ignore[arg-type]
        Record(b"v", timestamp="soon"),  # type: ignore[arg-type]
        object(),
    ],
)
def test_malformed_items_raise_rather_than_encode(bad: object) -> None:
    for encode in (_speedups.encode_records, records._py_encode_records):
        with pytest.raises((ValueError, TypeError, AttributeError)):
            encode([b"fine", bad], 0, 0)


# ---------------------------------------------------------------------------- decoding


def _decodes(raw: bytes) -> tuple[object, ...]:
    return (
        _outcome(lambda: decode_batch(raw, verify_crc=False)),
        _outcome(lambda: check_batch(raw)),
        _outcome(lambda: batch_values(raw, parse_header(raw), verify_crc=False)),
    )


def _assert_same_decoding(raw: bytes) -> None:
    c = _decodes(raw)
    with python_loops():
        assert _decodes(raw) == c


@settings(max_examples=60, deadline=None)
@given(batch_items=items(), codec=st.sampled_from(Codec), append_time=st.none() | INT64)
def test_built_batches_decode_to_equal_records(
    batch_items: list[Record | bytes], codec: int, append_time: int | None
) -> None:
    raw = build_batch(batch_items, codec=codec, base_offset=2**40, log_append_time=append_time)
    decoded, checked = decode_batch(raw), check_batch(raw)
    assert all(type(record) is DecodedRecord for record in decoded.records)
    with python_loops():
        assert (decode_batch(raw), check_batch(raw)) == (decoded, checked)
    assert list(iter_batches(raw + raw)) == [decoded, decoded]


@settings(max_examples=40, deadline=None)
@given(batch_items=items(), codec=st.sampled_from(Codec))
def test_batch_values_are_the_values_of_the_decoded_records(
    batch_items: list[Record | bytes], codec: int
) -> None:
    raw = build_batch(batch_items, codec=codec)
    values = batch_values(raw, parse_header(raw))
    assert values == [record.value for record in decode_batch(raw).records]
    with python_loops():
        assert batch_values(raw, parse_header(raw)) == values


def test_offsets_and_timestamps_past_int64_read_back_as_python_ints() -> None:
    raw = _sealed(
        bytes.fromhex("0c 00 02 02 01 01 00"), base_offset=2**63 - 1, base_timestamp=2**63 - 1
    )
    (record,) = decode_batch(raw).records
    assert (record.offset, record.timestamp) == (2**63, 2**63)
    _assert_same_decoding(raw)


def _sealed(
    section: bytes,
    *,
    codec: int = 0,
    records_count: int = 1,
    last_offset_delta: int = 1,
    base_offset: int = 0,
    base_timestamp: int = 0,
    attributes: int = 0,
) -> bytes:
    """A batch with a correct header and CRC around an arbitrary records section."""
    raw = bytearray(batch.HEADER_SIZE) + section
    batch.write_header(
        raw,
        BatchHeader(
            base_offset=base_offset,
            batch_length=len(raw) - batch.LOG_OVERHEAD,
            leader_epoch=0,
            magic=batch.MAGIC,
            crc=0,
            attributes=codec | attributes,
            last_offset_delta=last_offset_delta,
            base_timestamp=base_timestamp,
            max_timestamp=base_timestamp,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            records_count=records_count,
        ),
    )
    return bytes(raw)


VALID_ITEMS = [
    Record(b"value %d" % i, key=b"k%d" % i, headers=[("h", b"x"), ("n", None), ("é", b"")])
    for i in range(4)
] + [b"plain"]
VALID = {codec: build_batch(VALID_ITEMS, codec=codec, timestamp=10**12) for codec in Codec}
SECTIONS = {codec: VALID[codec][batch.HEADER_SIZE :] for codec in Codec}
# Varint pieces that stress the readers: overlong, over-wide, huge and negative lengths.
nasty = st.sampled_from(
    [
        b"\x80" * 5 + b"\x01",  # a 6-byte varint
        b"\xff" * 10 + b"\x01",  # an 11-byte varint
        b"\xff\xff\xff\xff\x7f",  # 5 bytes, bits past 32
        b"\xfe\xff\xff\xff\x0f",  # the largest int32
        b"\x81\x80\x80\x80\x10",  # a large negative length
        b"\x03",  # -2
        b"\x01",  # -1: null
        b"\xff" * 9 + b"\x01",  # the largest varlong
        b"\xff" * 9 + b"\x02",  # bits past 64
    ]
)
edits = st.lists(
    st.tuples(
        st.sampled_from(["set", "cut", "insert", "flip"]),
        st.integers(0),
        st.binary(max_size=6) | nasty,
    ),
    min_size=1,
    max_size=4,
)


@equivalence
@given(codec=st.sampled_from([Codec.NONE, Codec.LZ4]), changes=edits, data=st.data())
def test_edited_sections_fail_alike_or_decode_alike(
    codec: int, changes: list[tuple[str, int, bytes]], data: st.DataObject
) -> None:
    # Edit the inflated section, recompress it: the edits reach the record walk.
    section = bytearray(decompress(codec, SECTIONS[codec]) if codec else SECTIONS[codec])
    for kind, where, payload in changes:
        position = where % (len(section) + 1)
        if kind == "set":
            section[position : position + len(payload)] = payload
        elif kind == "cut":
            del section[position : position + len(payload) + 1]
        elif kind == "insert":
            section[position:position] = payload
        elif position < len(section):
            section[position] ^= 1 << (where % 8)
    body = compress(codec, bytes(section)) if codec else bytes(section)
    raw = _sealed(
        body,
        codec=codec,
        records_count=data.draw(st.sampled_from([5, 4, 6, 0])),
        last_offset_delta=data.draw(st.sampled_from([4, 3, 2**31 - 1])),
        attributes=data.draw(st.sampled_from([0, batch.TIMESTAMP_TYPE_MASK])),
    )
    _assert_same_decoding(raw)


@equivalence
@given(
    section=st.binary(max_size=200) | st.lists(nasty | st.binary(max_size=4)).map(b"".join),
    records_count=st.integers(0, 8),
    last_offset_delta=st.integers(0, 8) | st.just(2**31 - 1),
)
def test_random_sections_fail_alike_or_decode_alike(
    section: bytes, records_count: int, last_offset_delta: int
) -> None:
    _assert_same_decoding(
        _sealed(section, records_count=records_count, last_offset_delta=last_offset_delta)
    )


@pytest.mark.parametrize("codec", list(Codec))
def test_every_truncation_fails_alike(codec: int) -> None:
    raw = VALID[codec]
    for size in range(len(raw) - batch.HEADER_SIZE):
        _assert_same_decoding(_sealed(SECTIONS[codec][:size], codec=codec, records_count=5))


def test_a_6_byte_varint32_and_an_11_byte_varint64_are_corrupt() -> None:
    length_too_long = b"\x80" * 5 + b"\x01" + bytes(10)
    delta_too_long = bytes([2 * 14]) + b"\x00" + b"\xff" * 10 + b"\x01" + bytes(2)
    for section in (length_too_long, delta_too_long):
        header = batch.parse_header(_sealed(section))
        with pytest.raises(CorruptBatchError, match="varint longer than"):
            _speedups.decode_records(section, header)


def test_decoding_reads_any_bytes_like_section() -> None:
    section = SECTIONS[Codec.NONE]
    header = batch.parse_header(VALID[Codec.NONE])
    expected = records._py_decode_records(section, header)
    for view in (bytearray(section), memoryview(VALID[Codec.NONE])[batch.HEADER_SIZE :]):
        assert _speedups.decode_records(view, header) == expected
