"""The queue state machine of one queue shard: queue definitions and, per queue and partition of
its topic, the durable record states (KIP-932 share-partition state, RabbitMQ delivery counts).

Owns `QueueState.apply(command) -> result` over plain JSON data, `snapshot()` / `restore()`, the
shard's receipt secret, and the leader's in-memory lock table (`Locks`) with the pure rules that
decide what a failed delivery or a reject leads to (`after_failure`, `after_reject`,
`available`). No clocks, sockets or files: the leader stamps times, ids and the secret into the
commands it proposes; every replica applies committed commands in log order to equal states.
A command that breaks a rule raises QueueError and changes nothing.

Record states, per (queue, partition, offset), offset >= the partition's start offset:
- Available: not settled, not locked, delivery count < max_deliveries.
- Acquired: locked by the leader (leader memory only: `Locks`, never replicated; a failover
  makes every in-flight record available again, or archivable when its count is spent).
- Acknowledged / Archived (dead-lettered or dropped) / Gap (an offset that holds no record:
  a control record, a compacted-away key): `settled`, final.
Only durable facts are replicated: delivery counts (incremented by `deliver` *before* the
records are handed out, so a count is never under-counted, even across failovers), settle
decisions (ack, dead, drop, gap), the start offset, the delivery lease and rejects (`reject`
marks a record its receiver rejected: it is never delivered again and the leader archives it,
this one or the next: a reject is decided before its dead-letter copy is written).

The delivery lease (`lease`, per partition): every unsettled offset below it that has no
recorded count counts as delivered once. A leader commits the lease ahead of the records it
reads; a first delivery below it then needs no `deliver` command (and no Raft round) of its own:
its count, 1, is already durable. A new leader cannot know which of those offsets the last one
handed out, so it takes the conservative reading: each counts as delivered once (its next
delivery is the second), so no count is ever under-counted; the price is that after a shard
failover up to a lease's length of records per partition count one delivery they never had.
Queues with max_deliveries 1 get no lease (a phantom delivery would spend a record unseen).

Commands (`op`): secret, create, delete, deliver, settle, skip, lease, reject, checkpoint.

Invariants (the cheap ones asserted in `_compact` and `_apply_settle`):
- Q1 a record is settled at most once: a settle of a settled record changes nothing and
  answers "already" (so no record is ever acknowledged twice).
- Q2 delivery counts never decrease, and never exceed max_deliveries: `deliver` skips a record
  whose count is spent (it waits to be archived).
- Q3 the start offset never decreases; every offset below it is settled (or lost to
  retention through `skip`); no state is kept below it: `deliveries` and `settled` hold only
  offsets >= start, and `start` itself is never settled (compaction).
- Q4 state stays small: deliveries and settle decisions are only kept for offsets in
  [start, start + WINDOW) (a deliver past it is refused), so a partition holds at most WINDOW.
- Q5 only a delivered record can be acknowledged (ack needs a delivery count >= 1).
- Q6 a record is archived only after a reject or once its count reached max_deliveries
  (decided by `after_failure` / `after_reject`, enforced by the leader).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

QUEUE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
RECENT_ACKS = 1_000  # acknowledgements a partition remembers the delivery of (retried accepts)
WINDOW = 2_000  # records past the start offset a partition may track (share.partition.max...)
MIN_LOCK_MS = 100
MAX_LOCK_MS = 12 * 3_600_000
MAX_DELIVERIES = 1_000
LEASE_AHEAD = 500  # offsets a leader leases past what it has read (see the delivery lease)
OUTCOMES = ("ack", "dead", "drop", "gap")


class QueueError(Exception):
    """A command that breaks a queue rule; `code` is an API error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class PartitionState:
    """The durable state of one partition of a queue."""

    start: int = 0  # every offset below is settled
    deliveries: dict[int, int] = field(default_factory=dict)  # unsettled offset -> count
    settled: dict[int, str] = field(default_factory=dict)  # offset > start -> outcome
    # offset -> the delivery that acknowledged it, for the last RECENT_ACKS acknowledgements (in
    # order): an accept retried after its answer was lost (503, outcome unknown) answers ok,
    # also on a new leader, where another delivery's stays lock_expired.
    acked: dict[int, int] = field(default_factory=dict)
    leased: int = 0  # unsettled offsets below it without a count in `deliveries` count 1
    rejected: set[int] = field(default_factory=set)  # unsettled, rejected: to be archived

    def count(self, offset: int, leased: int | None = None) -> int:
        """The delivery count of an unsettled `offset`; `leased`: the lease to read it by
        (the state's own when None)."""
        recorded = self.deliveries.get(offset)
        if recorded is not None:
            return recorded
        return 1 if offset < (self.leased if leased is None else leased) else 0

    def acknowledged_by(self, offset: int) -> int | None:
        """The delivery count that acknowledged `offset`, if it is among the recent ones."""
        return self.acked.get(offset)

    def _remember_ack(self, offset: int, attempt: int) -> None:
        self.acked[offset] = attempt
        while len(self.acked) > RECENT_ACKS:
            del self.acked[next(iter(self.acked))]

    def is_settled(self, offset: int) -> bool:
        return offset < self.start or offset in self.settled

    def _compact(self) -> None:
        while self.start in self.settled:
            del self.settled[self.start]
            self.start += 1
        assert self.start not in self.settled, "Q3: the start offset is never settled"
        assert len(self.deliveries) + len(self.settled) <= WINDOW, "Q4: state outgrew its window"

    def to_json(self) -> list[Any]:
        deliveries, settled = sorted(self.deliveries.items()), sorted(self.settled.items())
        acked = list(self.acked.items())  # in order
        return [self.start, deliveries, settled, acked, self.leased, sorted(self.rejected)]

    @classmethod
    def from_json(cls, data: list[Any]) -> PartitionState:
        # snapshots before `acked` have three items, before `leased` four, before `rejected` five
        start, deliveries, settled, *later = data
        return cls(
            int(start),
            {int(o): int(c) for o, c in deliveries},
            {int(o): str(s) for o, s in settled},
            leased=int(later[1]) if len(later) > 1 else 0,
            rejected={int(o) for o in later[2]} if len(later) > 2 else set(),
            acked={int(o): int(a) for o, a in (later[0] if later else [])},
        )


