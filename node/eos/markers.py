"""Transaction markers: Kafka control batches that commit or abort a producer's transaction.

Owns building and reading markers and the header fields producer state needs from any batch.
Invariants: a marker is a valid Kafka v2 control batch (attributes bits 4 and 5 set, one record,
key {int16 version 0, int16 type 0=abort/1=commit}, value {int16 version 0, int32 coordinator
epoch}); building one never reads a clock (the caller stamps the time).
"""

from __future__ import annotations

from typing import NamedTuple

from raftline.raftlog.batch import NO_SEQUENCE, BatchHeader, parse_header
from raftline.raftlog.records import (
    ControlType,
    DecodedBatch,
    build_txn_marker,
    coordinator_epoch_of,
    decode_batch,
)

SEQUENCE_MODULUS = 2**31  # sequences wrap from 2**31 - 1 back to 0, as Kafka's do


class Marker(NamedTuple):
    """What a transaction marker says: commit or abort, and by which coordinator epoch."""

    commit: bool
    coordinator_epoch: int


class BatchMeta(NamedTuple):
    """The header fields of one batch that producer state decides on (plus, for a marker, its
    record). `producer_id` < 0: a batch of a producer without idempotence."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int = 0  # record count - 1
    is_transactional: bool = False
    is_control: bool = False
    max_timestamp: int = 0
    marker: Marker | None = None

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.last_offset_delta) % SEQUENCE_MODULUS

    @property
    def key(self) -> tuple[int, int, int]:
        """(producer id, epoch, first sequence): what a retry of this batch repeats."""
        return (self.producer_id, self.producer_epoch, self.base_sequence)

    @classmethod
    def of(cls, header: BatchHeader, marker: Marker | None = None) -> BatchMeta:
        return cls(
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            last_offset_delta=header.last_offset_delta,
            is_transactional=header.is_transactional,
            is_control=header.is_control,
            max_timestamp=header.max_timestamp,
            marker=marker,
        )


def build_marker(
    commit: bool,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int = 0,
    leader_epoch: int = -1,
) -> bytes:
    """The bytes of a COMMIT or ABORT marker batch for one producer."""
    return build_txn_marker(
        commit,
        coordinator_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_offset=base_offset,
        timestamp=timestamp,
        leader_epoch=leader_epoch,
    )


def marker_meta(
    commit: bool, *, producer_id: int, producer_epoch: int, coordinator_epoch: int, timestamp: int
) -> BatchMeta:
    """The BatchMeta of the marker build_marker makes with the same arguments."""
    return BatchMeta(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        is_transactional=True,
        is_control=True,
        max_timestamp=timestamp,
        marker=Marker(commit, coordinator_epoch),
    )


def read_marker(decoded: DecodedBatch) -> Marker | None:
    """The marker a decoded batch carries; None for a data batch or another control type
    (Raftline's own Raft no-op and configuration batches are control batches too)."""
    if not (decoded.header.is_control and decoded.header.is_transactional):
        return None
    control_type = decoded.control_type
    if control_type not in (ControlType.ABORT, ControlType.COMMIT):
        return None
    epoch = coordinator_epoch_of(decoded.records[0].value)
    return Marker(control_type == ControlType.COMMIT, epoch)


def meta_of_batch(raw: bytes | bytearray | memoryview) -> BatchMeta:
    """The BatchMeta of one whole batch, its marker read when it is one (CorruptBatchError
    for bytes that are not a valid batch)."""
    header = parse_header(raw)
    if not header.is_control:  # a data batch: the header is all it takes
        return BatchMeta.of(header)
    decoded = decode_batch(raw)
    return BatchMeta.of(decoded.header, read_marker(decoded))
