"""RabbitMQ quorum-queue driver over AMQP 0-9-1 (aio-pika) with publisher confirms.

Owns the mapping of a topic partition to the durable quorum queue `<topic>-<p>`.
"""

from __future__ import annotations

import asyncio

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.drivers.base import Driver, OnAcked, OnDelivery

PREFETCH = 2000
# Queue receivers (workload kind "queue-ack"): unacknowledged deliveries per consumer, and
# how many deliveries one `multiple` ack settles at most (the rest within ACK_FLUSH_S).
QUEUE_PREFETCH = 1000
ACK_EVERY = 100
ACK_FLUSH_S = 0.001


class QuorumQueueDriver(Driver):
    """Quorum queues confirm after a Raft quorum appended the message to its fsynced WAL."""

    system = "rabbitmq-quorum"
    honours_retention = True
    queues = True

    @property
    def durability(self) -> str:
        r = self.endpoint.replicas
        return (
            f"quorum queue per partition, {r} replica{'s' if r > 1 else ''}; publisher confirm "
            "after the Ra WAL fsync on a quorum (batched fsync); consumed with auto-ack"
        )

    async def connect(self) -> None:
        url = f"amqp://guest:guest@{self.endpoint.host}:{self.endpoint.ports['amqp']}/"
        self.publisher = await aio_pika.connect(url, timeout=10)
        self.consumer = await aio_pika.connect(url, timeout=10)
        self.confirmed = await self.publisher.channel(publisher_confirms=True)
        self.unconfirmed = await self.publisher.channel(publisher_confirms=False)
        self.consuming = await self.consumer.channel()
        await self.consuming.set_qos(prefetch_count=PREFETCH)

    async def create_topic(self, topic: str, partitions: int) -> None:
        for p in range(partitions):
            await self.confirmed.declare_queue(
                self.partition_name(topic, p),
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-quorum-initial-group-size": self.endpoint.replicas,
                    **self.max_length_argument(),
                },
            )

    async def delete_topic(self, topic: str, partitions: int) -> None:
        for p in range(partitions):
            await self.confirmed.queue_delete(self.partition_name(topic, p))

    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        channel = self.unconfirmed if acks == "none" else self.confirmed
        queue = self.partition_name(topic, partition)

        async def one(payload: bytes) -> None:
            await channel.default_exchange.publish(
                aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue,
            )
            if on_acked is not None:
                on_acked(1)

        await asyncio.gather(*(one(payload) for payload in payloads))

    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        queue = await self.consuming.get_queue(self.partition_name(topic, partition))

        async def deliver(message: AbstractIncomingMessage) -> None:
            on_delivery([message.body])

        tag = await queue.consume(deliver, no_ack=True)
        try:
            await stop.wait()
        finally:
            await queue.cancel(tag)

    @property
    def queue_durability(self) -> str:
        r = self.endpoint.replicas
        return (
            f"quorum queue per partition, {r} replica{'s' if r > 1 else ''}; publisher confirm "
            "after the Ra WAL fsync on a quorum (batched fsync); consumed with manual acks, "
            f"prefetch {QUEUE_PREFETCH} per consumer, acks sent with `multiple` every "
            f"{ACK_EVERY} deliveries or {ACK_FLUSH_S * 1000:.0f} ms; AMQP 0-9-1 does not "
            "confirm an ack, so a message counts as acknowledged when its ack frame is sent"
        )

    async def create_queue(self, topic: str, partitions: int) -> None:
        await self.create_topic(topic, partitions)

    async def delete_queue(self, topic: str, partitions: int) -> None:
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
        """One consumer (own channel) on every partition's quorum queue, with manual acks."""
        channel = await self.consumer.channel()
        await channel.set_qos(prefetch_count=QUEUE_PREFETCH)
        pending: list[AbstractIncomingMessage] = []

        async def flush() -> None:
            if not pending:
                return
            batch = pending[:]
            pending.clear()
            last = max(batch, key=lambda m: m.delivery_tag or 0)
            await last.ack(multiple=True)
            bodies = [m.body for m in batch]
            on_ack_sent(bodies)  # the ack frame is written: sent, and all AMQP 0-9-1 says
            on_delivery(bodies)

        async def deliver(message: AbstractIncomingMessage) -> None:
            on_received([message.body])
            pending.append(message)
            if len(pending) >= ACK_EVERY:
                await flush()

        queues = [await channel.get_queue(self.partition_name(topic, p)) for p in range(partitions)]
        tags = [await q.consume(deliver) for q in queues]
        try:
            while not stop.is_set():
                await asyncio.sleep(ACK_FLUSH_S)
                await flush()
        finally:
            for q, tag in zip(queues, tags, strict=True):
                await q.cancel(tag)
            await channel.close()

    async def close(self) -> None:
        await self.publisher.close()
        await self.consumer.close()