@dataclass(slots=True)
class Queue:
    name: str
    topic: str
    lock_ms: int
    max_deliveries: int
    dead_letter_topic: str | None
    incarnation: str  # a new id at each create: receipts of a deleted queue never match again
    created_ms: int = 0
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    acknowledged: int = 0
    dead_lettered: int = 0  # appended to the dead-letter topic
    dropped: int = 0  # archived without a dead-letter topic
    lost: int = 0  # records retention removed before they were settled (`skip`)

    def partition(self, partition: int) -> PartitionState:
        state = self.partitions.get(partition)
        if state is None:
            state = self.partitions[partition] = PartitionState()
        return state

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic": self.topic,
            "lock_ms": self.lock_ms,
            "max_deliveries": self.max_deliveries,
            "dead_letter_topic": self.dead_letter_topic,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.config(),
            "incarnation": self.incarnation,
            "created_ms": self.created_ms,
            "partitions": [[p, s.to_json()] for p, s in sorted(self.partitions.items())],
            "counts": [self.acknowledged, self.dead_lettered, self.dropped, self.lost],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Queue:
        acknowledged, dead, dropped, lost = data["counts"]
        return cls(
            name=str(data["name"]),
            topic=str(data["topic"]),
            lock_ms=int(data["lock_ms"]),
            max_deliveries=int(data["max_deliveries"]),
            dead_letter_topic=data.get("dead_letter_topic"),
            incarnation=str(data["incarnation"]),
            created_ms=int(data.get("created_ms", 0)),
            partitions={int(p): PartitionState.from_json(s) for p, s in data["partitions"]},
            acknowledged=int(acknowledged),
            dead_lettered=int(dead),
            dropped=int(dropped),
            lost=int(lost),
        )


