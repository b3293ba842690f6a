"""Transaction markers are Kafka control batches that independent readers understand."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from raftline.node.eos.markers import Marker, build_marker, marker_meta, meta_of_batch
from raftline.raftlog.records import ControlType, Record, build_batch, build_control_batch


def test_kafka_python_parses_a_commit_marker_we_build() -> None:
    raw = build_marker(
        True,
        producer_id=42,
        producer_epoch=3,
        coordinator_epoch=9,
        timestamp=1_700_000,
        base_offset=17,
    )
    theirs = DefaultRecordBatch(raw)
    assert theirs.validate_crc()
    assert theirs.is_control_batch and theirs.is_transactional
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_offset) == (42, 3, 17)
    (record,) = list(theirs)
    assert (record.version, record.type) == (0, ControlType.COMMIT)
    assert record.timestamp == 1_700_000


def test_kafka_python_skips_markers_between_data_batches_of_a_segment() -> None:
    data = build_batch(
        [Record(b"x", timestamp=1)],
        base_offset=0,
        producer_id=42,
        producer_epoch=3,
        base_sequence=0,
        transactional=True,
    )
    abort = build_marker(
        False, producer_id=42, producer_epoch=4, coordinator_epoch=1, timestamp=2, base_offset=1
    )
    memory = MemoryRecords(data + abort)
    kinds = []
    while memory.has_next():
        batch = memory.next_batch()
        kinds.append((batch.base_offset, batch.is_control_batch))
    assert kinds == [(0, False), (1, True)]


@pytest.mark.parametrize("commit", [True, False])
def test_a_marker_reads_back_as_the_meta_producer_state_applies(commit: bool) -> None:
    args = {"producer_id": 5, "producer_epoch": 2, "coordinator_epoch": 7, "timestamp": 99}
    meta = meta_of_batch(build_marker(commit, **args))
    assert meta == marker_meta(commit, **args)
    assert meta.marker == Marker(commit, 7)


def test_raft_control_batches_are_not_transaction_markers() -> None:
    noop = build_control_batch(ControlType.RAFT_NOOP, b"", timestamp=0)
    assert meta_of_batch(noop).marker is None


def test_a_data_batch_reads_back_with_its_producer_fields() -> None:
    raw = build_batch(
        [b"a", b"b", b"c"], timestamp=5, producer_id=8, producer_epoch=1, base_sequence=30
    )
    meta = meta_of_batch(raw)
    assert (meta.key, meta.last_sequence, meta.is_transactional) == ((8, 1, 30), 32, False)
