"""RabbitMQ stream driver over the native stream protocol (rstream), confirms per batch.

Owns the mapping of a topic partition to the stream `<topic>-<p>`.
"""

from __future__ import annotations

import asyncio

from rstream import (
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
)

from bench.drivers.base import Driver, OnAcked, OnDelivery

CREDIT = 50  # chunks the broker may push ahead of the consumer


class StreamDriver(Driver):
    """Streams confirm once a quorum of replicas wrote the chunk; osiris does not fsync it."""

    system = "rabbitmq-stream"
    honours_retention = True

    @property
    def durability(self) -> str:
        r = self.endpoint.replicas
        return (
            f"stream per partition, {r} replica{'s' if r > 1 else ''}; confirm after the "
            "chunk is written (page cache, no fsync) on a quorum"
        )

    async def connect(self) -> None:
        port = self.endpoint.ports["stream"]
        host = self.endpoint.host
        self.producer = Producer(host, port, username="guest", password="guest")
        self.consumer = Consumer(host, port, username="guest", password="guest")
        await self.producer.start()
        await self.consumer.start()

    async def create_topic(self, topic: str, partitions: int) -> None:
        for p in range(partitions):
            await self.producer.create_stream(
                self.partition_name(topic, p),
                arguments={
                    "x-initial-cluster-size": self.endpoint.replicas,
                    **self.max_length_argument(),
                },
            )

    async def delete_topic(self, topic: str, partitions: int) -> None:
        for p in range(partitions):
            await self.producer.delete_stream(self.partition_name(topic, p))

    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        stream = self.partition_name(topic, partition)
        if acks == "none":
            await self.producer.send_batch(stream, list(payloads))
            return
        confirmed = asyncio.get_running_loop().create_future()
        outstanding = len(payloads)

        def on_confirm(status: ConfirmationStatus) -> None:
            nonlocal outstanding
            if confirmed.done():
                return
            if not status.is_confirmed:
                confirmed.set_exception(RuntimeError(f"publish refused: {status.response_code}"))
                return
            outstanding -= 1
            if on_acked is not None:
                on_acked(1)
            if outstanding == 0:
                confirmed.set_result(None)

        await self.producer.send_batch(stream, list(payloads), on_publish_confirm=on_confirm)
        await confirmed

    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        def deliver(message: bytes, context: MessageContext) -> None:
            on_delivery([message])

        subscriber = await self.consumer.subscribe(
            self.partition_name(topic, partition),
            deliver,  # type: ignore[arg-type]  # identity decoder hands over raw bytes
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
            initial_credit=CREDIT,
        )
        try:
            await stop.wait()
        finally:
            await self.consumer.unsubscribe(subscriber)

    async def close(self) -> None:
        await self.producer.close()
        await self.consumer.close()