@dataclass
class QueueState:
    secret: str | None = None  # hex; the key of receipt MACs, chosen once by a leader
    queues: dict[str, Queue] = field(default_factory=dict)
    # commands applied since the last checkpoint (the leader's checkpoint cadence); not state
    applied_commands: int = field(default=0, compare=False)

    # ---- the replicated interface -----------------------------------------------------------

    def apply(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command.get("op")
        handler = getattr(self, f"_apply_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise QueueError("invalid_request", f"unknown queue command {op!r}")
        self.applied_commands += 1
        result: dict[str, Any] = handler(command)
        return result

    def snapshot(self) -> dict[str, Any]:
        return {
            "secret": self.secret,
            "queues": [q.to_json() for _, q in sorted(self.queues.items())],
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> QueueState:
        state = cls(secret=snapshot.get("secret"))
        for data in snapshot.get("queues", []):
            queue = Queue.from_json(data)
            state.queues[queue.name] = queue
        return state

    # ---- commands ---------------------------------------------------------------------------

    def _apply_checkpoint(self, command: dict[str, Any]) -> dict[str, Any]:
        restored = QueueState.restore(command["snapshot"])
        self.secret, self.queues = restored.secret, restored.queues
        self.applied_commands = 0
        return {"queues": len(self.queues)}

    def _apply_secret(self, command: dict[str, Any]) -> dict[str, Any]:
        """The first secret proposed wins; later ones (another leader's) change nothing."""
        secret = command.get("secret")
        if not isinstance(secret, str) or len(secret) < 32:
            raise QueueError("invalid_request", "a secret is at least 32 hex digits")
        if self.secret is None:
            self.secret = secret
        return {"secret": self.secret}

    def _apply_create(self, command: dict[str, Any]) -> dict[str, Any]:
        queue = queue_of(command)
        existing = self.queues.get(queue.name)
        if existing is not None:
            if existing.config() == queue.config():
                return {"created": False, "queue": existing.config()}  # a retried create
            raise QueueError("queue_exists", f"queue {queue.name!r} exists with another config")
        self.queues[queue.name] = queue
        return {"created": True, "queue": queue.config()}

    def _apply_delete(self, command: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(command)
        del self.queues[queue.name]
        return {}

    def _apply_deliver(self, command: dict[str, Any]) -> dict[str, Any]:
        """Count one delivery of each offset that may be delivered; answer [offset, count] of
        those (the leader locks exactly these). `leased`: the lease the leader knew when it
        proposed; offsets at or above it were not handed out under a lease since, whatever
        lease commits first (so a first delivery proposed as such counts 1, not 2)."""
        queue = self._queue(command)
        state = queue.partition(_index(command.get("partition"), "partition"))
        leased = command.get("leased")
        leased = state.leased if leased is None else min(_index(leased, "leased"), state.leased)
        delivered = []
        for offset in _offsets(command.get("offsets")):
            count = state.count(offset, leased)
            if state.is_settled(offset) or count >= queue.max_deliveries:
                continue  # Q1, Q2: settled, or spent and waiting to be archived
            if offset >= state.start + WINDOW:
                continue  # Q4
            state.deliveries[offset] = count + 1
            delivered.append([offset, count + 1])
        state._compact()
        return {"delivered": delivered}

    def _apply_settle(self, command: dict[str, Any]) -> dict[str, Any]:
        """Settle offsets with one outcome; per offset "ok", "already" (Q1), "stale" (a settle
        of an earlier delivery than the last) or "not_delivered" (Q5: an ack of a record never
        delivered)."""
        queue = self._queue(command)
        state = queue.partition(_index(command.get("partition"), "partition"))
        outcome = command.get("outcome")
        if outcome not in OUTCOMES:
            raise QueueError("invalid_request", f"outcome must be one of {OUTCOMES}")
        offsets = _offsets(command.get("offsets"))
        # The delivery each settle comes from: a settle of an earlier delivery than the last
        # one (its lock was lost with a leader, and the record went to another receiver) is
        # stale and changes nothing, so only the current holder decides a record's fate.
        attempts = command.get("attempts") or [None] * len(offsets)
        if not isinstance(attempts, list) or len(attempts) != len(offsets):
            raise QueueError("invalid_request", "attempts must match offsets")
        results = []
        for offset, attempt in zip(offsets, attempts, strict=True):
            if state.is_settled(offset):
                results.append("already")
                continue
            if attempt is not None and attempt != state.count(offset):
                results.append("stale")
                continue
            if outcome == "ack" and offset in state.rejected:
                results.append("stale")  # its receiver rejected it: only an archive settles it
                continue
            if outcome == "ack" and state.count(offset) < 1:
                results.append("not_delivered")
                continue
            if offset >= state.start + WINDOW:
                results.append("not_delivered")
                continue
            count = state.count(offset)
            state.deliveries.pop(offset, None)
            state.rejected.discard(offset)
            state.settled[offset] = outcome
            if outcome == "ack":
                queue.acknowledged += 1
                state._remember_ack(offset, count)
            elif outcome == "dead":
                queue.dead_lettered += 1
            elif outcome == "drop":
                queue.dropped += 1
            results.append("ok")
        state._compact()
        return {"results": results, "start": state.start}

    def _apply_skip(self, command: dict[str, Any]) -> dict[str, Any]:
        """Retention removed the partition's records below `to`: they can never be delivered."""
        queue = self._queue(command)
        state = queue.partition(_index(command.get("partition"), "partition"))
        to = _index(command.get("to"), "to")
        for offset in range(state.start, to):
            if offset not in state.settled:
                queue.lost += 1
        if to > state.start:
            state.start = to
            state.deliveries = {o: c for o, c in state.deliveries.items() if o >= to}
            state.settled = {o: s for o, s in state.settled.items() if o >= to}
            state.rejected = {o for o in state.rejected if o >= to}
        state._compact()
        return {"start": state.start}

    def _apply_reject(self, command: dict[str, Any]) -> dict[str, Any]:
        """Mark offsets rejected by the delivery that holds them (`attempts`); per offset "ok",
        "already" (settled), "stale" (another delivery's) or "not_delivered"."""
        queue = self._queue(command)
        state = queue.partition(_index(command.get("partition"), "partition"))
        offsets = _offsets(command.get("offsets"))
        attempts = command.get("attempts")
        if not isinstance(attempts, list) or len(attempts) != len(offsets):
            raise QueueError("invalid_request", "attempts must match offsets")
        results = []
        for offset, attempt in zip(offsets, attempts, strict=True):
            if state.is_settled(offset):
                results.append("already")
            elif attempt != state.count(offset):
                results.append("stale")
            elif attempt < 1 or offset >= state.start + WINDOW:
                results.append("not_delivered")
            else:
                state.rejected.add(offset)
                results.append("ok")
        return {"results": results}

    def _apply_lease(self, command: dict[str, Any]) -> dict[str, Any]:
        """Move the partition's delivery lease up to `to` (never down; never past the window:
        nothing beyond it may be delivered)."""
        queue = self._queue(command)
        if queue.max_deliveries < 2:
            raise QueueError("invalid_request", "a queue with max_deliveries 1 has no lease")
        state = queue.partition(_index(command.get("partition"), "partition"))
        to = min(_index(command.get("to"), "to"), state.start + WINDOW)
        state.leased = max(state.leased, to)
        return {"leased": state.leased}

    def _queue(self, command: dict[str, Any]) -> Queue:
        name = check_queue(command.get("queue"))
        queue = self.queues.get(name)
        if queue is None:
            raise QueueError("unknown_queue", f"unknown queue {name!r}")
        incarnation = command.get("incarnation")
        if incarnation is not None and incarnation != queue.incarnation:
            raise QueueError("unknown_queue", f"queue {name!r} was deleted and created again")
        return queue


# ---- the leader's in-memory view: locks -----------------------------------------------------


@dataclass(slots=True)
class Lock:
    attempt: int  # the delivery count this lock was handed out with (its receipt names it)
    deadline_ms: int


class Locks:
    """Acquired records of the queues a leader serves, during one term: never replicated."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int, int], Lock] = {}  # (queue, partition, offset) -> lock

    def acquire(self, key: tuple[str, int, int], attempt: int, deadline_ms: int) -> None:
        assert key not in self.held, f"{key} locked twice"
        self.held[key] = Lock(attempt, deadline_ms)

    def check(self, key: tuple[str, int, int], attempt: int, now_ms: int) -> str | None:
        """None when `attempt` holds a live lock on `key`, else the error code."""
        lock = self.held.get(key)
        if lock is None or lock.attempt != attempt or lock.deadline_ms <= now_ms:
            return "lock_expired"
        return None

    def release(self, key: tuple[str, int, int]) -> Lock | None:
        return self.held.pop(key, None)

    def expired(self, now_ms: int) -> list[tuple[str, int, int]]:
        return [k for k, lock in self.held.items() if lock.deadline_ms <= now_ms]

    def locked(self, queue: str, partition: int) -> set[int]:
        return {o for (q, p, o) in self.held if q == queue and p == partition}

    def drop_queue(self, queue: str) -> None:
        for key in [k for k in self.held if k[0] == queue]:
            del self.held[key]


# ---- the rules the leader applies -----------------------------------------------------------


def after_failure(queue: Queue, count: int) -> str:
    """What a released or expired delivery (the `count`-th) leads to: "available" while
    deliveries remain, else "dead" (to the dead-letter topic) or "drop" when none is set."""
    if count < queue.max_deliveries:
        return "available"
    return after_reject(queue)


def after_reject(queue: Queue) -> str:
    return "dead" if queue.dead_letter_topic else "drop"


def available(
    queue: Queue,
    partition: int,
    offsets: Iterable[int],
    busy: set[int],
    limit: int,
) -> list[int]:
    """Up to `limit` of `offsets` (records that exist, in order) that may be delivered now:
    not settled, not `busy` (locked, or being archived), deliveries left, inside the window."""
    state = queue.partitions.get(partition) or PartitionState()
    out: list[int] = []
    end = state.start + WINDOW
    for offset in offsets:
        if len(out) >= limit or offset >= end:
            break
        if (
            state.is_settled(offset)
            or offset in busy
            or offset in state.rejected
            or state.count(offset) >= queue.max_deliveries
        ):
            continue
        out.append(offset)
    return out


def lease_wanted(queue: Queue, partition: int, read_to: int) -> int | None:
    """Where the leader moves the partition's delivery lease once it has read to `read_to`:
    LEASE_AHEAD past it, when less than half of that is left (so reads stay inside it); None:
    not now (or never: max_deliveries 1)."""
    if queue.max_deliveries < 2:
        return None
    state = queue.partitions.get(partition) or PartitionState()
    if state.leased - read_to >= LEASE_AHEAD // 2:
        return None
    to = min(read_to + LEASE_AHEAD, state.start + WINDOW)
    return to if to > state.leased else None


def under_lease(
    queue: Queue, partition: int, offsets: Iterable[int], floor: int, handed: set[int]
) -> list[int]:
    """Those of `offsets` (deliverable ones) the leader may hand out under the lease, counted
    1 with no `deliver` command: below the lease, with no recorded count, at or above `floor`
    (the lease when this leader began: below it an earlier leader may have handed them out),
    and not `handed` out under the lease already by this leader."""
    state = queue.partitions.get(partition) or PartitionState()
    return [
        o
        for o in offsets
        if floor <= o < state.leased and o not in state.deliveries and o not in handed
    ]


def spent(queue: Queue, partition: int, busy: set[int]) -> list[int]:
    """Unsettled records whose deliveries are spent, or that were rejected, and that nobody
    holds: to be archived (after a failover, the records whose last delivery was in flight,
    and the rejects whose archive did not commit)."""
    state = queue.partitions.get(partition)
    if state is None:
        return []
    out = {o for o, c in state.deliveries.items() if c >= queue.max_deliveries}
    return sorted((out | state.rejected) - busy)


# ---- what a record's headers ask for: delays and priorities ----------------------------------

DELAY_HEADER = "delay_ms"  # not received before the record's timestamp + this many ms
DELIVER_AT_HEADER = "deliver_at"  # not received before this time (ms since the epoch)
PRIORITY_HEADER = "priority"  # 0-9: higher ones are received first among available records
MAX_PRIORITY = 9


def _header_int(headers: Iterable[Any], name: str) -> int | None:
    for item in headers:
        key, value = item[0], item[1]
        if key == name and value is not None:
            try:
                text = value.decode() if isinstance(value, bytes | bytearray) else str(value)
                return int(text.strip())
            except (UnicodeDecodeError, ValueError):
                return None  # a malformed header asks for nothing
    return None


def due_ms(timestamp: int, headers: Iterable[Any]) -> int:
    """When a record may first be received (ms since the epoch; 0: at once). A record carries
    `delay_ms` (relative to its timestamp) or `deliver_at` (absolute); both: the later."""
    headers = list(headers)
    due = 0
    delay = _header_int(headers, DELAY_HEADER)
    if delay is not None and delay > 0:
        due = timestamp + delay
    at = _header_int(headers, DELIVER_AT_HEADER)
    if at is not None and at > due:
        due = at
    return due


def priority(headers: Iterable[Any]) -> int:
    """The record's priority, 0 (the default) to 9; out-of-range values are clamped."""
    value = _header_int(headers, PRIORITY_HEADER)
    return 0 if value is None else min(max(value, 0), MAX_PRIORITY)


# ---- checks ---------------------------------------------------------------------------------


def check_queue(name: Any) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise QueueError(
            "invalid_request", f"queue names are 1-249 of [A-Za-z0-9._-], got {name!r}"
        )
    return name


def queue_of(command: dict[str, Any]) -> Queue:
    name = check_queue(command.get("queue"))
    topic = command.get("topic")
    if not isinstance(topic, str) or not topic:
        raise QueueError("invalid_request", "a queue needs a topic")
    lock_ms = command.get("lock_ms", 30_000)
    if type(lock_ms) is not int or not MIN_LOCK_MS <= lock_ms <= MAX_LOCK_MS:
        raise QueueError("invalid_request", f"lock_ms must be {MIN_LOCK_MS}..{MAX_LOCK_MS}")
    max_deliveries = command.get("max_deliveries", 5)
    if type(max_deliveries) is not int or not 1 <= max_deliveries <= MAX_DELIVERIES:
        raise QueueError("invalid_request", f"max_deliveries must be 1..{MAX_DELIVERIES}")
    dead = command.get("dead_letter_topic")
    if dead is not None and (not isinstance(dead, str) or not dead or dead == topic):
        raise QueueError(
            "invalid_request", "dead_letter_topic must name a topic other than the queue's"
        )
    incarnation = command.get("incarnation")
    if not isinstance(incarnation, str) or not incarnation:
        raise QueueError("invalid_request", "a create carries the queue's incarnation id")
    return Queue(
        name,
        topic,
        lock_ms,
        max_deliveries,
        dead,
        incarnation,
        int(command.get("at_ms", 0)),
    )


def _index(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise QueueError("invalid_request", f"{what} must be a non-negative integer")
    return value


def _offsets(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(type(o) is int and o >= 0 for o in value):
        raise QueueError("invalid_request", "offsets must be a list of non-negative integers")
    return list(dict.fromkeys(value))
