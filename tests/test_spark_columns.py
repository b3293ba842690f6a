"""spark/columns.py: segment bytes to Arrow batches with Spark's Kafka columns, read_committed.

Every test runs against the C walk (raftlog/_columns.c) and the Python one, which must agree.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from raftline.raftlog.batch import CorruptBatchError
from raftline.raftlog.records import (
    RAFT_NOOP,
    Codec,
    Record,
    build_batch,
    build_control_batch,
    build_txn_marker,
)
from raftline.spark import columns
from raftline.spark.columns import record_batches
from raftline.tiered.layout import AbortedRange

TS = 1_700_000_000_000
PID = 7


@pytest.fixture(params=["c", "python"])
def walk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "c":
        if columns._C is None:
            pytest.skip("raftline.raftlog._columns is not built")
    else:
        monkeypatch.setattr(columns, "_C", None)
    yield request.param


def rows(data: bytes, **options) -> list[dict]:
    options.setdefault("topic", "orders")
    options.setdefault("partition", 2)
    out = []
    for batch in record_batches(data, **options):
        assert batch.num_rows > 0
        assert batch.schema == columns.schema(options.get("include_headers", False))
        out += batch.to_pylist()
    return out


def plain(records: list[Record], base: int, **options) -> bytes:
    return build_batch(records, base_offset=base, timestamp=TS, **options)


@pytest.mark.parametrize("codec", list(Codec))
def test_every_codec_reads_back_keys_values_headers_timestamps_offsets(walk, codec):
    records = [
        Record(
            value=None if i == 3 else b"v%d" % i * 20,
            key=None if i % 4 == 0 else b"k%d" % i,
            headers=[("trace", b"t%d" % i), ("empty", None)] if i % 2 else (),
            timestamp=TS + i,
        )
        for i in range(50)
    ]
    data = plain(records[:30], 0, codec=codec) + plain(records[30:], 30, codec=codec)
    got = rows(data, include_headers=True)
    assert [r["offset"] for r in got] == list(range(50))
    assert [r["key"] for r in got] == [r.key for r in records]
    assert [r["value"] for r in got] == [r.value for r in records]
    assert [[(h["key"], h["value"]) for h in r["headers"]] for r in got] == [
        list(r.headers) for r in records
    ]
    assert [int(r["timestamp"].timestamp() * 1000) for r in got] == [TS + i for i in range(50)]
    assert {(r["topic"], r["partition"], r["timestampType"]) for r in got} == {("orders", 2, 0)}


def test_without_include_headers_there_is_no_headers_column(walk):
    data = plain([Record(b"v", headers=[("h", b"x")])], 0)
    (batch,) = record_batches(data, topic="t", partition=0)
    assert "headers" not in batch.schema.names


def test_log_append_time_batches_carry_the_append_time_and_type_1(walk):
    data = build_batch([b"a", b"b"], base_offset=0, timestamp=TS, log_append_time=TS + 999)
    got = rows(data)
    assert [r["timestampType"] for r in got] == [1, 1]
    assert {int(r["timestamp"].timestamp() * 1000) for r in got} == {TS + 999}


def test_control_batches_are_not_rows(walk):
    data = (
        plain([b"a"], 0)
        + build_control_batch(RAFT_NOOP, b"", base_offset=1, timestamp=TS)
        + plain([b"b"], 2)
    )
    assert [(r["offset"], r["value"]) for r in rows(data)] == [(0, b"a"), (2, b"b")]


def txn(records: list[bytes], base: int, pid: int = PID) -> bytes:
    return build_batch(
        records, base_offset=base, timestamp=TS, producer_id=pid, producer_epoch=0,
        base_sequence=0, transactional=True,
    )  # fmt: skip


def marker(commit: bool, offset: int, pid: int = PID) -> bytes:
    return build_txn_marker(commit, 0, producer_id=pid, producer_epoch=0, base_offset=offset)


def test_aborted_transactions_are_dropped_and_committed_ones_kept(walk):
    data = (
        txn([b"aborted-1"], 0)
        + plain([b"plain"], 1)
        + txn([b"aborted-2"], 2)
        + txn([b"other-producer"], 3, pid=8)
        + marker(False, 4)
        + marker(True, 5, pid=8)
        + txn([b"committed"], 6)
        + marker(True, 7)
    )
    aborted = [AbortedRange(PID, 0, 4)]
    got = [r["value"] for r in rows(data, aborted=aborted)]
    assert got == [b"plain", b"other-producer", b"committed"]


def test_an_aborted_span_that_began_in_an_earlier_segment_drops_its_tail(walk):
    data = txn([b"tail-of-aborted"], 10) + marker(False, 11) + txn([b"next"], 12) + marker(True, 13)
    got = [r["value"] for r in rows(data, aborted=[AbortedRange(PID, 3, 11)])]
    assert got == [b"next"]


def test_records_outside_the_offset_range_are_left_out_mid_batch(walk):
    data = plain([b"%d" % i for i in range(10)], 100) + plain([b"x", b"y"], 110)
    got = rows(data, start_offset=104, end_offset=111)
    assert [r["offset"] for r in got] == [104, 105, 106, 107, 108, 109, 110]


def test_batches_hold_about_max_rows_rows_and_never_split_a_record_batch(walk):
    data = b"".join(plain([b"v"] * 10, base) for base in range(0, 100, 10))
    sizes = [b.num_rows for b in record_batches(data, topic="t", partition=0, max_rows=25)]
    assert sum(sizes) == 100
    assert sizes[0] >= 25 and all(size % 10 == 0 for size in sizes)


def test_a_flipped_byte_fails_the_crc(walk):
    data = bytearray(plain([b"value"] * 3, 0))
    data[-2] ^= 0xFF
    with pytest.raises(CorruptBatchError, match="CRC"):
        rows(bytes(data))


def test_a_truncated_segment_is_corrupt_not_short(walk):
    data = plain([b"value"] * 3, 0) + plain([b"more"], 3)
    with pytest.raises(CorruptBatchError):
        rows(data[:-5])


def test_empty_data_gives_no_batches(walk):
    assert list(record_batches(b"", topic="t", partition=0)) == []


def test_c_and_python_walks_build_equal_batches(monkeypatch):
    if columns._C is None:
        pytest.skip("raftline.raftlog._columns is not built")
    records = [Record(b"v" * (i % 7), key=b"k" if i % 3 else None, headers=[("a", b"b")] * (i % 3))
               for i in range(300)]  # fmt: skip
    data = b"".join(
        plain(records[i : i + 30], i, codec=Codec.LZ4 if i % 60 else Codec.NONE)
        for i in range(0, 300, 30)
    )
    options = {"topic": "t", "partition": 1, "include_headers": True, "start_offset": 5}
    fast = pa.Table.from_batches(list(record_batches(data, **options)))
    monkeypatch.setattr(columns, "_C", None)
    slow = pa.Table.from_batches(list(record_batches(data, **options)))
    assert fast.equals(slow)


def test_batches_the_cleaner_rewrote_read_back_their_kept_records_and_empty_ones_none(walk):
    from raftline.raftlog.batch import parse_header
    from raftline.raftlog.cleaner import rewrite_batch
    from raftline.raftlog.records import decode_batch

    first = plain([Record(b"old", b"a"), Record(b"new", b"b"), Record(b"x", b"a")], 0)
    gone = plain([Record(b"y", b"c"), Record(b"z", b"c")], 3, codec=Codec.ZSTD)
    kept = [r for r in decode_batch(first).records if r.offset > 0]
    data = rewrite_batch(parse_header(first), kept) + rewrite_batch(parse_header(gone), [])
    data += plain([Record(b"after", b"d")], 5)
    got = [(r["offset"], r["key"], r["value"]) for r in rows(data)]
    assert got == [(1, b"b", b"new"), (2, b"a", b"x"), (5, b"d", b"after")]
