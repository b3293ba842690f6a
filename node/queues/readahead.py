"""The read-ahead of a queue shard's leader: its views of the data partitions (the records read
and not yet settled, within --queue-cache-bytes), the reads that fill them and the tail reads.

Owns `View` and `Cache` (what the leader holds) and `ReadAhead`: `fill` reads a partition further
when a receive needs more than the view holds; once a receive waits, one tail read per (queue,
partition) long-polls the data partition, puts what comes in the view and wakes waiting receives
(they never read for themselves then), and goes on while receives keep coming; `read` asks the
data partition's leader (partitions.read there);
`lease_ahead` keeps the partition's delivery lease (node/queues/state.py) ahead of the reads, so
that first deliveries of what they bring need no Raft round of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftline.node.errors import BrokerError
from raftline.node.filters import Predicate
from raftline.node.queues.partitions import RawRecord
from raftline.node.queues.state import (
    WINDOW,
    PartitionState,
    Queue,
    available,
    due_ms,
    lease_wanted,
)

if TYPE_CHECKING:
    from raftline.node.queues.service import Leading, QueueService

log = logging.getLogger(__name__)

MAX_READ = 1_000  # records one tail read asks for
TAIL_WAIT_MS = 1_000  # one long-poll read of a tail (it reads again while receives wait)
# A tail reads on this long after a receive of the queue last waited. A caught-up consumer is
# between two receives most of the time (a stream sends its frame, a client acks): a tail that
# stopped whenever none waited left what committed meanwhile to the next receive's own read,
# a node-to-node round trip on its path (measured: a quarter to half of the records at 500
# msg/s on a busy machine, 30 ms p50 later than the ones the tail brought).
TAIL_LINGER_S = 5.0
TAIL_RETRY_S = 0.1  # a tail's pause when the partition has no leader
RECORD_OVERHEAD = 64  # bytes a cached record costs beyond its key, value and headers


@dataclass
class Cache:
    """The bytes of the records a leader holds in its views (bounded by --queue-cache-bytes)."""

    used: int = 0


@dataclass
class View:
    """The leader's window over one partition of a queue."""

    cache: Cache
    records: dict[int, RawRecord] = field(default_factory=dict)  # read, not yet settled
    read_to: int = -1  # next offset to read from the data partition (-1: from the start)
    incarnation: str = ""
    tail: asyncio.Future[Any] | None = None  # the long-poll read while receives wait
    # The delivery lease when the view was made (this term): unrecorded offsets below it may
    # have been handed out by an earlier leader; and the offsets handed out under the lease
    # since (their count, 1, is recorded nowhere but in the lease).
    floor: int = 0
    handed: set[int] = field(default_factory=set)
    leasing: bool = False  # a lease command in flight

    def put(self, record: RawRecord) -> None:
        offset = int(record[0])
        if offset not in self.records:
            self.records[offset] = record
            self.cache.used += record_bytes(record)

    def drop(self, offset: int) -> None:
        self.handed.discard(offset)
        record = self.records.pop(offset, None)
        if record is not None:
            self.cache.used -= record_bytes(record)

    def clear(self) -> None:
        for offset in list(self.records):
            self.drop(offset)


def record_bytes(record: RawRecord) -> int:
    """About what a cached record costs: its key, value and headers, plus a fixed overhead."""
    _, _, key, value, headers = record
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    return size + sum(len(str(h)) + len(v or b"") for h, v in headers)


def matched(matches: Predicate, record: RawRecord) -> bool:
    return matches(record[2], record[4], int(record[1]), int(record[0]))


