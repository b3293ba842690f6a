"""The transaction coordinator of one shard of transactional ids, applied from its Raft log.

Owns per transactional id its producer id and epoch, Kafka's transaction states (Empty ->
Ongoing -> PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort), the partitions and
pending consumer offsets of the open transaction, its timeout, and the shard's producer id blocks.

Commands are plain dicts, stamped with "now_ms" by the leader that proposes them; apply() is the
only way state changes, so every replica and a restarted one agree.

Invariants:
- (producer id, epoch) of a transactional id strictly increases: init_producer and every
  transaction end bump the epoch (TV2), and an exhausted epoch moves to a fresh producer id.
- A request carrying an older epoch is refused (producer_fenced); so a fenced producer can
  never add to, commit or abort a later transaction, and init_producer aborts the transaction an
  earlier epoch left open.
- The commit/abort decision is durable (Prepare*) before any marker is written; every Prepare*
  transaction is listed by pending_markers() with all its partitions until markers_written
  moves it to Complete*. Markers carry the bumped epoch, so a partition fences the ended
  transaction's late writes.
- Consumer offsets committed inside a transaction leave the coordinator only with a commit
  decision (MarkerRequest.offsets); an abort drops them.
- A transaction open longer than its timeout is listed by expire() and aborted by the
  abort_expired command, which fences its producer as a new epoch does.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .producer_ids import IdBlocks

EPOCH_MAX = 2**15 - 1  # producer epochs are int16
SNAPSHOT_VERSION = 1

TopicPartition = tuple[str, int]


class TxnState(StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


def shard_for(transactional_id: str, shard_count: int) -> int:
    """The coordinator shard (Raft group) owning a transactional id: a hash every process and
    version computes alike (not Python's salted hash())."""
    return zlib.crc32(transactional_id.encode()) % shard_count


COMMANDS = frozenset(
    {
        "producer_ids",
        "init_producer",
        "add_partitions",
        "add_offsets",
        "end_txn",
        "markers_written",
        "abort_expired",
    }
)
PREPARE = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
IDLE = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(slots=True)
class TxnMetadata:
    producer_id: int
    epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    offsets: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)  # group -> ...
    started_ms: int | None = None
    ended_epoch: int | None = None  # the epoch whose own end_txn ended the last transaction


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    """Markers to write for a decided transaction: one control batch per partition, with this
    producer id and (bumped) epoch; then the offsets go to their group coordinators (commit
    only), then the markers_written command completes the transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]
    offsets: tuple[tuple[str, TopicPartition, int], ...] = ()  # (group, partition, offset)


@dataclass(frozen=True, slots=True)
class TxnResult:
    """The answer to one command. error is an API code or None; producer_id and epoch are what
    the producer uses from now on; markers: a decision just made durable, to be written (the
    API answers the producer once markers_written has applied)."""

    error: str | None = None
    producer_id: int | None = None
    producer_epoch: int | None = None
    markers: MarkerRequest | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class TxnCoordinator:
    """One shard of the transaction coordinator: apply(command) -> TxnResult."""

    def __init__(self) -> None:
        self.txns: dict[str, TxnMetadata] = {}
        self.ids = IdBlocks()

    def apply(self, command: dict[str, Any]) -> TxnResult:
        kind = command.get("type")
        if kind not in COMMANDS:
            raise ValueError(f"unknown transaction coordinator command {kind!r}")
        result: TxnResult = getattr(self, f"_on_{kind}")(command)
        return result

    # ------------------------------------------------------------------ queries

    def pending_markers(self) -> list[MarkerRequest]:
        """Every decided transaction whose markers are not known to be written: a new leader
        (re)sends all of them."""
        return [
            self._marker_request(tid, m)
            for tid, m in sorted(self.txns.items())
            if m.state in PREPARE
        ]

    def expire(self, now_ms: int) -> list[tuple[str, int, int]]:
        """(transactional id, producer id, epoch) of transactions open longer than their
        timeout: propose abort_expired for each."""
        return [
            (tid, m.producer_id, m.epoch)
            for tid, m in sorted(self.txns.items())
            if m.state is TxnState.ONGOING and _expired(m, now_ms)
        ]

    # ------------------------------------------------------------------ commands

    def _on_producer_ids(self, cmd: dict[str, Any]) -> TxnResult:
        """{"first", "count"}: a block from the cluster's ProducerIdAllocator."""
        self.ids.add(int(cmd["first"]), int(cmd["count"]))
        return TxnResult()

    def _on_init_producer(self, cmd: dict[str, Any]) -> TxnResult:
        """{"transactional_id", "timeout_ms", "now_ms"}: the id's producer for a new session,
        fencing every earlier epoch; an open transaction of theirs is aborted (markers)."""
        tid = cmd["transactional_id"]
        timeout_ms = int(cmd.get("timeout_ms", 60_000))
        meta = self.txns.get(tid)
        if meta is None:
            pid = self.ids.take()
            if pid is None:
                return TxnResult("producer_ids_exhausted")
            self.txns[tid] = TxnMetadata(pid, 0, timeout_ms)
            return TxnResult(None, pid, 0)
        if meta.state in PREPARE:
            return TxnResult("concurrent_transactions")
        meta.timeout_ms = timeout_ms
        meta.ended_epoch = None
        if meta.state is TxnState.ONGOING:  # fence: abort the open transaction at epoch + 1
            meta.epoch += 1  # Ongoing epochs are below EPOCH_MAX, see _open
            meta.state = TxnState.PREPARE_ABORT
            return TxnResult(None, meta.producer_id, meta.epoch, self._marker_request(tid, meta))
        if meta.epoch + 1 >= EPOCH_MAX:
            pid = self.ids.take()
            if pid is None:
                return TxnResult("producer_ids_exhausted")
            meta.producer_id, meta.epoch = pid, 0
        else:
            meta.epoch += 1
        return TxnResult(None, meta.producer_id, meta.epoch)

    def _on_add_partitions(self, cmd: dict[str, Any]) -> TxnResult:
        """{"transactional_id", "producer_id", "producer_epoch", "partitions": [[topic, p]],
        "now_ms"}: partitions join the transaction (opened if none is); a partition leader
        sends this to verify a transaction's first write to it (KIP-890)."""
        meta, error = self._current(cmd)
        if error is None:
            error = self._open(meta, cmd)
        if error is not None:
            return TxnResult(error)
        assert meta is not None
        meta.partitions.update((str(t), int(p)) for t, p in cmd["partitions"])
        return TxnResult(None, meta.producer_id, meta.epoch)

    def _on_add_offsets(self, cmd: dict[str, Any]) -> TxnResult:
        """{"transactional_id", "producer_id", "producer_epoch", "group",
        "offsets": [[topic, p, offset]], "now_ms"}: consumer offsets committed with the
        transaction, visible to the group only if it commits."""
        meta, error = self._current(cmd)
        if error is None:
            error = self._open(meta, cmd)
        if error is not None:
            return TxnResult(error)
        assert meta is not None
        group = meta.offsets.setdefault(str(cmd["group"]), {})
        for topic, partition, offset in cmd["offsets"]:
            group[(str(topic), int(partition))] = int(offset)
        return TxnResult(None, meta.producer_id, meta.epoch)

    def _on_end_txn(self, cmd: dict[str, Any]) -> TxnResult:
        """{"transactional_id", "producer_id", "producer_epoch", "commit": bool, "now_ms"}:
        decide; the answer's epoch (bumped) is the one for the next transaction."""
        tid = cmd["transactional_id"]
        commit = bool(cmd["commit"])
        meta = self.txns.get(tid)
        epoch = int(cmd["producer_epoch"])
        if meta is not None and _is_retry_of_end(meta, int(cmd["producer_id"]), epoch):
            if _decision(meta.state) != commit:
                return TxnResult("invalid_txn_state")
            return TxnResult(None, meta.producer_id, meta.epoch)
        meta, error = self._current(cmd)
        if error is not None:
            return TxnResult(error)
        assert meta is not None
        if meta.state in PREPARE:
            return TxnResult("concurrent_transactions")
        if meta.epoch + 1 > EPOCH_MAX:
            return TxnResult("epoch_exhausted")
        meta.ended_epoch = meta.epoch
        meta.epoch += 1
        if meta.state is TxnState.ONGOING:
            assert meta.started_ms is not None, "an Ongoing transaction without a start time"
            meta.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            return TxnResult(None, meta.producer_id, meta.epoch, self._marker_request(tid, meta))
        meta.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        return TxnResult(None, meta.producer_id, meta.epoch)

    def _on_markers_written(self, cmd: dict[str, Any]) -> TxnResult:
        """{"transactional_id", "producer_epoch", "now_ms"}: every marker of the decision at
        that epoch is in its partition's log (and offsets are with their groups)."""
        meta = self.txns.get(cmd["transactional_id"])
        if meta is None or meta.state not in PREPARE or meta.epoch != int(cmd["producer_epoch"]):
            return TxnResult("stale_markers")  # already completed, or another decision's
        meta.state = (
            TxnState.COMPLETE_COMMIT
            if meta.state is TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        meta.partitions = set()
        meta.offsets = {}
        meta.started_ms = None
        return TxnResult(None, meta.producer_id, meta.epoch)

    def _on_abort_expired(self, cmd: dict[str, Any]) -> TxnResult:
        """{"transactional_id", "producer_id", "producer_epoch", "now_ms"}: abort a timed-out
        transaction (one expire() listed), fencing its producer."""
        tid = cmd["transactional_id"]
        meta = self.txns.get(tid)
        if (
            meta is None
            or meta.state is not TxnState.ONGOING
            or (meta.producer_id, meta.epoch) != (cmd["producer_id"], cmd["producer_epoch"])
            or not _expired(meta, int(cmd["now_ms"]))
        ):
            return TxnResult("not_expired")
        meta.ended_epoch = None
        meta.epoch += 1
        meta.state = TxnState.PREPARE_ABORT
        return TxnResult(None, meta.producer_id, meta.epoch, self._marker_request(tid, meta))

    # ------------------------------------------------------------------ helpers

    def _current(self, cmd: dict[str, Any]) -> tuple[TxnMetadata | None, str | None]:
        meta = self.txns.get(cmd["transactional_id"])
        if meta is None:
            return None, "unknown_transactional_id"
        if int(cmd["producer_id"]) != meta.producer_id:
            return None, "producer_fenced" if cmd["producer_id"] < meta.producer_id else (
                "invalid_producer_id_mapping"
            )
        epoch = int(cmd["producer_epoch"])
        if epoch < meta.epoch:
            return None, "producer_fenced"
        if epoch > meta.epoch:
            return None, "invalid_producer_epoch"
        return meta, None

    @staticmethod
    def _open(meta: TxnMetadata | None, cmd: dict[str, Any]) -> str | None:
        """Make sure a transaction is open (implicitly, KIP-890 part 2); an error code if not."""
        assert meta is not None
        if meta.state in PREPARE:
            return "concurrent_transactions"
        if meta.state is TxnState.ONGOING:
            return None
        if meta.epoch >= EPOCH_MAX:
            return "epoch_exhausted"  # init_producer moves to a fresh producer id
        meta.state = TxnState.ONGOING
        meta.partitions = set()
        meta.offsets = {}
        meta.started_ms = int(cmd["now_ms"])
        meta.ended_epoch = None
        return None

    @staticmethod
    def _marker_request(tid: str, meta: TxnMetadata) -> MarkerRequest:
        commit = meta.state is TxnState.PREPARE_COMMIT
        offsets = (
            tuple(
                (group, tp, offset)
                for group, committed in sorted(meta.offsets.items())
                for tp, offset in sorted(committed.items())
            )
            if commit
            else ()
        )
        return MarkerRequest(
            tid, meta.producer_id, meta.epoch, commit, tuple(sorted(meta.partitions)), offsets
        )

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "ids": self.ids.snapshot(),
            "txns": {
                tid: {
                    "producer_id": m.producer_id,
                    "epoch": m.epoch,
                    "timeout_ms": m.timeout_ms,
                    "state": m.state.value,
                    "partitions": sorted([t, p] for t, p in m.partitions),
                    "offsets": {
                        g: sorted([t, p, o] for (t, p), o in c.items())
                        for g, c in m.offsets.items()
                    },
                    "started_ms": m.started_ms,
                    "ended_epoch": m.ended_epoch,
                }
                for tid, m in sorted(self.txns.items())
            },
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> TxnCoordinator:
        if snapshot.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unknown coordinator snapshot version {snapshot.get('version')}")
        coordinator = cls()
        coordinator.ids = IdBlocks.restore(snapshot["ids"])
        for tid, m in snapshot["txns"].items():
            coordinator.txns[tid] = TxnMetadata(
                producer_id=m["producer_id"],
                epoch=m["epoch"],
                timeout_ms=m["timeout_ms"],
                state=TxnState(m["state"]),
                partitions={(t, p) for t, p in m["partitions"]},
                offsets={g: {(t, p): o for t, p, o in c} for g, c in m["offsets"].items()},
                started_ms=m["started_ms"],
                ended_epoch=m["ended_epoch"],
            )
        return coordinator


def _expired(meta: TxnMetadata, now_ms: int) -> bool:
    return meta.started_ms is not None and now_ms - meta.started_ms >= meta.timeout_ms


def _decision(state: TxnState) -> bool:
    return state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)


def _is_retry_of_end(meta: TxnMetadata, producer_id: int, epoch: int) -> bool:
    """A repeated end_txn of the producer that ended the last transaction itself (not a fence
    or a timeout, whose producer is fenced): it gets the same answer again."""
    return (
        producer_id == meta.producer_id
        and meta.ended_epoch == epoch
        and meta.epoch == epoch + 1
        and meta.state not in (TxnState.EMPTY, TxnState.ONGOING)
    )
