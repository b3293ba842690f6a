"""The queue duties of a node: queue calls on the queue shards it leads (create, describe,
delete, receive, ack, extend), lock expiry, dead-lettering, checkpoints; and, on a data
partition's leader, the record reads and dead-letter appends a shard leader asks for.

Where the state lives. Queue definitions and the durable per-partition state (delivery counts,
settle decisions, start offsets: node/queues/state.py) are commands in the log of a shard of
the internal topic `__queues` (QUEUES_SHARDS Raft groups, a queue in the shard its name hashes
to), never in the data partition's own log: the data log stays exactly what producers wrote
(Kafka readers, offsets, retention and compaction see no queue traffic); many queues over one
topic do not write into it; and the shard machinery (node/shard.py: commands, results to
proposers, checkpoints that bound the log) is the one consumer groups already use.

What the shard leader keeps in memory only (`Leading`, dropped with its term): the locks
(Acquired records with their deadlines), the records read from the data partitions and not yet
settled (within --queue-cache-bytes over all its queues), where it has read to, and the records
being archived; the read-ahead (views, record cache, tail reads) is node/queues/readahead.py.
After a failover every in-flight
record is available again, or archived when its delivery count is spent (at-least-once; delivery
counts are made durable *before* records are handed out, so none is under-counted).

Dead-lettering is at-least-once: the record is appended to the dead-letter topic with acks=all
first (headers name its source topic, partition, offset, delivery count and why), and only then
is the archive decision committed; a leader that dies in between leaves the record spent (or,
after a reject, marked rejected: that commits before the append) and unsettled, and the next
leader appends it again (a duplicate in the dead-letter topic, never a loss), never delivering
it again. Without a dead-letter topic the record is dropped (settled as such).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from raftline.node.coordinator.service import GROUPS_TOPIC
from raftline.node.errors import BrokerError
from raftline.node.filters import FilterError, Predicate, compile_filter
from raftline.node.queues import partitions, receipts
from raftline.node.queues.readahead import Cache, ReadAhead, View, matched
from raftline.node.queues.state import (
    WINDOW,
    Locks,
    PartitionState,
    Queue,
    QueueError,
    QueueState,
    after_failure,
    after_reject,
    available,
    check_queue,
    due_ms,
    priority,
    spent,
    under_lease,
)
from raftline.node.runtime import Runtime
from raftline.node.shard import ShardLeadership, ShardReplica, not_leader

if TYPE_CHECKING:
    from raftline.node.broker import Broker

log = logging.getLogger(__name__)

QUEUES_TOPIC = "__queues"
QUEUES_SHARDS = 4
QUEUES_TOPIC_CONFIG = {"segment.bytes": str(1 << 20), "retention.ms": "-1"}
CHECKPOINT_EVERY = 1_000
ROUND_S = 0.05  # how often a leader expires locks and archives spent records
MAX_RECEIVE = 1_000
MAX_WAIT_MS = 30_000
OUTCOMES = ("accept", "release", "reject")

Key = tuple[str, int, int]  # (queue, partition, offset)
_T = TypeVar("_T")


# A settle's result -> the receipt's error (None: settled by this receipt).
SETTLE_ERRORS: dict[str, str | None] = {
    "ok": None,
    "already": "already_settled",
    "stale": "lock_expired",  # the record was delivered again since (a lost lock)
    "not_delivered": "already_settled",
}


class QueueReplica(ShardReplica):
    state: QueueState

    def __init__(self, runtime: Runtime, shard: str) -> None:
        super().__init__(runtime, shard, QueueState(), (QueueError,), "queue", CHECKPOINT_EVERY)


@dataclass
class Leading:
    term: int
    locks: Locks = field(default_factory=Locks)
    views: dict[tuple[str, int], View] = field(default_factory=dict)
    busy: set[Key] = field(default_factory=set)  # being handed out or archived
    failing: set[Key] = field(default_factory=set)  # archives that failed (logged once)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: collections.Counter[str] = field(default_factory=collections.Counter)  # by queue
    waited: dict[str, float] = field(default_factory=dict)  # by queue: when a receive last did
    cache: Cache = field(default_factory=Cache)

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def taken(self, queue: str, partition: int) -> set[int]:
        """Offsets of a queue's partition no receive may hand out now: locked, or being handed
        out or archived."""
        taken = self.locks.locked(queue, partition)
        return taken | {o for (q, p, o) in self.busy if q == queue and p == partition}


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


async def together(jobs: list[Coroutine[Any, Any, _T]]) -> list[_T | BaseException]:
    """asyncio.gather(*jobs, return_exceptions=True), but a lone job (a receive or an ack of
    one partition: the usual case at low rates) runs in the caller's task: gather would make
    it a task of its own, two more turns of a busy loop between a record and its receiver."""
    if len(jobs) != 1:
        return await asyncio.gather(*jobs, return_exceptions=True)
    try:
        return [await jobs[0]]
    except Exception as exc:
        return [exc]


class QueueService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.shards: ShardLeadership[QueueReplica, Leading] = ShardLeadership(Leading)
        self._background: set[asyncio.Future[Any]] = set()
        self.reads = ReadAhead(self)  # the views of the data partitions, their reads

    @property
    def _timeout(self) -> float:
        return self.broker.config.request_timeout_s

    # replicas come and go with the metadata

    @property
    def replicas(self) -> dict[str, QueueReplica]:
        """This node's replicas of the shards, by Raft group name."""
        return self.shards.replicas

    def new_replica(self, shard: str) -> QueueReplica:
        return self.shards.add(shard, QueueReplica(self.broker.runtime, shard))

    def drop_replica(self, shard: str) -> None:
        self.shards.drop(shard)

    def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        self.shards.drop_all()

    def _lead(self, shard: str) -> tuple[QueueReplica, Leading]:
        return self.shards.lead(shard)

    def _queue(self, replica: QueueReplica, name: Any) -> Queue:
        queue = replica.state.queues.get(check_queue(name))
        if queue is None:
            raise BrokerError("unknown_queue", f"unknown queue {name!r}")
        return queue

    async def _propose(self, shard: str, command: dict[str, Any]) -> dict[str, Any]:
        replica, _ = self._lead(shard)
        return await replica.propose(command, self._timeout)

    # the calls (Router.on_leader_of brings shard calls to the shard's leader)

    async def handle(self, method: str, args: Any) -> Any:
        handler = getattr(self, f"_call_{method.removeprefix('queue_')}", None)
        if handler is None or not isinstance(args, dict):
            raise BrokerError("invalid_request", f"unknown queue call {method!r}")
        try:
            return await handler(str(args.get("shard")), args)
        except QueueError as exc:
            raise BrokerError(exc.code, exc.message) from None

    async def _ensure_secret(self, shard: str) -> str:
        replica, _ = self._lead(shard)
        if replica.state.secret is None:
            await self._propose(shard, {"op": "secret", "secret": secrets.token_hex(32)})
        secret = replica.state.secret
        assert secret is not None
        return secret

    async def _call_create(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, _ = self._lead(shard)
        await replica.read_barrier(self.broker.router.election_timeout_s)
        topic = str(args.get("topic"))
        await self.broker.topic_partition_count(topic)  # unknown_topic when it does not exist
        dead = args.get("dead_letter_topic")
        if dead is not None:
            await self._dead_letter_topic(str(dead))
        await self._ensure_secret(shard)
        command = {
            **{k: args[k] for k in ("lock_ms", "max_deliveries") if k in args},
            "op": "create",
            "queue": args.get("queue"),
            "topic": topic,
            "dead_letter_topic": dead,
            "incarnation": uuid.uuid4().hex,
            "at_ms": self.broker.clock.now_ms(),
        }
        return await self._propose(shard, command)

    async def _dead_letter_topic(self, name: str) -> None:
        """A missing dead-letter topic is created (one partition, replicated like the
        internal topics), so that dead letters always have a place to go."""
        if name in (GROUPS_TOPIC, QUEUES_TOPIC):
            raise BrokerError("unknown_topic", f"{name!r} is an internal topic")
        try:
            await self.broker.topic_partition_count(name)
            return
        except BrokerError as exc:
            if exc.code != "unknown_topic":
                raise
        replication = min(3, max(len(self.broker.meta.state.nodes), 1))
        try:
            await self.broker.create_topic(name, 1, replication, {})
        except BrokerError as exc:
            if exc.code != "topic_exists":
                raise

    async def _call_delete(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, leading = self._lead(shard)
        await replica.read_barrier(self.broker.router.election_timeout_s)
        queue = self._queue(replica, args.get("queue"))
        await self._propose(shard, {"op": "delete", "queue": queue.name})
        _, leading = self._lead(shard)
        leading.locks.drop_queue(queue.name)
        for key in [k for k in leading.views if k[0] == queue.name]:
            leading.views.pop(key).clear()
        return {}

    async def _call_describe(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, _ = self._lead(shard)
        await replica.read_barrier(self.broker.router.election_timeout_s)
        queue = self._queue(replica, args.get("queue"))
        _, leading = self._lead(shard)
        count = await self.broker.topic_partition_count(queue.topic)
        marks = await self.broker.partition_offsets(queue.topic, list(range(count)))
        ready = locked = 0
        partitions = []
        for p in range(count):
            state = queue.partitions.get(p) or PartitionState()
            log_start, high = marks[p]
            held = leading.locks.locked(queue.name, p)
            view = leading.views.get((queue.name, p))
            # Read offsets are known (records, or gaps settled); the rest are counted as records.
            read_to = max(view.read_to if view is not None else -1, state.start, log_start)
            known = (
                0
                if view is None
                else sum(
                    1
                    for o in view.records
                    if o >= log_start
                    and not state.is_settled(o)
                    and o not in held
                    and state.count(o) < queue.max_deliveries
                )
            )
            unread = high - read_to - sum(1 for o in state.settled if o >= read_to)
            ready += known + max(unread - sum(1 for o in held if o >= read_to), 0)
            locked += len(held)
            partitions.append({"partition": p, "start_offset": state.start, "high_watermark": high})
        return {
            **queue.config(),
            "available": ready,
            "locked": locked,
            "acknowledged": queue.acknowledged,
            "dead_lettered": queue.dead_lettered,
            "dropped": queue.dropped,
            "partitions": partitions,
            "shard": {"name": shard, "leader": self.broker.node_id},
        }

    async def _call_list(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, _ = self._lead(shard)
        await replica.read_barrier(self.broker.router.election_timeout_s)
        return {"queues": [q.config() for q in replica.state.queues.values()]}

    # receive

    async def _call_receive(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, _ = self._lead(shard)
        queue = self._queue(replica, args.get("queue"))
        limit = min(max(int(args.get("max_messages", 10)), 1), MAX_RECEIVE)
        wait_ms = min(max(int(args.get("wait_ms", 0)), 0), MAX_WAIT_MS)
        deadline = time.monotonic() + wait_ms / 1000
        count = await self.broker.topic_partition_count(queue.topic)
        first = int(args.get("turn", 0))  # which partition goes first (spreads the work)
        order = [(first + i) % count for i in range(count)]
        # A filtered receive takes only the records its filter matches; the others are neither
        # locked nor counted as delivered: they stay available to other receivers (as JMS
        # selectors on a queue leave them).
        try:
            matches = compile_filter(args["filter"]).matches if args.get("filter") else None
        except FilterError as exc:  # the receiving node checked it: a node of another version
            raise BrokerError("invalid_request", str(exc)) from None
        while True:
            messages, next_due = await self._take(shard, queue.name, order, limit, matches)
            remaining = deadline - time.monotonic()
            if messages or remaining <= 0:
                return {"messages": messages, "topic": queue.topic}
            if next_due is not None:  # a delayed record falls due: look again then
                remaining = min(remaining, max(next_due - self.broker.clock.now_ms(), 1) / 1000)
            await self.reads.await_records(shard, queue.name, order, remaining)

    async def _take(
        self, shard: str, name: str, order: list[int], limit: int, matches: Predicate | None = None
    ) -> tuple[list[dict[str, Any]], int | None]:
        """Lock and hand out up to `limit` due records, higher priorities first (then the
        partitions in `order`, then offsets); also when the next delayed record falls due."""
        wall = self.broker.clock.now_ms()
        candidates: list[tuple[int, int, int, int]] = []  # (-priority, turn, offset, partition)
        next_due: int | None = None
        for turn, partition in enumerate(order):
            replica, leading = self._lead(shard)
            queue = self._queue(replica, name)
            view = await self.reads.fill(shard, queue, partition, limit, wall, matches)
            replica, leading = self._lead(shard)
            queue = self._queue(replica, name)
            busy = leading.taken(name, partition)
            for offset in available(queue, partition, sorted(view.records), busy, WINDOW):
                record = view.records[offset]
                if matches is not None and not matched(matches, record):
                    continue
                due = due_ms(int(record[1]), record[4])
                if due > wall:
                    next_due = due if next_due is None else min(next_due, due)
                    continue
                candidates.append((-priority(record[4]), turn, offset, partition))
        chosen = sorted(candidates)[:limit]
        by_partition: dict[int, list[int]] = {}
        for _, _, offset, partition in chosen:
            by_partition.setdefault(partition, []).append(offset)
        # The partitions' delivery counts are proposed together: one Raft round (one fsync on
        # a majority), not one per partition in turn.
        delivered = await together(
            [self._deliver(shard, name, p, by_partition[p]) for p in order if p in by_partition]
        )
        out: list[dict[str, Any]] = []
        failure: BaseException | None = None
        for result in delivered:
            if isinstance(result, BaseException):
                if not isinstance(result, BrokerError):
                    raise result
                failure = failure or result
            else:
                out += result
        if failure is not None and not out:
            raise failure  # else hand out what is locked; the rest stays available
        rank = {(p, o): i for i, (_, _, o, p) in enumerate(chosen)}
        out.sort(key=lambda m: rank[(m["partition"], m["record"][0])])
        return out, next_due

    async def _deliver(
        self, shard: str, name: str, partition: int, offsets: list[int]
    ) -> list[dict[str, Any]]:
        """Count a delivery of each offset (durably, first), then lock them to the caller.
        First deliveries under the partition's delivery lease are counted already (the lease
        committed before them): they go out at once; the others wait for a `deliver` command."""
        replica, leading = self._lead(shard)
        queue = self._queue(replica, name)
        view = leading.views[(name, partition)]
        # `offsets` were chosen before the awaits of this receive's other partitions: another
        # receive may have locked or settled some since. Only what is still free goes out
        # (counted again, a record held elsewhere would be delivered twice and its holder's
        # settle refused as stale).
        offsets = available(queue, partition, offsets, leading.taken(name, partition), len(offsets))
        if not offsets:
            return []
        first = under_lease(queue, partition, offsets, view.floor, view.handed)
        if first and not self._hears_majority(shard):
            raise not_leader(shard)  # perhaps deposed: nothing goes out on the lease alone
        view.handed.update(first)
        deadline = now_ms() + queue.lock_ms
        for offset in first:  # locked at once: no other receive may take them meanwhile
            leading.locks.acquire((name, partition, offset), 1, deadline)
        delivered = [[offset, 1] for offset in first]
        if rest := [o for o in offsets if o not in set(first)]:
            try:
                counted = await self._count_deliveries(shard, leading, queue, partition, rest)
            except BrokerError:
                if not first:
                    raise
                counted = []  # the first deliveries are locked: they go out; the rest waits
            deadline = now_ms() + queue.lock_ms
            for offset, count in counted:
                if offset in view.records:  # else settled while the command committed
                    leading.locks.acquire((name, partition, offset), count, deadline)
                    delivered.append([offset, count])
        replica, now_leading = self._lead(shard)
        if now_leading is not leading:
            raise not_leader(shard)
        secret = replica.state.secret or await self._ensure_secret(shard)
        out = []
        for offset, count in delivered:
            record = view.records.get(offset)
            if record is None:  # the queue was deleted meanwhile
                continue
            receipt = receipts.Receipt(queue.incarnation, partition, offset, count)
            out.append(
                {
                    "partition": partition,
                    "record": record,
                    "receipt": receipts.encode(secret, name, receipt),
                    "delivery_count": count,
                }
            )
        return out

    def _hears_majority(self, shard: str) -> bool:
        """Whether this leader still hears from a majority of the shard's replicas. A first
        delivery under the lease commits nothing, so no Raft round would notice a leader cut
        off and replaced: it must not hand records out then, or its receivers would hold
        locks that the new leader hands out again."""
        group = self.broker.runtime.groups.get(shard)
        return group is not None and self.broker.router.electable(group.core.voters)

    async def _count_deliveries(
        self, shard: str, leading: Leading, queue: Queue, partition: int, offsets: list[int]
    ) -> list[list[int]]:
        """Commit one more delivery of each of `offsets`; [offset, count] of those counted."""
        keys = [(queue.name, partition, o) for o in offsets]
        leading.busy.update(keys)
        try:
            command = {
                "op": "deliver",
                "queue": queue.name,
                "incarnation": queue.incarnation,
                "partition": partition,
                "offsets": offsets,
                "leased": (queue.partitions.get(partition) or PartitionState()).leased,
            }
            answer = await self._propose(shard, command)
        finally:
            leading.busy.difference_update(keys)
        delivered: list[list[int]] = answer["delivered"]
        return delivered

    # ack, release, reject, extend

    def _claim(
        self,
        replica: QueueReplica,
        leading: Leading,
        queue: Queue,
        texts: list[Any],
        accepting: bool = False,
    ) -> tuple[list[str | None], list[tuple[int, Key, int]]]:
        """Check each receipt; per receipt an error code or None, and the live locks found
        (index, key, attempt). `accepting`: a receipt whose own delivery was acknowledged
        already is no error (an accept retried after its answer was lost) and claims nothing."""
        errors: list[str | None] = []
        claimed: list[tuple[int, Key, int]] = []
        seen: set[Key] = set()
        now = now_ms()
        for index, text in enumerate(texts):
            try:
                receipt = receipts.decode(replica.state.secret, queue.name, text)
            except QueueError as exc:
                errors.append(exc.code)
                continue
            if receipt.incarnation != queue.incarnation:
                errors.append("invalid_receipt")  # of a deleted queue of the same name
                continue
            key = (queue.name, receipt.partition, receipt.offset)
            error = leading.locks.check(key, receipt.attempt, now)
            if error is None and key in seen:
                error = "duplicate_receipt"
            if error == "lock_expired" and accepting:
                state = queue.partitions.get(receipt.partition)
                if state is not None and state.acknowledged_by(receipt.offset) == receipt.attempt:
                    errors.append(None)
                    continue
            errors.append(error)
            if error is None:
                seen.add(key)
                claimed.append((index, key, receipt.attempt))
        return errors, claimed

    async def _call_ack(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, leading = self._lead(shard)
        queue = self._queue(replica, args.get("queue"))
        outcome = args.get("outcome", "accept")
        texts = args.get("receipts")
        if outcome not in OUTCOMES or not isinstance(texts, list):
            raise BrokerError("invalid_request", f"outcome must be one of {OUTCOMES}")
        errors, claimed = self._claim(replica, leading, queue, texts, outcome == "accept")
        locks = {key: leading.locks.release(key) for _, key, _ in claimed}
        # Unlocked but not yet settled: busy, so that no round takes a spent one for archiving
        # while its acknowledgement commits (it would be acknowledged and dead-lettered both).
        leading.busy.update(locks)
        try:
            await self._settle_claimed(shard, leading, queue, outcome, claimed, errors, locks)
        finally:
            leading.busy.difference_update(locks)
        return {
            "results": [
                {"receipt": text, "ok": error is None, "error": error}
                for text, error in zip(texts, errors, strict=True)
            ]
        }

    async def _settle_claimed(
        self,
        shard: str,
        leading: Leading,
        queue: Queue,
        outcome: str,
        claimed: list[tuple[int, Key, int]],
        errors: list[str | None],
        locks: dict[Key, Any],
    ) -> None:
        locks = dict(locks)
        if outcome == "release":
            for _, key, attempt in claimed:
                decision = after_failure(queue, attempt)
                if decision != "available":
                    await self._archive(shard, key, decision, "max_deliveries", attempt, True)
            leading.wake()
            return
        # An accept commits the acknowledgement; a reject commits the reject first (so that no
        # leader hands the record out again once its dead-letter copy may exist), then archives.
        by_partition: dict[int, list[tuple[int, Key, int]]] = {}
        for index, key, attempt in claimed:
            by_partition.setdefault(key[1], []).append((index, key, attempt))
        # All partitions' commands are proposed together: one Raft round, not one each.
        settled = await together(
            [
                self._decide(shard, leading, queue, outcome, p, items, errors, locks)
                for p, items in by_partition.items()
            ]
        )
        failure = next((r for r in settled if isinstance(r, BaseException)), None)
        if isinstance(failure, BrokerError):
            # Not decided (or not known to be): the locks stay as they were, so the receiver
            # may retry with the same receipts while they last.
            self._restore(shard, leading, locks)
        if failure is not None:
            raise failure
        if outcome == "reject":
            for index, key, attempt in claimed:
                if errors[index] is None:
                    await self._archive(shard, key, after_reject(queue), "rejected", attempt, True)

    async def _decide(
        self,
        shard: str,
        leading: Leading,
        queue: Queue,
        outcome: str,
        partition: int,
        items: list[tuple[int, Key, int]],
        errors: list[str | None],
        locks: dict[Key, Any],
    ) -> None:
        """Commit the acknowledgement (`outcome` accept) or the reject of `items` (of one
        partition): each one's error, and its lock gone from `locks` (decided, or another
        delivery's: never put back)."""
        command = {
            **({"op": "settle", "outcome": "ack"} if outcome == "accept" else {"op": "reject"}),
            "queue": queue.name,
            "incarnation": queue.incarnation,
            "partition": partition,
            "offsets": [key[2] for _, key, _ in items],
            "attempts": [attempt for _, _, attempt in items],
        }
        answer = await self._propose(shard, command)
        view = leading.views.get((queue.name, partition))
        for (index, key, _), result in zip(items, answer["results"], strict=True):
            errors[index] = SETTLE_ERRORS.get(result)
            locks.pop(key, None)
            if view is not None and result == "ok" and outcome == "accept":
                view.drop(key[2])  # frees the cache at once

    def _restore(self, shard: str, leading: Leading, locks: dict[Key, Any]) -> None:
        with contextlib.suppress(BrokerError):
            _, current = self._lead(shard)
            if current is leading:
                for key, lock in locks.items():
                    if lock is not None and key not in leading.locks.held:
                        leading.locks.held[key] = lock

    async def _call_extend(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, leading = self._lead(shard)
        queue = self._queue(replica, args.get("queue"))
        texts = args.get("receipts")
        if not isinstance(texts, list):
            raise BrokerError("invalid_request", "receipts must be a list")
        lock_ms = int(args.get("lock_ms") or queue.lock_ms)
        errors, claimed = self._claim(replica, leading, queue, texts)
        deadline = now_ms() + lock_ms
        for _, key, _ in claimed:
            leading.locks.held[key].deadline_ms = deadline
        return {
            "results": [
                {"receipt": text, "ok": error is None, "error": error}
                for text, error in zip(texts, errors, strict=True)
            ],
            "lock_ms": lock_ms,
        }

    # archiving: dead-letter (at-least-once) or drop

    async def _archive(
        self, shard: str, key: Key, outcome: str, reason: str, count: int, reserved: bool = False
    ) -> None:
        """Settle `key` as dead (after its append to the dead-letter topic) or dropped. A
        failure leaves it to the leader's rounds (this one's or the next's): spent and rejected
        records are found again in the state (`spent`). `reserved`: the caller holds `key` in
        `busy` already (else nobody else may)."""
        replica, leading = self._lead(shard)
        name, partition, offset = key
        if not reserved:
            if key in leading.busy:
                return
            leading.busy.add(key)
        try:
            queue = self._queue(replica, name)
            if outcome == "dead":
                await self._dead_letter(shard, queue, partition, offset, count, reason)
            command = {
                "op": "settle",
                "queue": name,
                "incarnation": queue.incarnation,
                "partition": partition,
                "outcome": outcome,
                "offsets": [offset],
                "attempts": [count],
            }
            await self._propose(shard, command)
            leading.failing.discard(key)
            view = leading.views.get((name, partition))
            if view is not None:
                view.drop(offset)
        except BrokerError as exc:
            if key not in leading.failing:
                leading.failing.add(key)
                log.warning(
                    "archiving %s/%d/%d: %s (retried)", name, partition, offset, exc.message
                )
        finally:
            if not reserved:
                leading.busy.discard(key)

    async def _dead_letter(
        self, shard: str, queue: Queue, partition: int, offset: int, count: int, reason: str
    ) -> None:
        _, leading = self._lead(shard)
        view = leading.views.get((queue.name, partition))
        record = view.records.get(offset) if view is not None else None
        if record is None:
            answer = await self.reads.read(queue, partition, offset, 1, 0, Cache())
            found = [r for r in answer["records"] if int(r[0]) == offset]
            if not found:
                raise BrokerError("leader_unavailable", f"record {offset} could not be read")
            record = found[0]
        dead = str(queue.dead_letter_topic)
        batch = partitions.dead_letter_batch(record, queue.topic, partition, count, reason)
        target = partition % await self.broker.topic_partition_count(dead)
        args = {"topic": dead, "partition": target, "batch": batch}
        await self.broker.partition_call(dead, target, "queue_append", args)

    # calls run on a data partition's leader (node/queues/partitions.py)

    async def _call_read(self, _: str, args: dict[str, Any]) -> dict[str, Any]:
        return await partitions.read(self.broker, args)

    async def _call_append(self, _: str, args: dict[str, Any]) -> int:
        return await partitions.append(self.broker, args)

    # the leader's background duties

    async def run(self) -> None:
        while True:
            await asyncio.sleep(ROUND_S)
            try:
                self._round()
            except Exception:
                log.exception("queue round failed")

    def _round(self) -> None:
        now = now_ms()
        for shard, replica in list(self.shards.replicas.items()):
            if not replica.serving:
                self.shards.leading.pop(shard, None)
                continue
            _, leading = self._lead(shard)
            if replica.state.secret is None:
                self._spawn(self._ensure_secret(shard))
            woke = False
            for key in leading.locks.expired(now):
                lock = leading.locks.release(key)
                queue = replica.state.queues.get(key[0])
                if lock is None or queue is None:
                    continue
                decision = after_failure(queue, lock.attempt)
                if decision == "available":
                    woke = True
                else:
                    self._spawn(self._archive(shard, key, decision, "max_deliveries", lock.attempt))
            for queue in replica.state.queues.values():
                for partition in list(queue.partitions):
                    held = leading.locks.locked(queue.name, partition)
                    busy = held | {
                        o for (q, p, o) in leading.busy if q == queue.name and p == partition
                    }
                    state = queue.partitions[partition]
                    for offset in spent(queue, partition, busy):
                        reason = "rejected" if offset in state.rejected else "max_deliveries"
                        key = (queue.name, partition, offset)
                        count = state.count(offset)
                        self._spawn(self._archive(shard, key, after_reject(queue), reason, count))
            if woke:
                leading.wake()
            self._spawn(replica.maybe_checkpoint(self._timeout))

    def _spawn(self, work: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._settle_task)
        return task

    def _settle_task(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("queue background work: %s", task.exception())

    # gauges

    def metrics_lines(self) -> list[str]:
        """Per queue, from the node leading its shard (so each queue is reported once)."""
        names = ("locked", "acknowledged", "dead_lettered", "dropped")
        lines = [f"# TYPE raftline_queue_{name} gauge" for name in names]
        node = self.broker.node_id
        for shard, replica in self.shards.replicas.items():
            leading = self.shards.leading.get(shard)
            if not replica.serving or leading is None:
                continue
            for queue in replica.state.queues.values():
                held = sum(1 for key in leading.locks.held if key[0] == queue.name)
                values = (held, queue.acknowledged, queue.dead_lettered, queue.dropped)
                labels = f'node="{node}",queue="{queue.name}",topic="{queue.topic}"'
                for name, value in zip(names, values, strict=True):
                    lines.append(f"raftline_queue_{name}{{{labels}}} {value}")
        return lines
