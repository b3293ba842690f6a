"""The cores on real bytes: a log of transactions written as Kafka batches and markers reads
back into the same producer state, kafka-python walks it, and read_committed keeps the
committed values."""

from __future__ import annotations

from eos_models import LoggedBatch, transactional_logs
from hypothesis import given, settings
from kafka.record.memory_records import MemoryRecords

from raftline.node.eos.isolation import read_committed
from raftline.node.eos.markers import build_marker, meta_of_batch
from raftline.node.eos.producer_state import ProducerStateMachine
from raftline.raftlog.records import build_batch, decode_batch


def encode(b: LoggedBatch) -> bytes:
    meta = b.meta
    if meta.marker is not None:
        return build_marker(
            meta.marker.commit,
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            coordinator_epoch=meta.marker.coordinator_epoch,
            timestamp=meta.max_timestamp,
            base_offset=b.base_offset,
        )
    values = [b"%d" % (b.base_offset + i) for i in range(meta.last_offset_delta + 1)]
    return build_batch(
        values,
        base_offset=b.base_offset,
        timestamp=meta.max_timestamp,
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        base_sequence=meta.base_sequence,
        transactional=meta.is_transactional,
    )


@settings(max_examples=100, deadline=None)
@given(log=transactional_logs())
def test_a_log_of_transactions_in_kafka_bytes_reads_back_committed_values_only(
    log: list[LoggedBatch],
) -> None:
    segment = [encode(b) for b in log]
    assert [meta_of_batch(raw) for raw in segment] == [b.meta for b in log]

    memory = MemoryRecords(b"".join(segment))
    theirs = []
    while memory.has_next():
        batch = memory.next_batch()
        assert batch.validate_crc()
        theirs.append((batch.base_offset, batch.producer_id, batch.is_control_batch))
    assert theirs == [(b.base_offset, b.meta.producer_id, b.meta.is_control) for b in log]

    state = ProducerStateMachine()
    aborted = []
    for b, raw in zip(log, segment, strict=True):
        verdict = state.apply_batch(b.base_offset, meta_of_batch(raw))
        assert verdict.accepted
        if verdict.aborted is not None:
            aborted.append(verdict.aborted)
    lso = state.last_stable_offset(state.next_offset)
    below = [(b.base_offset, b.meta, raw) for b, raw in zip(log, segment, strict=True)]
    below = [item for item in below if item[0] < lso]
    kept = read_committed(below, sorted(aborted, key=lambda a: a.first_offset))
    values = [v for raw in kept for v in _values(raw)]
    expected = [
        b"%d" % (b.base_offset + i)
        for b in log
        if b.fate in ("plain", "committed") and b.base_offset < lso
        for i in range(b.meta.last_offset_delta + 1)
    ]
    assert values == expected


def _values(raw: bytes) -> list[bytes | None]:
    return [r.value for r in decode_batch(raw).records]
