"""The producer's decisions, written once for both shells: partition, batch, order, send, settle.

Owns the accumulator (linger, size), the batches closed and waiting per partition, which batch
leaves next, the request each batch becomes (compressed as asked) and the settling of its
futures; for an idempotent producer also its id and, per partition, its epoch and next sequence.
Invariants: without idempotence at most one batch per partition is in flight (Kafka's
max.in.flight=1), so a batch retried after a failure is never overtaken by a later one of its
partition; with it up to 5 are (Kafka's rule), each numbered once, when it first leaves, and
resent with the same numbers until acknowledged or its delivery timeout ends, so a retry never
writes twice and the broker keeps them in order (a later batch that arrives first is refused as
out of order and resent once its predecessor is in). A batch that fails for good ends its
epoch on that partition: the next batch starts a new epoch at sequence 0 (KIP-360, locally:
the broker keeps producer state per partition); an out-of-order answer to the oldest batch in
flight (the broker lost the producer's sequence there) numbers every batch in flight again, in
order, in a new epoch from 0. Idempotence is on by default (as in Kafka 3), unless acks is not
"all". A partition's batches leave in the order their messages were sent. No I/O here:
`ProducerCore.sending` is an Op the shell drives.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raftline.clients.core import Call, ClientCore, Op, Pause, json_call
from raftline.clients.metadata import Partitioner
from raftline.clients.wire import (
    Acked,
    BatchAcked,
    ProducerFields,
    RaftlineError,
    Request,
    batch_acked,
    batch_acks,
    batch_request,
    encode_message,
    encode_record,
    json_acks,
    messages_path,
    produce_stream_path,
    streams_batches,
    transactional_fields,
    values_request,
)
from raftline.raftlog.compression import Codec

MAX_IN_FLIGHT_IDEMPOTENT = 5  # batches per partition, as Kafka allows with idempotence
SEQUENCE_MODULUS = 2**31  # sequences wrap after 2**31 - 1, as the broker's do

# The producer's `compression=` option -> the codec of the batches it builds.
COMPRESSIONS: dict[str, Codec] = {
    "none": Codec.NONE,
    "gzip": Codec.GZIP,
    "snappy": Codec.SNAPPY,
    "lz4": Codec.LZ4,
    "zstd": Codec.ZSTD,
}


def codec_of(compression: str, wire: str) -> Codec:
    if compression not in COMPRESSIONS:
        known = ", ".join(COMPRESSIONS)
        raise ValueError(f"compression must be one of {known}, got {compression!r}")
    if compression != "none" and wire != "batch":
        raise ValueError("compression needs wire='batch': JSON bodies are sent as they are")
    return COMPRESSIONS[compression]


@dataclass(slots=True)
class Pending:
    message: Any  # a Record (wire "batch") or a JSON message object (wire "json")
    size: int
    future: Any  # concurrent.futures.Future or asyncio.Future of Acked


class Accumulator:
    """Messages waiting per partition; a batch is ready when full or older than linger_ms."""

    def __init__(self, linger_ms: float, batch_bytes: int, batch_messages: int) -> None:
        self.linger_s = linger_ms / 1000
        self.batch_bytes = batch_bytes
        self.batch_messages = batch_messages
        self.batches: dict[int, list[Pending]] = {}
        self.started: dict[int, float] = {}
        self.sizes: dict[int, int] = {}  # bytes queued per partition, kept as messages arrive
        self.queued = 0

    def add(self, partition: int, pending: Pending) -> bool:
        """Queue one message; True when its partition's batch became full."""
        batch = self.batches.setdefault(partition, [])
        if not batch:
            self.started[partition] = time.monotonic()
            self.sizes[partition] = 0
        batch.append(pending)
        self.sizes[partition] += pending.size
        self.queued += 1
        return self._full(partition)

    def _full(self, partition: int) -> bool:
        return (
            len(self.batches[partition]) >= self.batch_messages
            or self.sizes[partition] >= self.batch_bytes
        )

    def next_deadline(self) -> float | None:
        return min((t + self.linger_s for t in self.started.values()), default=None)

    def drain(self, everything: bool) -> list[tuple[int, list[Pending]]]:
        now = time.monotonic()
        ready = [
            p
            for p in self.batches
            if everything or self._full(p) or now >= self.started[p] + self.linger_s
        ]
        out = [(p, self.batches.pop(p)) for p in ready]
        for p, batch in out:
            self.started.pop(p, None)
            self.sizes.pop(p, None)
            self.queued -= len(batch)
        return out

    def __len__(self) -> int:
        return self.queued


