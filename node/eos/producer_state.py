"""Producer state of one partition, applied only from committed batches of its Raft log.

Owns per producer id its epoch, its last 5 batches (sequences and offsets), its open transaction's
first offset and last timestamp; the last stable offset; and the leader's in-flight view (batches
proposed, not yet applied) used to check a batch before proposal. The transactions an abort
marker ends are returned by apply_batch (Verdict.aborted): the log's transaction index
(raftlog/txnindex.py) keeps them, beside their segments, for every reader.

Invariants:
- Applied state changes only in apply_batch, from committed batches in log order, so every
  replica computes the same verdict for the same entry; check() answers from applied state
  overlaid with the in-flight view, which a term change wipes (clear_in_flight) and never feeds
  into applied state, a dedup decision after the fact or the LSO.
- A batch is applied at most once per (producer id, epoch, sequence range): a retry within the
  last WINDOW batches gets the original offsets (duplicate), a retry of a batch still in flight
  gets in_flight (the runtime awaits the original's outcome), a gap gets out_of_order_sequence,
  an older epoch producer_fenced. An unknown producer id may start at any sequence; a new epoch
  (or an epoch bumped by a marker) must start at 0. Sequences wrap at 2**31 - 1.
- A marker ends only a transaction of an older epoch than its own (every decision bumps the
  epoch and its markers carry the bumped one), so a late or resent marker of transaction T1
  never ends T2; a repeated marker with no transaction open changes nothing.
- last_stable_offset never exceeds the first offset of an open transaction, the applied end of
  the log or the high watermark, and never decreases while the high watermark does not.
- Precondition for the runtime: a leader may call check() only after it has applied every entry
  up to the first one of its own term; then a committed batch is never judged other than new by
  apply_batch (its verdict is returned so the runtime can assert that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from .markers import SEQUENCE_MODULUS, BatchMeta
from .verification import TxnCheck, check_transactional_write

WINDOW = 5  # batches remembered per producer: Kafka's max.in.flight.requests.per.connection
IN_FLIGHT = -1  # the offset of a batch that is proposed but not applied (check()'s view only)
SNAPSHOT_VERSION = 1

BatchKey = tuple[int, int, int]  # producer id, epoch, first sequence


class Outcome(StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"
    IN_FLIGHT = "in_flight"
    OUT_OF_ORDER = "out_of_order_sequence"
    FENCED = "producer_fenced"
    INVALID_TXN_STATE = "invalid_txn_state"
    NEEDS_VERIFICATION = "needs_verification"
    COORDINATOR_FENCED = "transaction_coordinator_fenced"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision on one batch. duplicate: the original's offsets; in_flight: the key of the
    original to await; an applied abort marker: the transaction it aborted."""

    outcome: Outcome
    base_offset: int | None = None
    last_offset: int | None = None
    key: BatchKey | None = None
    aborted: AbortedTxn | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.NEW


NEW = Verdict(Outcome.NEW)


class BatchSpan(NamedTuple):
    first_seq: int
    last_seq: int
    base_offset: int  # IN_FLIGHT in check()'s view for a batch not yet applied
    last_offset: int


