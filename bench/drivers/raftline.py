"""Raftline driver through the project's own asyncio client (raftline.clients.client).

Owns the use of AsyncProducer.send_batch (one record batch and one future per batch; on the
queue workloads, sent on produce streams) and of AsyncConsumer.poll_values (values straight
from the fetched batches, no Message objects).
"""

from __future__ import annotations

import asyncio
import collections
import sys

from bench.drivers.base import Driver, OnAcked, OnDelivery
from raftline.clients.client import AsyncClient, AsyncConsumer, AsyncProducer
from raftline.clients.queueing import QueueMessage

# The node's largest max_messages; 1 MiB answers are the ones a node reads on its loop.
FETCH_MAX_MESSAGES = 100_000
FETCH_MAX_BYTES = 1024 * 1024
FETCH_WAIT_MS = 500
# Queue receivers: one pushed stream each, frames of up to QUEUE_RECEIVE_MAX messages, each
# frame's ack sent at once without holding up the next frame. At most QUEUE_PREFETCH messages
# received and not yet settled: 1,000 per partition, as the RabbitMQ driver's receiver holds
# (prefetch 1,000 per consumer, one consumer per partition's queue); and several frames in
# flight, so that a frame's ack round does not stop the stream.
QUEUE_RECEIVE_MAX = 1000
QUEUE_PREFETCH_PER_PARTITION = 1000
QUEUE_WAIT_MS = 500
QUEUE_LOCK_MS = 30_000


