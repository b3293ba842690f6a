"""RabbitMQ quorum-queue driver over AMQP 0-9-1 (aio-pika) with publisher confirms.

Owns the mapping of a topic partition to the durable quorum queue `<topic>-<p>`.
"""

from __future__ import annotations

import asyncio

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.drivers.base import Driver, OnAcked, OnDelivery

PREFETCH = 2000


class QuorumQueueDriver(Driver):
    """Quorum queues confirm after a Raft quorum appended the message to its fsynced WAL."""

    system = "rabbitmq-quorum"

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

    async def close(self) -> None:
        await self.publisher.close()
        await self.consumer.close()
