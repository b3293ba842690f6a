"""One local replica of a partition: produce through Raft, committed-only fetch and long-poll.

Owns the high watermark, the produce waiters (acks), the wakeup of long-polling fetches, and
the order of idempotent produce on the leader: check against applied producer state (once an
entry of its own term has committed), then propose; a retry of a batch in flight awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from raftline.node.eos.isolation import read_committed
from raftline.node.eos.markers import build_marker, marker_meta, meta_of_batch
from raftline.node.eos.producer_state import Outcome
from raftline.node.errors import BrokerError, NotLeader, OutcomeUnknown
from raftline.node.producers import PartitionProducers
from raftline.node.runtime import Runtime
from raftline.raftlog.batch import CorruptBatchError, check_crc, iter_headers, parse_header
from raftline.raftlog.log import OffsetOutOfRangeError
from raftline.raftlog.records import iter_batches
from raftline.raftlog.types import Entry, EntryKind

log = logging.getLogger(__name__)

ACKS = ("all", "leader", "none")
LEADER_SETTLE_S = 2.0  # how long a read waits for a new leader to commit its first entry
# Recent applies kept to time the wake-up of the acks and fetches they release (stages.py).
APPLIES_TIMED = 64


class PartitionReplica:
    def __init__(
        self,
        runtime: Runtime,
        group: str,
        topic: str,
        partition: int,
        log: Any,  # raftlog.log.PartitionLog: thread-safe reads of raw batches
        commit: int,
        not_leader: Callable[[str, str], NotLeader],  # (group, message): where the leader is
        timeout_s: float,
        producers: PartitionProducers | None = None,
        # (transactional id, producer id, epoch): the coordinator confirms the transaction is
        # open and holds this partition, or raises (KIP-890 verification)
        verify: Callable[[str, int, int], Awaitable[None]] | None = None,
    ) -> None:
        self.runtime = runtime
        self.group = group
        self.topic = topic
        self.partition = partition
        self.log = log
        self.high_watermark = commit + 1  # the persisted commit index survives restarts
        self._not_leader = not_leader
        self._timeout = timeout_s
        self._role = "follower"
        self._term = 0
        self._term_committed = False  # a leader serves reads once an entry of its term committed
        self._waiters: dict[int, tuple[int, asyncio.Future[int]]] = {}
        # (loop time due, waiter) of acks=all writes in the order they came, and the one timer
        # that fails the overdue: a timer per write (asyncio.timeout) cost ~13 us of the loop
        # per produce request, a share of the node's CPU at one message per request.
        self._deadlines: deque[tuple[float, asyncio.Future[int]]] = deque()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._new_data = asyncio.Event()
        self._applies: deque[tuple[int, float]] = deque(maxlen=APPLIES_TIMED)  # (last, when)
        self._closed = False
        self.producers = producers
        self._verify = verify
        # node.tiering.PartitionTiering when the topic has remote storage: reads below the
        # local log start go to the bucket, TIERED entries go to its manifest state.
        self.remote: Any = None

    # Raft callbacks

    def on_commit(self, entries: list[Entry]) -> None:
        producers = self.producers
        for entry in entries:
            if producers is not None:
                producers.apply(entry)  # before the waiters: a retry's offsets are then known
            if entry.kind is EntryKind.CONTROL and self.remote is not None:
                self.remote.apply_entry(entry)
            waiter = self._waiters.pop(entry.index, None)
            if waiter is not None:
                term, fut = waiter
                if fut.done():
                    continue
                if entry.term == term:
                    fut.set_result(entry.index)
                else:
                    fut.set_exception(self._lost(entry.index, term))
            if entry.term == self._term:
                self._term_committed = True
        last = entries[-1].last_index
        # A proposal whose offset now lies under a different committed entry was overwritten.
        for index in [i for i in self._waiters if i <= last]:
            term, fut = self._waiters.pop(index)
            if not fut.done():
                fut.set_exception(self._lost(index, term))
        # max: a restart replays entries from the producer snapshot on, below the persisted commit
        self.high_watermark = max(self.high_watermark, last + 1)
        self._applies.append((last, time.monotonic()))
        if producers is not None and producers.snapshot_due():
            producers.start_snapshot(self.runtime.run_on_disk)
        self._new_data.set()
        self._new_data = asyncio.Event()

    def on_snapshot(self, index: int, payload: bytes | None) -> None:
        """The log now starts after a Raft snapshot at `index` (this follower lagged behind
        the leader's trim point); `payload`: what the leader's snapshot_state sent with it."""
        if self.producers is not None:
            self.producers.install(index, payload)
        self.high_watermark = max(self.high_watermark, index + 1)

    def keep_clock(self, now_ms: int) -> None:
        """Leader: propose a clock entry if producer state needs one (its expiry clock is read
        from the log: PartitionProducers.clock_entry)."""
        if self._role != "leader" or not self._term_committed or self.producers is None:
            return
        batch = self.producers.clock_entry(now_ms)
        if batch is None:
            return
        try:
            appended = self.runtime.propose(self.group, batch, 1, kind=EntryKind.CONTROL)
        except Exception:  # not the leader any more: the next one proposes it
            return
        appended.add_done_callback(_consume_error)

    def snapshot_state(self, index: int) -> bytes:
        """Leader: the state a follower needs beside a Raft snapshot at `index`."""
        return b"" if self.producers is None else self.producers.snapshot_state(index)

    def on_role(self, role: str, leader: int | None, term: int) -> None:
        if term != self._term:
            self._term_committed = False
            if self.producers is not None:
                self.producers.new_term(self._stepped_down())
        self._role, self._term = role, term
        if self.remote is not None:
            self.remote.on_role(role)
        if role != "leader":
            self._new_data.set()  # long-polls return and the API layer finds the new leader
            self._new_data = asyncio.Event()
            self._abandon_waiters()

    def _abandon_waiters(self) -> None:
        """A leader that stepped down (cut off from its quorum, or replaced) answers its
        pending writes now instead of at their timeout. Unlike `_lost`, the outcome is unknown:
        a write the new leader holds may still commit, so the answer is a retryable 503 that
        does not claim the write failed."""
        waiters, self._waiters = self._waiters, {}
        for _, fut in waiters.values():
            if not fut.done():
                fut.set_exception(self._stepped_down())

    def _stepped_down(self) -> OutcomeUnknown:
        return OutcomeUnknown(
            f"this node stopped leading {self.topic}/{self.partition} before the "
            "write committed; it may still commit under the new leader"
        )

    def _lost(self, offset: int, term: int) -> BrokerError:
        # The API layer retries these (safe: the write can never commit); a post-mortem of a
        # duplicate or a gap starts here.
        log.info(
            "%s/%d: write at offset %d of term %d was overwritten before it committed",
            self.topic,
            self.partition,
            offset,
            term,
        )
        return BrokerError(
            "leader_unavailable",
            f"leadership of {self.topic}/{self.partition} changed before the write committed",
        )

    def _require_leader(self) -> None:
        if self._closed:
            # close() leaves the commit event set for good: a waiter that only re-checked the
            # role would spin on it without ever yielding to the event loop.
            raise BrokerError("leader_unavailable", f"{self.topic}/{self.partition} was closed")
        if self._role != "leader":
            raise self._not_leader(
                self.group,
                f"node {self.runtime.node_id} does not lead {self.topic}/{self.partition}",
            )

    @property
    def log_start_offset(self) -> int:
        local = int(self.log.log_start_offset)
        return local if self.remote is None else int(self.remote.start_offset(local))

    @property
    def role(self) -> str:
        return self._role

    @property
    def timeout_s(self) -> float:
        return self._timeout

    async def until_settled(self) -> None:
        """Return once this replica leads and an entry of its term committed (else raise)."""
        self._require_leader()
        await self._await_term_commit()

    def _time_limit(self, committed: asyncio.Future[int]) -> None:
        """Fail `committed` with a timeout unless it is done within the request timeout."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():  # writes commit in order: done ones lead
            deadlines.popleft()
        loop = asyncio.get_running_loop()
        deadlines.append((loop.time() + self._timeout, committed))
        if self._deadline_timer is None:
            self._deadline_timer = loop.call_at(deadlines[0][0], self._expire_overdue)

    def _expire_overdue(self) -> None:
        """Timer: fail the overdue waiters, then wait for the next one still pending."""
        self._deadline_timer = None
        deadlines = self._deadlines
        loop = asyncio.get_running_loop()
        now = loop.time()
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
            _, committed = deadlines.popleft()
            if not committed.done():
                committed.set_exception(BrokerError("timeout", "the write did not commit in time"))
        if deadlines:
            self._deadline_timer = loop.call_at(deadlines[0][0], self._expire_overdue)

    def _time_wakeup(self, stage: str, index: int) -> None:
        """Record how long ago the entry at `index` was applied (if it was recently)."""
        # The first apply that reached `index`; searched from the newest, where an ack's is.
        found = None
        for last, when in reversed(self._applies):
            if last < index:
                break
            found = when
        if found is not None:
            self.runtime.stage_times.histograms[stage].observe(time.monotonic() - found)

    async def until_committed(self, index: int) -> None:
        """Return once the entry at `index` committed (and was applied here); raise when this
        replica stops leading or the request timeout passes first."""
        try:
            async with asyncio.timeout(self._timeout):
                while self.high_watermark <= index:
                    self._require_leader()
                    await self._new_data.wait()
        except TimeoutError:
            raise BrokerError("timeout", f"entry {index} did not commit in time") from None

    async def _read(self, offset: int, max_bytes: int, upto: int) -> tuple[bytes, list[Any]]:
        """Whole batches from the one holding `offset` (the bucket's below the local log
        start), and the aborted transactions the bucket lists for them."""
        remote = self.remote
        if remote is not None and offset < self.log.log_start_offset:
            answer = await remote.read(offset, max(max_bytes, 1), upto)
            if answer is not None:
                return answer.data, answer.aborted
        try:
            data = await self.runtime.read_log(
                self.group, self.log, offset, max(max_bytes, 1), upto
            )
        except OffsetOutOfRangeError:
            # Local retention moved the log start past `offset` during the read: the bucket
            # holds it now (local disk drops only what a durable manifest names).
            answer = None if remote is None else await remote.read(offset, max(max_bytes, 1), upto)
            if answer is None:
                self._check_offset(offset)  # the client's error (416), not the server's
                raise
            return answer.data, answer.aborted
        return data, []

    # requests

    async def produce(self, batch: bytes, acks: str, crc_checked: bool = False) -> int:
        """Append one record batch; returns its base offset (-1 for acks=none)."""
        base, _ = await self.append(batch, acks, crc_checked)
        return base

    async def append(
        self,
        batch: bytes,
        acks: str,
        crc_checked: bool = False,
        transactional_id: str | None = None,
    ) -> tuple[int, bool]:
        """Append one record batch; returns its base offset (-1 for acks=none) and whether it
        is a duplicate of a batch of the same idempotent producer (then nothing was written
        and the offset is the original's). `crc_checked`: the caller already verified the
        batch's CRC (records.check_batch) or built the batch itself."""
        if acks not in ACKS:
            raise BrokerError("invalid_request", f"acks must be one of {ACKS}")
        try:
            header = parse_header(batch)
            if header.size != len(batch):
                raise CorruptBatchError("the body must hold exactly one record batch")
            if header.is_control:
                raise CorruptBatchError("producers cannot write control batches")
            if not crc_checked:
                check_crc(batch, header)
        except CorruptBatchError as exc:
            raise BrokerError("invalid_request", f"bad record batch: {exc}") from exc
        self._require_leader()
        tracked = False  # an idempotent producer's batch, in the in-flight view once proposed
        key = (header.producer_id, header.producer_epoch, header.base_sequence)
        if header.is_transactional and header.producer_id < 0:
            raise BrokerError("invalid_request", "a transactional batch needs a producer id")
        if header.producer_id >= 0:
            if self.producers is None:
                raise BrokerError("invalid_request", "this partition keeps no producer state")
            # Applied state answers only once everything before this term is applied.
            await self._await_term_commit()
            verdict, key = self.producers.check(header)
            if verdict.outcome is Outcome.NEEDS_VERIFICATION:
                # The transaction's first write here: the coordinator must hold it open with
                # this partition, at this epoch, before it may start here (no hanging ones).
                if transactional_id is None or self._verify is None:
                    raise BrokerError(
                        "invalid_request", "a transactional write needs its transactional_id"
                    )
                await self._verify(transactional_id, header.producer_id, header.producer_epoch)
                self._require_leader()
                await self._await_term_commit()
                verdict, key = self.producers.check(header, verified=True)
            if verdict.outcome is Outcome.DUPLICATE:
                assert verdict.base_offset is not None
                return verdict.base_offset, True
            if verdict.outcome is Outcome.IN_FLIGHT:
                original = self.producers.waiter(key)
                try:
                    async with asyncio.timeout(self._timeout):
                        return await asyncio.shield(original), True
                except TimeoutError:
                    raise BrokerError("timeout", "the original did not commit in time") from None
            if not verdict.accepted:
                raise _refused(verdict.outcome, header.producer_id, header.producer_epoch)
            tracked = True
        loop = asyncio.get_running_loop()
        committed: asyncio.Future[int] = loop.create_future()
        began = time.monotonic()

        def accepted(index: int, term: int) -> None:
            if acks == "all":
                self._waiters[index] = (term, committed)

        try:
            appended = self.runtime.propose(
                self.group, batch, header.offset_count, on_accept=accepted
            )
        except Exception as exc:  # the group went away: the batch was never proposed
            if tracked and self.producers is not None:
                self.producers.fail(key, OutcomeUnknown("the original write was not proposed"))
            raise self._not_leader(self.group, str(exc) or "not the leader") from exc
        if tracked:
            producers = self.producers
            assert producers is not None

            def proposal_done(done: asyncio.Future[Any]) -> None:
                if done.cancelled() or done.exception() is not None:
                    error = OutcomeUnknown("the proposal of the original write failed")
                    producers.fail(key, error)

            appended.add_done_callback(proposal_done)
        if acks == "none":
            appended.add_done_callback(_consume_error)
            return -1, False
        if acks == "all":
            # Commit means a quorum holds the batch durably, the leader's own write possibly
            # still under way; a proposal the core refused fails `committed` instead.
            appended.add_done_callback(lambda done: _fail_with(committed, done))
        try:
            if acks == "leader":
                async with asyncio.timeout(self._timeout):
                    index, _ = await appended
                return index, False
            self._time_limit(committed)
            index = await committed
            self._time_wakeup("ack_wait", index)
            self.runtime.stage_times.histograms["produce"].observe(time.monotonic() - began)
            return index, False
        except TimeoutError:
            raise BrokerError("timeout", "the write did not commit in time") from None
        except BrokerError:
            raise
        except Exception as exc:  # NotLeaderError from the core, or the group went away
            raise self._not_leader(self.group, str(exc) or "not the leader") from exc

    async def fetch(
        self, offset: int, max_bytes: int, wait_ms: int
    ) -> tuple[list[memoryview], int, int]:
        self._require_leader()
        await self._await_term_commit()
        self._check_offset(offset)
        if offset == self.high_watermark and wait_ms > 0:
            event = self._new_data
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_ms / 1000):  # unlike wait_for, no extra task
                    await event.wait()
            if self.high_watermark > offset:
                self._time_wakeup("fetch_wait", offset)
            self._require_leader()
            self._check_offset(offset)
        high_watermark = self.high_watermark
        if offset == high_watermark:
            return [], self.log_start_offset, high_watermark
        try:
            data, _ = await self._read(offset, max_bytes, high_watermark)
        except BrokerError:
            raise
        except Exception:
            if self._closed:  # deleted or moved away while the read ran
                raise BrokerError("leader_unavailable", "the partition was closed") from None
            raise
        view = memoryview(data)  # batches are slices of the one read, never copied
        batches = [view[pos : pos + h.size] for pos, h in iter_headers(view)]
        return batches, self.log_start_offset, high_watermark

    async def write_marker(
        self, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int, now_ms: int
    ) -> None:
        """Leader: append a transaction marker (a control batch) and wait until it commits.
        A marker this partition has moved past (fenced) counts as written."""
        self._require_leader()
        if self.producers is None:
            raise BrokerError("invalid_request", "this partition keeps no producer state")
        await self._await_term_commit()
        fields = {
            "producer_id": producer_id,
            "producer_epoch": epoch,
            "coordinator_epoch": coordinator_epoch,
            "timestamp": now_ms,
        }
        verdict = self.producers.state.check(marker_meta(commit, **fields))
        if verdict.outcome in (Outcome.FENCED, Outcome.COORDINATOR_FENCED):
            return
        if not verdict.accepted:
            raise BrokerError("internal_error", f"marker refused: {verdict.outcome}")
        batch = build_marker(commit, **fields)
        loop = asyncio.get_running_loop()
        committed: asyncio.Future[int] = loop.create_future()

        def accepted(index: int, term: int) -> None:
            self._waiters[index] = (term, committed)

        producers = self.producers
        try:
            appended = self.runtime.propose(
                self.group, batch, 1, kind=EntryKind.CONTROL, on_accept=accepted
            )
        except Exception as exc:
            producers.state.abandon(producer_id)
            raise self._not_leader(self.group, str(exc) or "not the leader") from exc

        def proposal_done(done: asyncio.Future[Any]) -> None:
            if done.cancelled() or done.exception() is not None:
                producers.state.abandon(producer_id)
            _fail_with(committed, done)

        appended.add_done_callback(proposal_done)
        try:
            async with asyncio.timeout(self._timeout):
                await committed
        except TimeoutError:
            raise BrokerError("timeout", "the marker did not commit in time") from None
        except BrokerError:
            raise
        except Exception as exc:
            raise self._not_leader(self.group, str(exc) or "not the leader") from exc

    async def fetch_stable(
        self, offset: int, max_bytes: int, wait_ms: int
    ) -> tuple[list[memoryview], int, int, int, int]:
        """A read_committed fetch: (batches, log start, high watermark, last stable offset,
        end of what was read). Reads below the LSO only (leader, once its term committed, so
        producer state holds everything committed); batches of aborted transactions and
        control batches are left out; `end` lets the reader move past them."""
        self._require_leader()
        await self._await_term_commit()
        self._check_offset(offset)
        producers = self.producers
        assert producers is not None
        lso = producers.state.last_stable_offset(self.high_watermark)
        if offset >= lso and wait_ms > 0:
            deadline = time.monotonic() + wait_ms / 1000
            while offset >= lso and (remaining := deadline - time.monotonic()) > 0:
                event = self._new_data
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await event.wait()
                self._require_leader()
                lso = producers.state.last_stable_offset(self.high_watermark)
            self._check_offset(offset)
        high_watermark = self.high_watermark
        if offset >= lso:
            return [], self.log_start_offset, high_watermark, lso, offset
        data, remote_aborted = await self._read(offset, max_bytes, lso)
        view = memoryview(data)
        raw = [view[pos : pos + h.size] for pos, h in iter_headers(view)]
        end = offset
        batches = []
        for batch in raw:
            meta = meta_of_batch(batch)
            base = parse_header(batch).base_offset
            end = max(end, base + meta.last_offset_delta + 1)
            batches.append((base, meta, batch))
        aborted = self.log.aborted_txns(offset, lso)
        if remote_aborted:  # the local log no longer holds what retention removed
            aborted = sorted({*aborted, *remote_aborted}, key=lambda a: a.first_offset)
        kept = list(read_committed(batches, aborted))
        return kept, self.log_start_offset, high_watermark, lso, end

    async def offset_for_timestamp(self, timestamp: int) -> int:
        """Offset of the first committed message whose timestamp is >= `timestamp` (the time
        index finds its batch; the batch is read to find the record), else the high watermark."""
        self._require_leader()
        await self._await_term_commit()
        high_watermark = self.high_watermark
        base = None
        if self.remote is not None:  # the bucket first: it holds the older records
            base = self.remote.offset_for_timestamp(timestamp, self.log.log_start_offset)
        if base is None:
            base = self.log.offset_for_timestamp(timestamp)
        while base is not None and base < high_watermark:
            data, _ = await self._read(base, 1, high_watermark)
            batches = list(iter_batches(data))
            if not batches:
                break
            decoded = batches[0]
            if not decoded.header.is_control:
                for record in decoded.records:
                    if record.timestamp >= timestamp and record.offset >= base:
                        return int(record.offset)
            base = decoded.header.last_offset + 1  # max timestamp said yes; records said later
        return high_watermark

    async def _await_term_commit(self) -> None:
        """A new leader's high watermark is current once an entry of its term committed (its
        NOOP, a round trip away); reads wait for that briefly instead of failing."""
        deadline = time.monotonic() + LEADER_SETTLE_S
        while not self._term_committed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError("leader_unavailable", "the new leader has not committed yet")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_data.wait(), remaining)
            self._require_leader()

    def _check_offset(self, offset: int) -> None:
        start, high_watermark = self.log_start_offset, self.high_watermark
        if not start <= offset <= high_watermark:
            raise BrokerError(
                "offset_out_of_range",
                f"offset {offset} outside [{start}, {high_watermark}]",
                extra={"log_start_offset": start, "high_watermark": high_watermark},
            )

    def save_producers(self) -> None:
        """Blocking: snapshot producer state now (a clean stop), so a restart replays nothing."""
        if self.producers is not None and self.producers.path.parent.is_dir():
            self.producers.write_snapshot(self.producers.snapshot_bytes())

    def close(self) -> None:
        self._closed = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadlines.clear()
        for _, fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(OutcomeUnknown("the partition was closed"))
        self._waiters.clear()
        self._new_data.set()


def _refused(outcome: Outcome, producer_id: int, epoch: int) -> BrokerError:
    if outcome is Outcome.INVALID_TXN_STATE:
        return BrokerError(
            "invalid_txn_state",
            f"producer {producer_id}: the write does not fit the transaction open on this "
            "partition (a write outside it, or of another epoch before its marker)",
        )
    if outcome is Outcome.OUT_OF_ORDER:
        return BrokerError(
            "out_of_order_sequence",
            f"producer {producer_id}: the sequence does not follow its last batch's",
        )
    if outcome is Outcome.FENCED:
        return BrokerError(
            "producer_fenced", f"producer {producer_id}: epoch {epoch} is older than its current"
        )
    return BrokerError("invalid_request", f"producer {producer_id}: refused ({outcome})")


def _consume_error(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _fail_with(waiter: asyncio.Future[int], done: asyncio.Future[Any]) -> None:
    """Pass a failed proposal's error on to the waiter for its commit."""
    if done.cancelled() or (error := done.exception()) is None:
        return
    if not waiter.done():
        waiter.set_exception(error)
