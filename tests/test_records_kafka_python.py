"""Cross-check with an independent Kafka v2 implementation (kafka-python's record module).

Our batches must read correctly there, and batches kafka-python builds must read correctly here.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from raftline.raftlog import batch
from raftline.raftlog.records import (
    Codec,
    ControlType,
    Record,
    build_batch,
    build_txn_marker,
    decode_batch,
)

payloads = st.none() | st.binary(max_size=300)
records_strategy = st.lists(
    st.builds(
        Record,
        value=payloads,
        key=payloads,
        headers=st.lists(st.tuples(st.text(max_size=8), payloads), max_size=3),
        timestamp=st.integers(0, 2**50),
    ),
    min_size=1,
    max_size=20,
)


def _compressible(i: int) -> bytes:
    return b"event %d " % i * 20


@pytest.mark.parametrize("codec", list(Codec))
@settings(max_examples=25)
@given(records=records_strategy, base_offset=st.integers(0, 2**40))
def test_kafka_python_reads_our_batches(
    codec: int, records: list[Record], base_offset: int
) -> None:
    raw = build_batch(records, codec=codec, base_offset=base_offset)
    theirs = DefaultRecordBatch(raw)
    assert theirs.validate_crc()
    assert theirs.compression_type == codec
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in theirs]
    expected = [
        (base_offset + i, r.timestamp, r.key, r.value, list(r.headers))
        for i, r in enumerate(records)
    ]
    assert got == expected


def test_kafka_python_reads_producer_state_and_log_append_time() -> None:
    raw = build_batch(
        [Record(b"a", timestamp=1), Record(b"b", timestamp=2)],
        producer_id=77,
        producer_epoch=4,
        base_sequence=1000,
        transactional=True,
        log_append_time=555,
    )
    theirs = DefaultRecordBatch(raw)
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (77, 4, 1000)
    assert theirs.is_transactional and theirs.last_sequence == 1001
    assert theirs.timestamp_type == 1
    assert [r.timestamp for r in theirs] == [555, 555]


@pytest.mark.parametrize("control_type", [ControlType.ABORT, ControlType.COMMIT])
def test_kafka_python_reads_our_transaction_markers(control_type: ControlType) -> None:
    raw = build_txn_marker(control_type == ControlType.COMMIT, 5, producer_id=9, producer_epoch=1)
    theirs = DefaultRecordBatch(raw)
    assert theirs.is_control_batch
    (record,) = list(theirs)
    assert (record.version, record.type) == (0, control_type)


def test_kafka_python_reads_a_batch_we_stamped_with_log_append_time() -> None:
    raw = bytearray(build_batch([Record(b"a", timestamp=1), Record(b"b", timestamp=2)]))
    batch.stamp_log_append_time(raw, 1_234)
    theirs = DefaultRecordBatch(bytes(raw))
    assert theirs.validate_crc()
    assert [(r.timestamp, r.timestamp_type) for r in theirs] == [(1_234, 1), (1_234, 1)]


def test_kafka_python_walks_a_concatenation_of_our_batches() -> None:
    raw = b"".join(
        build_batch([Record(_compressible(c))], codec=c, base_offset=c * 10) for c in Codec
    )
    memory = MemoryRecords(raw)
    offsets = []
    while memory.has_next():
        theirs = memory.next_batch()
        assert theirs.validate_crc()
        offsets.extend(r.offset for r in theirs)
    assert offsets == [c * 10 for c in Codec]


def _their_builder(
    codec: int, transactional: bool = False, producer: tuple[int, int, int] = (-1, -1, -1)
) -> DefaultRecordBatchBuilder:
    """kafka-python's v2 batch builder; producer is (id, epoch, base sequence), -1s for none."""
    producer_id, producer_epoch, base_sequence = producer
    return DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )


@pytest.mark.parametrize("codec", list(Codec))
def test_we_read_batches_kafka_python_builds(codec: int) -> None:
    builder = _their_builder(codec)
    sent = []
    for i in range(50):
        key = None if i % 7 == 0 else b"key-%d" % i
        value = None if i % 11 == 0 else _compressible(i)
        headers = [("h", b"%d" % i), ("h", None)] if i % 3 == 0 else []
        builder.append(i, timestamp=1_700_000_000_000 - i, key=key, value=value, headers=headers)
        sent.append((i, 1_700_000_000_000 - i, key, value, headers))
    decoded = decode_batch(bytes(builder.build()))
    assert decoded.header.codec == codec  # the values compress, so kafka-python kept the codec
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded.records]
    assert got == sent


def test_we_read_kafka_python_producer_state() -> None:
    builder = _their_builder(Codec.NONE, transactional=True, producer=(123, 5, 40))
    builder.append(0, timestamp=10, key=None, value=b"v", headers=[])
    header = decode_batch(bytes(builder.build())).header
    assert header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (123, 5, 40)


# gzip embeds no fixed mtime there and its lz4 frames store the content size, so only these
# codecs can match byte for byte; the others are checked by decoding above.
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.SNAPPY, Codec.ZSTD])
def test_our_bytes_equal_kafka_python_bytes_for_the_same_records(codec: int) -> None:
    builder = _their_builder(codec)
    ours = []
    for i in range(30):
        headers = [("trace", b"%d" % i)] if i % 2 else []
        key = None if i % 5 == 0 else b"k%d" % i
        timestamp = 1_700_000_000_000 + 3 * i - (i % 4)
        builder.append(i, timestamp=timestamp, key=key, value=_compressible(i), headers=headers)
        ours.append(Record(_compressible(i), key=key, headers=headers, timestamp=timestamp))
    assert build_batch(ours, codec=codec, leader_epoch=0) == bytes(builder.build())