class AbortedTxn(NamedTuple):
    """An aborted transaction's span in the log: its producer's batches in [first, last] are
    dropped by read_committed readers; last_offset is the abort marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: list[BatchSpan] = field(default_factory=list)  # oldest first, at most WINDOW
    txn_first_offset: int | None = None  # set while a transaction is open on this partition
    coordinator_epoch: int = -1
    last_timestamp: int = -1

    def copy(self) -> ProducerEntry:
        return ProducerEntry(
            self.epoch,
            list(self.batches),
            self.txn_first_offset,
            self.coordinator_epoch,
            self.last_timestamp,
        )


class ProducerStateMachine:
    """Producer state of one partition. apply_batch for every committed batch in log order;
    check before proposing a batch (leader only); snapshot/restore around a replayed tail."""

    WINDOW = WINDOW

    def __init__(self, next_offset: int = 0) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.next_offset = next_offset  # one past the last applied batch
        self._open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._in_flight: dict[int, list[BatchMeta]] = {}  # proposal order per producer

    # ------------------------------------------------------------------ applied state

    def apply_batch(self, base_offset: int, meta: BatchMeta, now_ms: int | None = None) -> Verdict:
        """Apply one committed batch at `base_offset` (every batch of the log, idempotent or
        not, control or data, in order). Anything but new leaves producer state as it was.
        `now_ms`: the time the producer was last active at, for expiry (the batch's own max
        timestamp when None; the node passes a clock taken from the log, never the producer's)."""
        if base_offset < self.next_offset:
            raise ValueError(f"batch at {base_offset} applied after {self.next_offset}")
        last_offset = base_offset + meta.last_offset_delta
        self.next_offset = last_offset + 1
        if meta.producer_id < 0:
            return NEW
        self._settle_in_flight(meta)
        entry = self.producers.get(meta.producer_id)
        verdict = self._decide(entry, meta, verified=True)
        if verdict.accepted:
            aborted = self._advance(meta, base_offset, last_offset, now_ms)
            if aborted is not None:
                return Verdict(Outcome.NEW, aborted=aborted)
        return verdict

    def pass_over(self, last_offset: int) -> None:
        """Apply an entry that is no producer's batch and ends at `last_offset` (Raft's no-op or
        a configuration entry, a clock entry): it opens no transaction, so the applied end, and
        with it the LSO, moves past it."""
        self.next_offset = max(self.next_offset, last_offset + 1)

    def last_stable_offset(self, high_watermark: int) -> int:
        """The offset below which no transaction is open: what read_committed may read."""
        lso = min(high_watermark, self.next_offset)
        if self._open:
            lso = min(lso, min(self._open.values()))
        return lso

    def expire(self, now_ms: int, producer_expiry_ms: int) -> list[int]:
        """Forget producers idle since now_ms - producer_expiry_ms with no open transaction;
        they become unknown (a next batch may start at any sequence). Pass a time every replica
        agrees on (a committed batch's timestamp). Returns the expired producer ids."""
        horizon = now_ms - producer_expiry_ms
        gone = [
            pid
            for pid, entry in self.producers.items()
            if entry.txn_first_offset is None and entry.last_timestamp <= horizon
        ]
        for pid in gone:
            del self.producers[pid]
        return gone

    def _advance(
        self, meta: BatchMeta, base_offset: int, last_offset: int, now_ms: int | None
    ) -> AbortedTxn | None:
        pid = meta.producer_id
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(meta.producer_epoch)
        stamp = meta.max_timestamp if now_ms is None else now_ms
        aborted = _advance_entry(entry, meta, base_offset, last_offset, self.WINDOW, stamp)
        if entry.txn_first_offset is None:
            self._open.pop(pid, None)
        else:
            assert entry.txn_first_offset <= base_offset, "a transaction opened in the future"
            self._open[pid] = entry.txn_first_offset
        return None if aborted is None else AbortedTxn(pid, aborted, base_offset)

    # ------------------------------------------------------------------ leader's view

    def check(self, meta: BatchMeta, *, verified: bool = False) -> Verdict:
        """The verdict apply_batch would give `meta` if the leader proposed it now, judged on
        applied state plus the batches in flight. A new batch is recorded as in flight (the
        caller proposes it next). A transactional batch that would start a transaction here
        gets needs_verification unless the coordinator confirmed it (`verified`)."""
        if meta.producer_id < 0:
            return NEW
        entry = self._shadow(meta.producer_id)
        verdict = self._decide(entry, meta, verified=verified)
        if verdict.accepted:
            self._in_flight.setdefault(meta.producer_id, []).append(meta)
        return verdict

    def clear_in_flight(self) -> None:
        """Forget every in-flight batch: on a term change or when leadership is lost."""
        self._in_flight.clear()

    def abandon(self, producer_id: int) -> None:
        """Forget a producer's in-flight batches (a proposal failed: later ones cannot commit)."""
        self._in_flight.pop(producer_id, None)

    def in_flight(self, producer_id: int) -> list[BatchKey]:
        return [meta.key for meta in self._in_flight.get(producer_id, ())]

    def _shadow(self, pid: int) -> ProducerEntry | None:
        entry = self.producers.get(pid)
        pending = self._in_flight.get(pid)
        if not pending:
            return entry
        shadow = entry.copy() if entry is not None else ProducerEntry(pending[0].producer_epoch)
        for meta in pending:
            _advance_entry(shadow, meta, IN_FLIGHT, IN_FLIGHT, self.WINDOW)
        return shadow

    def _settle_in_flight(self, meta: BatchMeta) -> None:
        pending = self._in_flight.get(meta.producer_id)
        if not pending:
            return
        if pending[0] == meta:
            pending.pop(0)
        else:  # not what this leader proposed next: its view of this producer is stale
            pending.clear()
        if not pending:
            del self._in_flight[meta.producer_id]

    # ------------------------------------------------------------------ the rules

    def _decide(self, entry: ProducerEntry | None, meta: BatchMeta, *, verified: bool) -> Verdict:
        if meta.is_control:
            return _decide_marker(entry, meta)
        epoch = meta.producer_epoch
        if entry is not None and epoch < entry.epoch:
            return Verdict(Outcome.FENCED)
        if entry is not None and epoch == entry.epoch:
            for span in entry.batches:
                if span.first_seq == meta.base_sequence and span.last_seq == meta.last_sequence:
                    if span.base_offset == IN_FLIGHT:
                        return Verdict(Outcome.IN_FLIGHT, key=meta.key)
                    return Verdict(Outcome.DUPLICATE, span.base_offset, span.last_offset)
        txn = check_transactional_write(
            current_epoch=None if entry is None else entry.epoch,
            open_txn=entry is not None and entry.txn_first_offset is not None,
            write_epoch=epoch,
            transactional=meta.is_transactional,
            verified=verified,
        )
        if txn is TxnCheck.FENCED:
            return Verdict(Outcome.FENCED)
        if txn is TxnCheck.INVALID_TXN_STATE:
            return Verdict(Outcome.INVALID_TXN_STATE)
        if not _in_sequence(entry, meta):
            return Verdict(Outcome.OUT_OF_ORDER)
        if txn is TxnCheck.NEEDS_VERIFICATION:
            return Verdict(Outcome.NEEDS_VERIFICATION)
        return NEW

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        """Applied state as plain lists and ints (JSON- or msgpack-able), valid at next_offset:
        restore it, then apply the batches from next_offset on."""
        return {
            "version": SNAPSHOT_VERSION,
            "next_offset": self.next_offset,
            "producers": [
                [
                    pid,
                    e.epoch,
                    e.coordinator_epoch,
                    e.txn_first_offset,
                    e.last_timestamp,
                    [list(span) for span in e.batches],
                ]
                for pid, e in sorted(self.producers.items())
            ],
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> ProducerStateMachine:
        if snapshot.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unknown producer state snapshot version {snapshot.get('version')}")
        state = cls(snapshot["next_offset"])
        for pid, epoch, coordinator_epoch, txn_first, last_ts, spans in snapshot["producers"]:
            entry = ProducerEntry(
                epoch, [BatchSpan(*span) for span in spans], txn_first, coordinator_epoch, last_ts
            )
            state.producers[pid] = entry
            if txn_first is not None:
                state._open[pid] = txn_first
        return state


def _decide_marker(entry: ProducerEntry | None, meta: BatchMeta) -> Verdict:
    marker = meta.marker
    if marker is None:
        raise ValueError("a control batch of a producer without its marker record")
    if entry is None:
        return NEW
    if meta.producer_epoch < entry.epoch:
        return Verdict(Outcome.FENCED)
    if meta.producer_epoch == entry.epoch and entry.txn_first_offset is not None:
        # Markers carry the epoch their decision bumped to, so the transaction open here at that
        # epoch began after the decision: this is a late (resent) marker of an earlier one.
        return Verdict(Outcome.FENCED)
    if marker.coordinator_epoch < entry.coordinator_epoch:
        return Verdict(Outcome.COORDINATOR_FENCED)
    return NEW


def _in_sequence(entry: ProducerEntry | None, meta: BatchMeta) -> bool:
    if entry is None:
        return True  # unknown (new or expired) producer: any sequence starts it
    if meta.producer_epoch != entry.epoch or not entry.batches:
        return meta.base_sequence == 0  # a new epoch, or one a marker bumped: restart at 0
    return meta.base_sequence == (entry.batches[-1].last_seq + 1) % SEQUENCE_MODULUS


def _advance_entry(
    entry: ProducerEntry,
    meta: BatchMeta,
    base_offset: int,
    last_offset: int,
    window: int,
    stamp: int | None = None,
) -> int | None:
    """Apply an accepted batch to one producer's entry; returns the first offset of the
    transaction an abort marker ends (None otherwise)."""
    aborted = None
    if meta.producer_epoch > entry.epoch:
        entry.epoch = meta.producer_epoch
        entry.batches.clear()
    stamp = meta.max_timestamp if stamp is None else stamp
    if stamp > entry.last_timestamp:
        entry.last_timestamp = stamp
    if meta.is_control:
        assert meta.marker is not None
        if entry.txn_first_offset is not None and not meta.marker.commit:
            aborted = entry.txn_first_offset
        entry.txn_first_offset = None
        entry.coordinator_epoch = max(entry.coordinator_epoch, meta.marker.coordinator_epoch)
        return aborted
    entry.batches.append(
        BatchSpan(meta.base_sequence, meta.last_sequence, base_offset, last_offset)
    )
    if len(entry.batches) > window:
        del entry.batches[0]
    assert len(entry.batches) <= window
    if meta.is_transactional and entry.txn_first_offset is None:
        entry.txn_first_offset = base_offset
    return None