class ReadAhead:
    """The read-ahead of one node's queue shard leaderships (`service`)."""

    def __init__(self, service: QueueService) -> None:
        self.service = service

    async def fill(
        self,
        shard: str,
        queue: Queue,
        partition: int,
        need: int,
        wall: int,
        matches: Predicate | None = None,
    ) -> View:
        """The leader's view of a partition, read further from the data partition while it
        holds fewer than `need` records deliverable now (`wall`: the time; with `matches`,
        that it matches) and the window allows. While a tail read keeps the view current
        (receives wait, or did lately), it is not read again here."""
        _, leading = self.service._lead(shard)
        view = leading.views.get((queue.name, partition))
        if view is None or view.incarnation != queue.incarnation:
            if view is not None:
                view.clear()
            state = queue.partitions.get(partition) or PartitionState()
            view = View(leading.cache, incarnation=queue.incarnation, floor=state.leased)
            leading.views[(queue.name, partition)] = view
        state = queue.partitions.get(partition) or PartitionState()
        for offset in [o for o in view.records if state.is_settled(o)]:
            view.drop(offset)
        view.read_to = max(view.read_to, state.start)
        self.lease_ahead(shard, queue, partition, view)
        if view.tail is not None:
            return view
        locked = leading.locks.locked(queue.name, partition)
        ready = sum(
            1
            for o in available(queue, partition, sorted(view.records), locked, WINDOW)
            if due_ms(int(view.records[o][1]), view.records[o][4]) <= wall
            and (matches is None or matched(matches, view.records[o]))
        )
        room = self.room(queue, partition, view)
        if ready >= need or room <= 0:
            return view
        try:
            await self.read_into(shard, queue, partition, view, min(max(need, 100), room), 0)
        except BrokerError as exc:
            if not exc.retryable:
                raise
            # This partition has no leader at the moment: the others are served meanwhile.
            log.debug("%s/%d unreadable for queue %s: %s", queue.topic, partition, queue.name, exc)
        return view

    def room(self, queue: Queue, partition: int, view: View) -> int:
        """How many offsets past `view.read_to` the window and the cache bound let it read."""
        state = queue.partitions.get(partition) or PartitionState()
        if view.cache.used >= self.service.broker.config.queue_cache_bytes:
            return 0
        return state.start + WINDOW - view.read_to

    async def read_into(
        self, shard: str, queue: Queue, partition: int, view: View, limit: int, wait_ms: int
    ) -> bool:
        """Read the data partition from `view.read_to` (waiting up to `wait_ms` for records
        when there are none yet) into the view; whether the view moved on."""
        read_from = view.read_to
        answer = await self.read(queue, partition, read_from, limit, wait_ms, view.cache)
        if view.read_to != read_from:  # another read of this view got there first
            return True
        if answer["log_start"] > read_from:  # retention removed records never settled
            await self.service._propose(
                shard,
                {
                    "op": "skip",
                    "queue": queue.name,
                    "incarnation": queue.incarnation,
                    "partition": partition,
                    "to": answer["log_start"],
                },
            )
            view.read_to = max(view.read_to, answer["log_start"])
            return True
        for record in answer["records"]:
            view.put(record)
        next_offset = int(answer["next_offset"])
        got = {int(r[0]) for r in answer["records"]}
        gaps = [o for o in range(read_from, next_offset) if o not in got]
        view.read_to = max(view.read_to, next_offset)
        self.lease_ahead(shard, queue, partition, view)
        if gaps:  # control records and the like: nothing to deliver, settled as gaps
            await self.service._propose(
                shard,
                {
                    "op": "settle",
                    "queue": queue.name,
                    "incarnation": queue.incarnation,
                    "partition": partition,
                    "outcome": "gap",
                    "offsets": gaps,
                },
            )
        return next_offset > read_from

    def lease_ahead(self, shard: str, queue: Queue, partition: int, view: View) -> None:
        """Move the partition's delivery lease ahead of what the view has read, in the
        background (a receive never waits for it: what is above the lease goes out with a
        `deliver` command meanwhile)."""
        to = lease_wanted(queue, partition, view.read_to)
        if to is None or view.leasing:
            return
        view.leasing = True
        command = {
            "op": "lease",
            "queue": queue.name,
            "incarnation": queue.incarnation,
            "partition": partition,
            "to": to,
        }

        async def propose() -> None:
            try:
                await self.service._propose(shard, command)
            except BrokerError as exc:  # the next read or receive asks again
                log.debug("lease of %s/%d not moved: %s", queue.name, partition, exc.message)
            finally:
                view.leasing = False

        self.service._spawn(propose())

    async def read(
        self, queue: Queue, partition: int, offset: int, limit: int, wait_ms: int, cache: Cache
    ) -> dict[str, Any]:
        """Records of a data partition from `offset`, read on its leader (_call_read), as many
        as the cache has room for (at least one batch)."""
        args = {
            "topic": queue.topic,
            "partition": partition,
            "offset": offset,
            "max_messages": limit,
            "max_bytes": max(self.service.broker.config.queue_cache_bytes - cache.used, 1),
            "wait_ms": wait_ms,
        }
        answer: dict[str, Any] = await self.service.broker.partition_call(
            queue.topic, partition, "queue_read", args
        )
        return answer

    async def await_records(
        self, shard: str, name: str, order: list[int], remaining: float
    ) -> None:
        """Until something may be deliverable: new records in a partition (brought by its
        tail read), a release or an expiry here, or the time is up."""
        replica, leading = self.service._lead(shard)
        queue = self.service._queue(replica, name)
        changed = leading.changed
        for partition in order:
            view = leading.views.get((name, partition))
            if view is not None and view.tail is None and self.room(queue, partition, view) > 0:
                view.tail = self.service._spawn(self.tail(shard, leading, name, partition, view))
        leading.waiting[name] += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()
        finally:
            leading.waiting[name] -= 1
            leading.waited[name] = time.monotonic()

    @staticmethod
    def receiving(leading: Leading, name: str) -> bool:
        """Whether a receive of the queue waits, or did within TAIL_LINGER_S."""
        if leading.waiting[name] > 0:
            return True
        waited = leading.waited.get(name)
        return waited is not None and time.monotonic() - waited < TAIL_LINGER_S

    async def tail(
        self, shard: str, leading: Leading, name: str, partition: int, view: View
    ) -> None:
        """One long-poll read at a time on a partition while receives of the queue wait or
        did lately (`receiving`): records are in the view (and the waiting receives woken) as
        soon as they commit, however many receives wait (they share this one read, and none
        reads again), also those that commit while none waits."""
        try:
            while self.receiving(leading, name):
                replica, current = self.service._lead(shard)
                queue = replica.state.queues.get(name)
                if (
                    current is not leading
                    or queue is None
                    or leading.views.get((name, partition)) is not view
                    or view.incarnation != queue.incarnation
                ):
                    return
                room = self.room(queue, partition, view)
                if room <= 0:
                    return  # the window or the cache is full: settles make room first
                started = time.monotonic()
                try:
                    moved = await self.read_into(
                        shard, queue, partition, view, min(room, MAX_READ), TAIL_WAIT_MS
                    )
                except BrokerError as exc:
                    if not exc.retryable:
                        return
                    await asyncio.sleep(TAIL_RETRY_S)  # no leader for the partition just now
                    continue
                if moved:
                    leading.wake()
                elif time.monotonic() - started < TAIL_WAIT_MS / 2_000:
                    # An empty answer that did not wait (a new partition leader whose high
                    # watermark is still behind what was read): never spin on it.
                    await asyncio.sleep(TAIL_RETRY_S)
        finally:
            view.tail = None