@dataclass(slots=True)
class MessageBatch:
    """Messages that send() queued for one partition, sent as one request."""

    partition: int
    pending: list[Pending]
    producer: ProducerFields | None = None  # an idempotent producer's numbers, set once
    request: Request | None = None  # built once: a retry resends the same bytes

    @property
    def count(self) -> int:
        return len(self.pending)

    def sent(self, producer: ProducerCore, url: str | None) -> Op[list[Acked]]:
        messages = [p.message for p in self.pending]
        path = messages_path(producer.topic)
        if producer.client.wire == "json":
            body: dict[str, Any] = {"acks": producer.acks, "messages": messages}
            if self.producer is not None:
                body.update(self.producer.json_fields())
                body.update(transactional_fields(producer.transactional_id))
            return json_acks((yield from json_call("POST", path, body, url=url)))
        if self.request is None:
            self.request = batch_request(
                self.partition,
                messages,
                producer.acks,
                producer.codec,
                self.producer,
                producer.transactional_id,
            )
        answer = yield Call("POST", path, self.request, url, producer.stream_path)
        return batch_acks(answer.json())

    def settle(self, acked: list[Acked]) -> None:
        # A caller may have cancelled a future meanwhile; its message was sent all the same.
        for pending, where in itertools.zip_longest(self.pending, acked):
            if not pending.future.done():
                pending.future.set_result(where)

    def fail(self, error: BaseException) -> None:
        for pending in self.pending:
            if not pending.future.done():
                pending.future.set_exception(error)


@dataclass(slots=True)
class ValuesBatch:
    """The values of one send_batch (all with `key`), sent as one record batch."""

    partition: int
    values: Sequence[bytes | str | None]
    key: bytes | str | None
    future: Any  # concurrent.futures.Future or asyncio.Future of BatchAcked
    producer: ProducerFields | None = None
    request: Request | None = None  # built once: a retry resends the same bytes

    @property
    def count(self) -> int:
        return len(self.values)

    def sent(self, producer: ProducerCore, url: str | None) -> Op[BatchAcked]:
        if self.request is None:
            self.request = values_request(
                self.partition,
                self.values,
                self.key,
                producer.acks,
                producer.codec,
                self.producer,
                producer.transactional_id,
            )
        path = messages_path(producer.topic)
        answer = yield Call("POST", path, self.request, url, producer.stream_path)
        return batch_acked(answer.json(), self.partition, len(self.values))

    def settle(self, acked: BatchAcked) -> None:
        if not self.future.done():
            self.future.set_result(acked)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


Batch = MessageBatch | ValuesBatch


