"""Segment files written by the log are real Kafka v2: kafka-python's reader decodes them."""

from __future__ import annotations

from pathlib import Path

from kafka.record.memory_records import MemoryRecords

from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch, build_control_batch


def kafka_view(path: Path) -> list[tuple[int, int, bool, list[tuple[int, bytes | None]]]]:
    """(base offset, leader epoch, is control, [(offset, value)]) per batch, CRC-validated."""
    records = MemoryRecords(path.read_bytes())
    out = []
    while (kbatch := records.next_batch()) is not None:
        assert kbatch.validate_crc()
        values = [(r.offset, r.value) for r in kbatch]
        out.append((kbatch.base_offset, kbatch.leader_epoch, kbatch.is_control_batch, values))
    return out


def test_kafka_python_reads_every_segment_file_with_our_offsets_terms_and_values(
    tmp_path: Path,
) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=600, fsync="never"))
    expected: dict[int, tuple[int, list[bytes]]] = {}
    for i in range(30):
        values = [f"m{i}-{j}".encode() for j in range(1 + i % 4)]
        base = log.append(build_batch([Record(value=v) for v in values]), term=1 + i // 10)
        expected[base] = (1 + i // 10, values)
    log.close()
    seen: dict[int, tuple[int, list[bytes]]] = {}
    files = sorted(tmp_path.glob("*.log"))
    assert len(files) > 2
    for path in files:
        for base, epoch, is_control, records in kafka_view(path):
            assert not is_control
            assert [offset for offset, _ in records] == list(range(base, base + len(records)))
            seen[base] = (epoch, [value for _, value in records])
    assert seen == expected


def test_kafka_python_sees_raft_entries_as_control_batches(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync="never"))
    log.append(build_control_batch(100, b""), term=3)
    log.append(build_batch([Record(value=b"data")]), term=3)
    log.close()
    view = kafka_view(tmp_path / f"{0:020d}.log")
    assert [(base, epoch, control) for base, epoch, control, _ in view] == [
        (0, 3, True),
        (1, 3, False),
    ]
    assert view[1][3] == [(1, b"data")]