class RaftlineDriver(Driver):
    """acks=all returns once a majority of the partition's replicas have the batch on disk.
    Plain produce (idempotent=False), as every figure before idempotence became the client's
    default; IdempotentRaftlineDriver measures the default."""

    system = "raftline"
    queues = True
    idempotent = False
    honours_retention = True
    # The queue workloads' producer: its batches as frames on one produce stream per leader
    # node (README "Produce streams") rather than one HTTP request each.
    queue_transport = "stream"

    @property
    def durability(self) -> str:
        r = self.endpoint.replicas
        fsync = self.endpoint.extra.get("fsync", "always")
        who = "a majority" if r > 1 else "the one replica"
        if fsync == "always":
            return (
                f"Raft group per partition, replication factor {r}; acks=all answers after "
                f"{who} fsynced the batch; group commit, one fsync per round of batches"
            )
        if fsync != "never":
            return (
                f"Raft group per partition, replication factor {r}, `--fsync {fsync}`; acks=all "
                f"answers after {who} appended the batch; fsync once 256 KB or 100 ms are unsynced"
            )
        lost_by = "a majority of the nodes" if r > 1 else "the machine"
        return (
            f"Raft group per partition, replication factor {r}, `--fsync {fsync}`; acks=all "
            f"answers after {who} wrote the batch to the segment file (OS page cache), no "
            f"fsync first: a killed node process keeps acked messages, a power loss or kernel "
            f"crash of {lost_by} loses what was not yet on disk (the node starts writeback of "
            f"every 64 KiB written, and fsyncs a segment when it rolls at 1 GiB)"
        )

    async def connect(self) -> None:
        self.client = AsyncClient(f"http://{self.endpoint.host}:{self.endpoint.ports['http']}")
        await self.client.cluster()
        self.producers: dict[tuple[str, str], AsyncProducer] = {}
        self.queue_topics: set[str] = set()
        self.queue_errors: collections.Counter[str | None] = collections.Counter()

    async def create_topic(self, topic: str, partitions: int) -> None:
        config = {"retention.bytes": str(self.retention_bytes)} if self.retention_bytes else None
        await self.client.create_topic(topic, partitions, self.endpoint.replicas, config)

    async def delete_topic(self, topic: str, partitions: int) -> None:
        for key in [k for k in self.producers if k[0] == topic]:
            await self.producers.pop(key).close()
        await self.client.delete_topic(topic)

    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        producer = self.producers.get((topic, acks))
        if producer is None:
            transport = self.queue_transport if topic in self.queue_topics else "http"
            producer = AsyncProducer(
                self.client, topic, acks=acks, idempotent=self.idempotent, transport=transport
            )
            self.producers[(topic, acks)] = producer
        await (await producer.send_batch(payloads, partition=partition))

    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        consumer = AsyncConsumer(
            self.client,
            topic,
            partitions=[partition],
            wait_ms=FETCH_WAIT_MS,
            max_messages=FETCH_MAX_MESSAGES,
            max_bytes=FETCH_MAX_BYTES,
        )
        while not stop.is_set():
            values = await consumer.poll_values()
            if values:
                on_delivery(values)  # type: ignore[arg-type]  # bench payloads are never null

    @property
    def queue_durability(self) -> str:
        r = self.endpoint.replicas
        sent = "produce stream (WebSocket) frames" if self.queue_transport == "stream" else "POSTs"
        return (
            f"{self.durability}; batches published as {sent}. "
            "Queue: one over all partitions; each receiver holds a pushed "
            "stream (WebSocket) from the queue's shard leader with prefetch "
            f"{QUEUE_PREFETCH_PER_PARTITION} per partition (messages locked to it and not yet "
            "settled); each frame's receipts are acked "
            "(accept) at once over HTTP, and the ack answers after the settle committed in the "
            f"queue's Raft state group ({r} replica{'s' if r > 1 else ''}, same fsync policy); "
            "a message counts as acknowledged when that answer says it held its lock"
        )

    @staticmethod
    def queue_name(topic: str) -> str:
        return f"{topic}-q"

    async def create_queue(self, topic: str, partitions: int) -> None:
        await self.create_topic(topic, partitions)
        self.queue_topics.add(topic)
        queue = self.client.queue(self.queue_name(topic))
        await queue.create(topic, lock_ms=QUEUE_LOCK_MS, max_deliveries=5)

    async def delete_queue(self, topic: str, partitions: int) -> None:
        await self.client.queue(self.queue_name(topic)).delete()
        await self.delete_topic(topic, partitions)

    async def consume_queue(
        self,
        topic: str,
        partitions: int,
        on_delivery: OnDelivery,
        stop: asyncio.Event,
        on_received: OnDelivery,
        on_ack_sent: OnDelivery,
    ) -> None:
        queue = self.client.queue(
            self.queue_name(topic),
            max_messages=QUEUE_RECEIVE_MAX,
            wait_ms=QUEUE_WAIT_MS,
            stream=True,
            prefetch=QUEUE_PREFETCH_PER_PARTITION * partitions,
        )
        acks: set[asyncio.Task[None]] = set()

        async def settle(messages: list[QueueMessage]) -> None:
            on_ack_sent([m.value for m in messages])
            held = await queue.ack(messages)
            on_delivery([m.value for m, ok in zip(messages, held, strict=True) if ok])
            # why a receipt did not hold, and redeliveries: printed to stderr at close
            self.queue_errors.update(m.error for m in messages if m.error)
            self.queue_errors.update(
                f"delivery_count_{m.delivery_count}" for m in messages if m.delivery_count > 1
            )

        try:
            while not stop.is_set():
                messages = await queue.receive()
                if not messages:
                    continue
                on_received([m.value for m in messages])
                task = asyncio.create_task(settle(messages))
                acks.add(task)
                task.add_done_callback(acks.discard)
            await asyncio.gather(*acks)
        finally:
            await queue.close()

    async def close(self) -> None:
        if getattr(self, "queue_errors", None):
            print(f"queue receive/ack: {dict(self.queue_errors)}", file=sys.stderr)
        for producer in self.producers.values():
            await producer.close()
        await self.client.close()


class IdempotentRaftlineDriver(RaftlineDriver):
    """The client's default producer: idempotent (a producer id, and per partition an epoch
    and a sequence on every batch, checked against producer state on the leader and applied on
    every replica), up to 5 batches in flight per partition."""

    system = "raftline-idempotent"
    idempotent = True

    @property
    def durability(self) -> str:
        return (
            f"{super().durability}; idempotent producer (the client's default): a resent "
            "batch is never written twice"
        )


class PostRaftlineDriver(RaftlineDriver):
    """The queue workloads' producer by POST, one HTTP request per batch: the baseline of the
    produce stream (same nodes as raftline)."""

    system = "raftline-post"
    queue_transport = "http"