class ProducerCore:
    """The I/O-free part of both producers: partition choice, open batches, closed batches
    waiting per partition, the partitions with a batch in flight, and the Op that sends one."""

    def __init__(
        self,
        client: ClientCore,
        topic: str,
        acks: str,
        compression: str,
        linger_ms: float,
        batch_bytes: int,
        batch_messages: int,
        idempotent: bool | None = False,  # None: the default of idempotence()
        delivery_timeout_ms: float = 120_000,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        transport: str = "http",
    ) -> None:
        self.client = client
        self.topic = topic
        self.acks = acks
        self.codec = codec_of(compression, client.wire)
        streamed = streams_batches(transport, client.wire, acks, transactional_id)
        # Where batches may go as frames instead of POSTs (None: every batch is a POST).
        self.stream_path = produce_stream_path(topic) if streamed else None
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.txn_error: BaseException | None = None  # a batch of the open transaction failed
        idempotent = idempotence(idempotent, acks, transactional_id)
        self._partitioner = Partitioner()
        self._accumulator = Accumulator(linger_ms, batch_bytes, batch_messages)
        self._waiting: dict[int, deque[Batch]] = {}
        self._in_flight: dict[int, int] = {}  # partition -> batches in flight
        self.idempotent = idempotent
        self.max_in_flight = MAX_IN_FLIGHT_IDEMPOTENT if idempotent else 1
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.producer_id: int | None = None
        self._base_epoch = 0
        self._epochs: dict[int, int] = {}  # partition -> epoch of its next batch
        self._next_sequence: dict[int, int] = {}  # partition -> sequence of its next batch
        self._flying: dict[int, list[Batch]] = {}  # numbered batches in flight, oldest first
        # Partitions where a batch of the current epoch was acknowledged. Until then one batch
        # flies: a broker that does not know the producer (new, or expired) takes any first
        # sequence, so a second batch overtaking the first would be accepted before it.
        self._confirmed: set[int] = set()

    @property
    def needs_identity(self) -> bool:
        """An idempotent producer sends nothing before it has its producer id."""
        return self.idempotent and self.producer_id is None

    def identified(self) -> Op[None]:
        """Get a producer id (once; a second answer, from a racing call, is dropped)."""
        body: dict[str, Any] = {}
        if self.transactional_id is not None:
            body = {
                "transactional_id": self.transactional_id,
                "transaction_timeout_ms": self.transaction_timeout_ms,
            }
        answer = yield from json_call("POST", "/v1/producers", body)
        if self.producer_id is None:
            self.producer_id = int(answer["producer_id"])
            self._base_epoch = int(answer["producer_epoch"])

    def _numbered(self, batch: Batch) -> None:
        """Give a batch leaving for the first time its producer id, epoch and sequence."""
        assert self.producer_id is not None, "an idempotent producer numbers after identified()"
        p = batch.partition
        epoch = self._epochs.setdefault(p, self._base_epoch)
        sequence = self._next_sequence.get(p, 0)
        batch.producer = ProducerFields(self.producer_id, epoch, sequence)
        self._next_sequence[p] = (sequence + batch.count) % SEQUENCE_MODULUS
        self._flying.setdefault(p, []).append(batch)

    def _new_epoch_in_flight(self, partition: int) -> None:
        """KIP-360: the broker answered out of order to the oldest batch in flight, so it lost
        this producer's sequence on the partition (its state expired, or was rebuilt without
        it). None of the batches in flight was written (a written one is answered as a
        duplicate, and the ones after it wait for it): number them all again, in order, in a
        new epoch from 0, and resend."""
        assert self.producer_id is not None
        epoch = self._epochs.get(partition, self._base_epoch) + 1
        self._epochs[partition] = epoch
        sequence = 0
        for batch in self._flying[partition]:
            batch.producer = ProducerFields(self.producer_id, epoch, sequence)
            batch.request = None  # built again with the new numbers
            sequence = (sequence + batch.count) % SEQUENCE_MODULUS
        self._next_sequence[partition] = sequence
        self._confirmed.discard(partition)

    @property
    def linger_s(self) -> float:
        return self._accumulator.linger_s

    def add(
        self,
        partitions: int,
        value: bytes | str | None,
        key: bytes | str | None,
        partition: int | None,
        headers: dict[str, str | bytes] | None,
        timestamp: int | None,
        future: Any,
    ) -> bool:
        """Queue one message for `future`; True when its partition's batch became full."""
        chosen = self._partitioner.choose(self.topic, partitions, key, partition)
        message: Any
        if self.client.wire == "batch":
            message = encode_record(value, key, headers=headers, timestamp=timestamp)
        else:
            message = encode_message(
                value, key, partition=chosen, headers=headers, timestamp=timestamp
            )
        size = len(value or b"") + len(key or b"") + 64
        full = self._accumulator.add(chosen, Pending(message, size, future))
        if full:
            self._partitioner.batch_sent(self.topic)
        return full

    def add_values(
        self,
        partitions: int,
        values: Sequence[bytes | str | None],
        key: bytes | str | None,
        partition: int | None,
        future: Any,
    ) -> None:
        """Queue `values` as a batch of their own, after every message queued before them."""
        if not values:
            raise ValueError("a batch needs at least one value")
        chosen = self._partitioner.choose(self.topic, partitions, key, partition)
        self._partitioner.batch_sent(self.topic)  # the next keyless batch picks anew
        self._close(everything=True)
        self._waiting.setdefault(chosen, deque()).append(ValuesBatch(chosen, values, key, future))

    def _close(self, everything: bool) -> None:
        batches = self._accumulator.drain(everything)
        for partition, pending in batches:
            self._waiting.setdefault(partition, deque()).append(MessageBatch(partition, pending))
        if batches:
            self._partitioner.batch_sent(self.topic)  # keyless messages then pick anew

    def ready(self, everything: bool) -> list[Batch]:
        """The batches to send now, each marked in flight: the oldest closed batch of every
        partition that has none in flight. First closes the open batches that are full or
        older than linger_ms (all of them with `everything`)."""
        self._close(everything)
        out: list[Batch] = []
        if self.needs_identity:
            return out  # the shell calls identified() first
        for partition, waiting in list(self._waiting.items()):
            limit = self.max_in_flight if partition in self._confirmed else 1
            while waiting and self._in_flight.get(partition, 0) < limit:
                batch = waiting.popleft()
                if self.idempotent:
                    self._numbered(batch)
                out.append(batch)
                self._in_flight[partition] = self._in_flight.get(partition, 0) + 1
            if not waiting:
                del self._waiting[partition]
        return out

    def sending(self, batch: Batch) -> Op[None]:
        """Send `batch` to its partition's leader and settle its futures with the outcome;
        its partition may then send its next batch."""
        assert self._in_flight.get(batch.partition), "a batch is sent only once ready() chose it"
        try:
            result = yield from self._delivered(batch)
        except Exception as exc:
            if batch.producer is not None:
                self._failed_for_good(batch.partition, batch.producer)
            batch.fail(exc)
        else:
            fields = batch.producer
            if fields is not None and self._epochs.get(batch.partition) == fields.producer_epoch:
                self._confirmed.add(batch.partition)
            batch.settle(result)  # type: ignore[arg-type]  # each batch gets its own answer
        finally:
            left = self._in_flight[batch.partition] - 1
            if left:
                self._in_flight[batch.partition] = left
            else:
                del self._in_flight[batch.partition]
            if batch.producer is not None:
                flying = [b for b in self._flying[batch.partition] if b is not batch]
                if flying:
                    self._flying[batch.partition] = flying
                else:
                    del self._flying[batch.partition]

    def _delivered(self, batch: Batch) -> Op[Any]:
        """The batch sent until acknowledged. Without idempotence: once (with the client's
        retries). With it, the same numbers again on any retryable failure until the delivery
        timeout, after an out-of-order answer while an earlier batch of the partition is
        still in flight (this one overtook it), and with new numbers after an out-of-order
        answer to the oldest one (see _new_epoch_in_flight) or once they were renumbered."""
        deadline = time.monotonic() + self.delivery_timeout_s
        attempt = 0
        while True:
            numbers = batch.producer
            try:
                return (
                    yield from self.client.to_leader(
                        self.topic, batch.partition, lambda url: batch.sent(self, url)
                    )
                )
            except RaftlineError as error:
                if numbers is None or time.monotonic() >= deadline:
                    raise
                out_of_order = error.code == "out_of_order_sequence"
                oldest = self._flying[batch.partition][0] is batch
                renumbered = batch.producer != numbers  # sent with numbers since replaced
                if out_of_order and oldest and not renumbered and self.transactional_id is None:
                    self._new_epoch_in_flight(batch.partition)
                    renumbered = True
                overtook = renumbered or (out_of_order and not oldest)
                if not (error.retryable or overtook):
                    raise
            attempt += 1
            delay = 0.005 if overtook else self.client.retry.delay(min(attempt, 6))
            yield Pause(delay)  # type: ignore[misc]  # the shells answer a Pause with None

    def _failed_for_good(self, partition: int, fields: ProducerFields) -> None:
        """A numbered batch failed: later numbers of its epoch can never be accepted, so the
        partition's next batch starts a new epoch at 0 (once per failed epoch). In a
        transaction the epoch is the coordinator's: the transaction can only be aborted."""
        if self.transactional_id is not None:
            self.txn_error = self.txn_error or RuntimeError(
                f"a batch of the transaction failed for good on partition {partition}"
            )
            return
        if self._epochs.get(partition) == fields.producer_epoch:
            self._epochs[partition] = fields.producer_epoch + 1
            self._next_sequence[partition] = 0
            self._confirmed.discard(partition)

    # transactions (the shell flushes before ending one)

    def _txn_path(self, action: str) -> str:
        if self.transactional_id is None:
            raise RuntimeError("not a transactional producer (give transactional_id=...)")
        return f"/v1/transactions/{self.transactional_id}/{action}"

    def ended(self, commit: bool) -> Op[None]:
        """Commit or abort the open transaction (everything sent is acknowledged first: the
        shell flushes); the next transaction uses the epoch answered, from sequence 0."""
        path = self._txn_path("commit" if commit else "abort")
        assert self.idle(), "a transaction ends once its batches are acknowledged"
        if commit and self.txn_error is not None:
            raise RuntimeError(f"cannot commit: {self.txn_error}; abort the transaction")
        if self.producer_id is None:
            return  # nothing was ever sent
        body = {"producer_id": self.producer_id, "producer_epoch": self._base_epoch}
        answer = yield from json_call("POST", path, body)
        self.producer_id = int(answer["producer_id"])
        self._base_epoch = int(answer["producer_epoch"])
        self._epochs.clear()
        self._next_sequence.clear()
        self._confirmed.clear()
        self.txn_error = None

    def offsets_sent(
        self,
        group: str,
        offsets: dict[tuple[str, int], int],
        member: tuple[str, int] | None = None,
    ) -> Op[None]:
        """Consumer offsets (next offset to read per (topic, partition)) that `group` commits
        with the open transaction (consume-transform-produce); `member` (member id,
        generation): refused unless that member holds those partitions now (KIP-447)."""
        path = self._txn_path("offsets")
        if self.producer_id is None:
            yield from self.identified()
        body = {
            "producer_id": self.producer_id,
            "producer_epoch": self._base_epoch,
            "group": group,
            "offsets": [
                {"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(offsets.items())
            ],
        }
        if member is not None:
            body["member_id"], body["generation"] = member
        yield from json_call("POST", path, body)

    def next_deadline(self) -> float | None:
        """When the oldest open batch is due (monotonic seconds), if any is open."""
        return self._accumulator.next_deadline()

    def idle(self) -> bool:
        """Nothing open, waiting or in flight."""
        return not (len(self._accumulator) or self._waiting or self._in_flight)


def idempotence(asked: bool | None, acks: str, transactional_id: str | None) -> bool:
    """Whether a producer numbers its batches: by default yes (Kafka 3's enable.idempotence),
    unless acks is not "all" (an answer before commit cannot promise a write happened once);
    always for a transactional producer."""
    if transactional_id is not None:
        if asked is False:
            raise ValueError("a transactional producer is idempotent: drop idempotent=False")
        return True
    if asked and acks != "all":
        raise ValueError(f'idempotence needs acks="all", got acks={acks!r}')
    return acks == "all" if asked is None else asked


class ProducerApi:
    """What both producers are made with and how they take messages, written once; a shell
    supplies `_queued` (where the future comes from and how the sender learns of it)."""

    def __init__(
        self,
        client: ClientCore,
        topic: str,
        *,
        acks: str = "all",
        linger_ms: float = 5,
        batch_bytes: int = 256 * 1024,
        batch_messages: int = 1000,
        compression: str = "none",
        idempotent: bool | None = None,
        delivery_timeout_ms: float = 120_000,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        transport: str = "http",
    ) -> None:
        """`idempotent` (on by default with acks="all", as in Kafka 3; False turns it off):
        get a producer id and number every batch, so that resending a batch after any
        retryable failure (until `delivery_timeout_ms`) never writes it twice; up to 5
        batches per partition are then in flight. `transactional_id`: a transactional
        (and idempotent) producer: every message sent belongs to the open transaction, which
        commit() or abort() ends (send_offsets_to_transaction adds consumer offsets); a new
        producer with the same id fences this one. `transport="stream"`: batches go as frames
        on one produce stream per leader node (README "Produce streams"), many in flight, and
        by POST whenever a stream fails or answers an error; retries are the POST's."""
        self.client = client
        self.topic = topic
        self.acks = acks
        self._core = ProducerCore(
            client,
            topic,
            acks,
            compression,
            linger_ms,
            batch_bytes,
            batch_messages,
            idempotent,
            delivery_timeout_ms,
            transactional_id,
            transaction_timeout_ms,
            transport,
        )

    def _queued(self, add: Callable[[int, Any], bool]) -> Any:
        """`add(partition_count, future)` under the shell's rules; the future (AsyncProducer:
        an awaitable of it). `add` is True when a batch may leave now."""
        raise NotImplementedError

    def send(
        self,
        value: bytes | str | None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        headers: dict[str, str | bytes] | None = None,
        timestamp: int | None = None,
    ) -> Any:
        """Queue one message; returns a future of where it landed (Acked). Header values may
        be text or bytes. AsyncProducer: `await send(...)` gives the asyncio future."""

        def add(partitions: int, future: Any) -> bool:
            return self._core.add(partitions, value, key, partition, headers, timestamp, future)

        return self._queued(add)

    def send_batch(
        self,
        values: Sequence[bytes | str | None],
        *,
        partition: int | None = None,
        key: bytes | str | None = None,
    ) -> Any:
        """Send `values` (all with `key`) to one partition as one batch, without linger and
        after every message sent before; returns one future of BatchAcked for the whole batch,
        failed if the batch is. AsyncProducer: `await send_batch(...)` gives that future."""
        if not values:
            raise ValueError("a batch needs at least one value")

        def add(partitions: int, future: Any) -> bool:
            self._core.add_values(partitions, values, key, partition, future)
            return True

        return self._queued(add)
