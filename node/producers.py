"""Producer state of one partition replica, driven from its Raft log (issue #15, idempotence).

Owns the replica's ProducerStateMachine (node/eos/producer_state.py) fed from committed entries,
its snapshot file beside the segments, the clock producer expiry reads (the largest timestamp
of a committed control batch: clock entries the partition leader proposes and transaction
markers the coordinator stamps; never a producer's timestamp, which any producer could set an
hour ahead to expire the others), the leader's waits on batches still in flight,
feeding each applied abort to the log's aborted-transaction index (raftlog/txnindex.py), and
the producer state a leader ships with a Raft snapshot (a follower that skips the trimmed
prefix would otherwise know no producer of it).

Invariants:
- Applied state changes only in apply(), from committed DATA entries in log order, keyed by
  Kafka offsets (entry.index is the batch's base offset); the leader's in-flight view lives in
  the state machine's check()/clear_in_flight() and is wiped on every term change. Every other
  committed entry (Raft's no-op, configuration) only moves the applied end past it: it opens no
  transaction, so it never holds the last stable offset back.
- Expiry runs at points that depend on the log alone (each time the committed clock enters a
  new period of expiry_ms / 10), so every replica forgets the same producers at the same
  offset, and a restart (snapshot + replayed tail) reaches the same state. A producer's last
  activity is the committed clock when its batch was applied.
- A snapshot holds applied state only, valid at its next_offset; it is written atomically
  (temporary file, fsync, rename) and is used on restart only if the log still holds what
  follows it up to the commit index; otherwise the whole log is replayed.
- Every abort below a snapshot's next_offset is durable in the transaction index before the
  snapshot is (sync_txn_indexes first); those after it are recorded again by the replay (the
  index ignores an entry it has). A sealed segment missing its index on open makes the replay
  start at the log start, which records every abort again.
- A follower that installs a Raft snapshot at S restores the leader's state at A >= S (sent
  with the snapshot, see snapshot_state) and, for A's aborts after S, records them in its index
  when their markers reach its log; entries up to A change nothing else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from raftline.node.eos.markers import BatchMeta, meta_of_batch
from raftline.node.eos.producer_state import BatchKey, Outcome, ProducerStateMachine, Verdict
from raftline.node.errors import OutcomeUnknown
from raftline.raftlog.batch import BatchHeader, CorruptBatchError
from raftline.raftlog.records import ControlType, build_control_batch
from raftline.raftlog.txnindex import AbortedTxn
from raftline.raftlog.types import Entry, EntryKind

log = logging.getLogger(__name__)

# Kafka v2 batch header fields read by the fast path (see raftlog/batch.py for the layout).
_MAX_TIMESTAMP = slice(35, 43)
_PRODUCER_ID = slice(43, 51)
_HEADER_END = 61
_NO_PRODUCER = b"\xff" * 8  # producer id -1

_BATCHES = (EntryKind.DATA, EntryKind.CONTROL)  # producers' batches and transaction markers

SNAPSHOT_FILE = "producer_state.json"
SNAPSHOT_FORMAT = 1
DEFAULT_EXPIRY_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms
DEFAULT_SNAPSHOT_EVERY = 2000  # committed entries between snapshots (bounds restart replay)


class PartitionProducers:
    """Producer state of one replica: apply committed entries, snapshot, and in-flight waits."""

    def __init__(
        self,
        directory: Path,
        *,
        expiry_ms: int = DEFAULT_EXPIRY_MS,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        log: Any = None,  # raftlog.log.PartitionLog: the aborted-transaction indexes
    ) -> None:
        self.path = Path(directory) / SNAPSHOT_FILE
        self.log = log
        self.expiry_ms = max(1, expiry_ms)
        self.snapshot_every = max(1, snapshot_every)
        self.state = ProducerStateMachine()
        self.clock_ms = -1  # largest timestamp of a committed data batch: expiry's clock
        self.expired = 0
        self._clock_proposed = -1  # wall time of the last clock entry this leader proposed
        self._since_snapshot = 0
        self.durable_offset = 0  # next_offset of the last snapshot written
        self._writing: asyncio.Future[None] | None = None
        # key of a batch in flight from this leader that a retry awaits -> its base offset
        self._pending: dict[BatchKey, asyncio.Future[int]] = {}
        # The log's transaction indexes are being rebuilt by a replay up to this offset.
        self._rebuild_until: int | None = None
        # Marker offset -> abort, for aborts a shipped state holds and the log does not yet.
        self._shipped_aborts: dict[int, AbortedTxn] = {}

    @property
    def _period(self) -> int:
        return max(1000, self.expiry_ms // 10)

    # ------------------------------------------------------------------ restart

    def load(self, first_index: int, commit: int) -> int:
        """Read the snapshot (blocking: call on the disk pool); returns the offset whose
        predecessor the replica has applied (replay starts at the return value)."""
        start = max(first_index, 0)
        if self.log is not None and self.log.txn_index_gap is not None:
            log.warning("%s: transaction index missing; replaying the log", self.path.parent)
            self.state = ProducerStateMachine(start)
            self._rebuild_until = commit
            self._rebuilt()
            return start
        try:
            data = json.loads(self.path.read_bytes())
            if data.get("format") != SNAPSHOT_FORMAT:
                raise ValueError(f"unknown format {data.get('format')!r}")
            state = ProducerStateMachine.restore(data["state"])
        except FileNotFoundError:
            self.state = ProducerStateMachine(start)
            return start
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s: bad producer snapshot (%s); replaying the log", self.path, exc)
            self.state = ProducerStateMachine(start)
            return start
        if state.next_offset > commit + 1:
            # Written from entries this node applied before its own copy was fsynced and lost
            # in a crash: the log no longer proves it. Start over from the log.
            log.warning("%s: snapshot past the commit index; replaying the log", self.path)
            self.state = ProducerStateMachine(start)
            return start
        if state.next_offset < start:
            # The log starts past the snapshot (a Raft snapshot installed or a trim before the
            # next producer snapshot was durable): what lies between is unknown.
            log.warning("%s: snapshot below the log start; replaying the log", self.path)
            self.state = ProducerStateMachine(start)
            return start
        self.state = state
        self.clock_ms = int(data.get("clock_ms", -1))
        self.expired = int(data.get("expired", 0))
        self.durable_offset = state.next_offset
        return state.next_offset

    def snapshot_bytes(self, **extra: Any) -> bytes:
        return json.dumps(
            {
                "format": SNAPSHOT_FORMAT,
                "clock_ms": self.clock_ms,
                "expired": self.expired,
                "state": self.state.snapshot(),
                **extra,
            },
            separators=(",", ":"),
        ).encode()

    def write_snapshot(self, data: bytes) -> None:
        """Blocking: replace the snapshot file atomically and durably (after the transaction
        indexes, which must hold every abort below it)."""
        if self.log is not None:
            self.log.sync_txn_indexes()
        tmp = self.path.with_suffix(".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def persist(self, run_on_disk: Any) -> None:
        """Write a snapshot of the applied state now and wait for it (before a trim of the
        log below the state: a restart must not need the trimmed entries)."""
        self._since_snapshot = 0
        offset = self.state.next_offset
        await run_on_disk(self.write_snapshot, self.snapshot_bytes())
        self.durable_offset = max(self.durable_offset, offset)

    # ------------------------------------------------------------------ applied state

    def apply(self, entry: Entry) -> None:
        """Apply one committed entry (called in log order)."""
        if entry.index < self.state.next_offset:  # replayed twice: skip
            if self._shipped_aborts:
                self._record_shipped(entry.index)
            return
        if entry.kind not in _BATCHES:
            # NOOP / config entries take offsets but carry no batch: Raft's own, no transaction
            self._pass_over(entry)
            return
        data = entry.data
        if len(data) >= _HEADER_END and data[_PRODUCER_ID] == _NO_PRODUCER:
            # The common case, a batch of no idempotent producer: only the end of the log and,
            # for a clock entry, the clock move (read straight from the header).
            if entry.kind == EntryKind.CONTROL:
                self._tick(int.from_bytes(data[_MAX_TIMESTAMP], "big", signed=True))
            self._since_snapshot += 1
            self._pass_over(entry)
            return
        try:
            meta = meta_of_batch(entry.data)
        except CorruptBatchError:
            log.error("%s: committed entry %d is not a batch", self.path.parent, entry.index)
            self._pass_over(entry)  # no producer's either: it must not hold the LSO back
            return
        if meta.is_control:  # a marker: stamped by the coordinator's clock
            self._tick(meta.max_timestamp)
        verdict = self.state.apply_batch(entry.index, meta, self.clock_ms)
        self._since_snapshot += 1
        if meta.producer_id < 0:
            return
        if verdict.aborted is not None and self.log is not None:
            # an abort marker just ended a transaction: index it beside its segment
            lso = self.state.last_stable_offset(self.state.next_offset)
            self.log.record_aborted(AbortedTxn(*verdict.aborted, lso))
        if self._rebuild_until is not None:
            self._rebuilt()
        waiter = self._pending.pop(meta.key, None) if self._pending else None
        if verdict.outcome is not Outcome.NEW:
            # The leader checked it before proposing, after applying all of the log before
            # its term: only a leader that broke that rule gets here. The batch is in the log
            # but producer state ignores it; say so loudly.
            log.error(
                "%s: committed batch at %d of producer %d judged %s",
                self.path.parent,
                entry.index,
                meta.producer_id,
                verdict.outcome,
            )
        if waiter is not None and not waiter.done():
            waiter.set_result(entry.index)

    def _pass_over(self, entry: Entry) -> None:
        self.state.pass_over(entry.last_index)
        if self._rebuild_until is not None:
            self._rebuilt()

    def _rebuilt(self) -> None:
        if self._rebuild_until is not None and self.state.next_offset > self._rebuild_until:
            self._rebuild_until = None
            self.log.txn_indexes_rebuilt()

    def _record_shipped(self, index: int) -> None:
        txn = self._shipped_aborts.pop(index, None)
        if txn is not None and self.log is not None:
            self.log.record_aborted(txn)

    # ------------------------------------------------------------------ Raft snapshots

    def snapshot_state(self, index: int) -> bytes:
        """Leader: what a follower installing a Raft snapshot at `index` needs: the applied
        state (at next_offset > index) and the aborts between (their markers reach the
        follower's log after the snapshot, producer state will not apply them again)."""
        end = self.state.next_offset
        aborts = [] if self.log is None else self.log.aborted_txns(index + 1, end)
        shipped = [list(a) for a in aborts if a.last_offset > index]
        return self.snapshot_bytes(aborted_after=shipped)

    def install(self, index: int, payload: bytes | None) -> None:
        """Follower: the log now starts after a Raft snapshot at `index`; take the state the
        leader sent with it (or, without one, start unknowing: Kafka's unknown producer)."""
        self.new_term(OutcomeUnknown("a snapshot replaced the log"))
        self._shipped_aborts = {}
        self._rebuild_until = None
        state = None
        if payload:
            try:
                data = json.loads(payload)
                if data.get("format") != SNAPSHOT_FORMAT:
                    raise ValueError(f"unknown format {data.get('format')!r}")
                state = ProducerStateMachine.restore(data["state"])
                shipped = [AbortedTxn(*a) for a in data.get("aborted_after", ())]
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%s: bad producer state with a snapshot: %s", self.path.parent, exc)
                state = None
        if state is None or state.next_offset <= index:
            log.warning("%s: snapshot at %d without producer state", self.path.parent, index)
            self.state = ProducerStateMachine(index + 1)
            return
        self.state = state
        self.clock_ms = int(data.get("clock_ms", -1))
        self.expired = int(data.get("expired", 0))
        self._shipped_aborts = {a.last_offset: a for a in shipped if a.last_offset > index}
        self._since_snapshot = self.snapshot_every  # write it soon: the old one is useless

    def clock_entry(self, now_ms: int) -> bytes | None:
        """Leader: a clock entry to propose now (a control batch stamped `now_ms`), or None:
        only while producers are known, once per period of the committed clock."""
        if not self.state.producers or now_ms // self._period <= self.clock_ms // self._period:
            return None
        if now_ms // self._period <= self._clock_proposed // self._period:
            return None  # one in flight for this period already
        self._clock_proposed = now_ms
        return build_control_batch(ControlType.PRODUCER_CLOCK, b"", timestamp=now_ms)

    def _tick(self, timestamp: int) -> None:
        """Move the committed clock to a control batch's timestamp; expire producers each
        time it enters a new period (a point that depends on the log alone)."""
        if self.clock_ms < 0 <= timestamp:
            # The log's first clock: the producers applied before it were active until now.
            for producer in self.state.producers.values():
                producer.last_timestamp = max(producer.last_timestamp, timestamp)
        if timestamp > self.clock_ms:
            before = self.clock_ms // self._period
            self.clock_ms = timestamp
            if timestamp // self._period != before:
                self.expired += len(self.state.expire(timestamp, self.expiry_ms))

    def snapshot_due(self) -> bool:
        return self._since_snapshot >= self.snapshot_every and (
            self._writing is None or self._writing.done()
        )

    def start_snapshot(self, run_on_disk: Any) -> None:
        """Write a snapshot of the applied state on the disk pool (one at a time)."""
        self._since_snapshot = 0
        data, offset = self.snapshot_bytes(), self.state.next_offset
        self._writing = asyncio.ensure_future(run_on_disk(self.write_snapshot, data))
        self._writing.add_done_callback(_log_failure)

        def written(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.durable_offset = max(self.durable_offset, offset)

        self._writing.add_done_callback(written)

    # ------------------------------------------------------------------ leader's view

    def check(self, header: BatchHeader, verified: bool = False) -> tuple[Verdict, BatchKey]:
        """The leader's verdict on a data batch (its parsed header) before proposing it;
        `verified`: the coordinator confirmed the transaction a transactional batch starts."""
        assert not header.is_control, "producers never write control batches"
        meta = BatchMeta.of(header)
        return self.state.check(meta, verified=verified), meta.key

    def waiter(self, key: BatchKey) -> asyncio.Future[int]:
        """A future for the base offset of batch `key`, in flight from this leader (a retry
        found it so): set when it is applied, failed when its proposal fails or the term
        ends. Made only for retries, so a first try costs no future."""
        fut = self._pending.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_consume)
            self._pending[key] = fut
        return fut

    def fail(self, key: BatchKey, error: BaseException) -> None:
        """The proposal of `key` failed: later batches of its producer cannot commit either."""
        self.state.abandon(key[0])
        for other in [k for k in self._pending if k[0] == key[0]]:
            fut = self._pending.pop(other)
            if not fut.done():
                fut.set_exception(error)

    def new_term(self, error: BaseException) -> None:
        """A term change: forget the in-flight view and answer every waiter with `error`."""
        self.state.clear_in_flight()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and (error := fut.exception()) is not None:
        log.warning("writing a producer state snapshot failed: %s", error)
