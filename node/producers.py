"""Producer state of one partition replica, driven from its Raft log (issue #15, idempotence).

Owns the replica's ProducerStateMachine (node/eos/producer_state.py) fed from committed entries,
its snapshot file beside the segments, the clock producer expiry reads (the largest committed
batch timestamp, the same on every replica), and the leader's waits on batches still in flight.

Invariants:
- Applied state changes only in apply(), from committed DATA entries in log order, keyed by
  Kafka offsets (entry.index is the batch's base offset); the leader's in-flight view lives in
  the state machine's check()/clear_in_flight() and is wiped on every term change.
- Expiry runs at points that depend on the log alone (each time the committed clock enters a
  new period of expiry_ms / 10), so every replica forgets the same producers at the same
  offset, and a restart (snapshot + replayed tail) reaches the same state.
- A snapshot holds applied state only, valid at its next_offset; it is written atomically
  (temporary file, fsync, rename) and is used on restart only if the log still holds what
  follows it up to the commit index; otherwise the whole log is replayed.
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
from raftline.raftlog.batch import BatchHeader, CorruptBatchError
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
    ) -> None:
        self.path = Path(directory) / SNAPSHOT_FILE
        self.expiry_ms = max(1, expiry_ms)
        self.snapshot_every = max(1, snapshot_every)
        self.state = ProducerStateMachine()
        self.clock_ms = -1  # largest timestamp of a committed data batch: expiry's clock
        self.expired = 0
        self._since_snapshot = 0
        self._writing: asyncio.Future[None] | None = None
        # key of a batch in flight from this leader that a retry awaits -> its base offset
        self._pending: dict[BatchKey, asyncio.Future[int]] = {}

    @property
    def _period(self) -> int:
        return max(1000, self.expiry_ms // 10)

    # ------------------------------------------------------------------ restart

    def load(self, first_index: int, commit: int) -> int:
        """Read the snapshot (blocking: call on the disk pool); returns the offset whose
        predecessor the replica has applied (replay starts at the return value)."""
        start = max(first_index, 0)
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
        self.state = state
        self.clock_ms = int(data.get("clock_ms", -1))
        self.expired = int(data.get("expired", 0))
        # Below the log start (retention trimmed it): keep the state, replay what is left.
        return max(state.next_offset, start)

    def snapshot_bytes(self) -> bytes:
        return json.dumps(
            {
                "format": SNAPSHOT_FORMAT,
                "clock_ms": self.clock_ms,
                "expired": self.expired,
                "state": self.state.snapshot(),
            },
            separators=(",", ":"),
        ).encode()

    def write_snapshot(self, data: bytes) -> None:
        """Blocking: replace the snapshot file atomically and durably."""
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

    # ------------------------------------------------------------------ applied state

    def apply(self, entry: Entry) -> None:
        """Apply one committed entry (called in log order)."""
        if entry.kind not in _BATCHES or entry.index < self.state.next_offset:
            return  # NOOP / config entries take offsets but carry no batch; replayed twice: skip
        data = entry.data
        if len(data) >= _HEADER_END and data[_PRODUCER_ID] == _NO_PRODUCER:
            # The common case, a batch of no idempotent producer: only the end of the log and
            # the clock move (read straight from the header, as meta_of_batch would).
            self._tick(int.from_bytes(data[_MAX_TIMESTAMP], "big", signed=True))
            self.state.next_offset = entry.last_index + 1
            self._since_snapshot += 1
            return
        try:
            meta = meta_of_batch(entry.data)
        except CorruptBatchError:
            log.error("%s: committed entry %d is not a batch", self.path.parent, entry.index)
            return
        if not meta.is_control:
            self._tick(meta.max_timestamp)
        verdict = self.state.apply_batch(entry.index, meta)
        self._since_snapshot += 1
        if meta.producer_id < 0:
            return
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

    def _tick(self, timestamp: int) -> None:
        """Move the committed clock to a data batch's max timestamp; expire producers each
        time it enters a new period (a point that depends on the log alone)."""
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
        data = self.snapshot_bytes()
        self._writing = asyncio.ensure_future(run_on_disk(self.write_snapshot, data))
        self._writing.add_done_callback(_log_failure)

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
