"""The producer's decisions, written once for both shells: partition, batch, order, send, settle.

Owns the accumulator (linger, size), the batches closed and waiting per partition, which batch
leaves next, the request each batch becomes (compressed as asked) and the settling of its
futures. Invariants: at most one batch per partition is in flight (Kafka's max.in.flight=1
without idempotence), so a batch retried after a failure is never overtaken by a later one of
its partition; a partition's batches leave in the order their messages were sent. No I/O here:
`ProducerCore.sending` is an Op the shell drives.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raftline.clients.core import Call, ClientCore, Op, json_call
from raftline.clients.metadata import Partitioner
from raftline.clients.wire import (
    Acked,
    BatchAcked,
    batch_acked,
    batch_acks,
    batch_request,
    encode_message,
    encode_record,
    json_acks,
    messages_path,
    values_request,
)
from raftline.raftlog.compression import Codec

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

    def sent(self, producer: ProducerCore, url: str | None) -> Op[list[Acked]]:
        messages = [p.message for p in self.pending]
        path = messages_path(producer.topic)
        if producer.client.wire == "json":
            body = {"acks": producer.acks, "messages": messages}
            return json_acks((yield from json_call("POST", path, body, url=url)))
        request = batch_request(self.partition, messages, producer.acks, producer.codec)
        return batch_acks((yield Call("POST", path, request, url)).json())

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

    def sent(self, producer: ProducerCore, url: str | None) -> Op[BatchAcked]:
        request = values_request(
            self.partition, self.values, self.key, producer.acks, producer.codec
        )
        answer = yield Call("POST", messages_path(producer.topic), request, url)
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
    ) -> None:
        self.client = client
        self.topic = topic
        self.acks = acks
        self.codec = codec_of(compression, client.wire)
        self._partitioner = Partitioner()
        self._accumulator = Accumulator(linger_ms, batch_bytes, batch_messages)
        self._waiting: dict[int, deque[Batch]] = {}
        self._in_flight: set[int] = set()

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
        for partition, waiting in list(self._waiting.items()):
            if partition in self._in_flight:
                continue
            out.append(waiting.popleft())
            self._in_flight.add(partition)
            if not waiting:
                del self._waiting[partition]
        return out

    def sending(self, batch: Batch) -> Op[None]:
        """Send `batch` to its partition's leader and settle its futures with the outcome;
        its partition may then send its next batch."""
        assert batch.partition in self._in_flight, "a batch is sent only once ready() chose it"
        try:
            result = yield from self.client.to_leader(
                self.topic, batch.partition, lambda url: batch.sent(self, url)
            )
        except Exception as exc:
            batch.fail(exc)
        else:
            batch.settle(result)  # type: ignore[arg-type]  # each batch gets its own answer
        finally:
            self._in_flight.discard(batch.partition)

    def next_deadline(self) -> float | None:
        """When the oldest open batch is due (monotonic seconds), if any is open."""
        return self._accumulator.next_deadline()

    def idle(self) -> bool:
        """Nothing open, waiting or in flight."""
        return not (len(self._accumulator) or self._waiting or self._in_flight)


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
    ) -> None:
        self.client = client
        self.topic = topic
        self.acks = acks
        self._core = ProducerCore(
            client, topic, acks, compression, linger_ms, batch_bytes, batch_messages
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
