"""NATS JetStream driver: one file-backed stream per partition, pipelined async publishes.

Owns the mapping of a topic partition to stream `<topic>-<p>` on subject `<topic>.<p>`.
"""

from __future__ import annotations

import asyncio

import nats
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from bench.drivers.base import Driver, OnAcked, OnDelivery

PENDING_LIMIT = 200_000
# Unacknowledged async publishes the client allows: room for every in-flight batch of the
# workloads (16 x 4,000), so NATS pipelines as deeply as the other systems.
PUBLISH_PENDING_LIMIT = 100_000


class NatsDriver(Driver):
    """JetStream acks once the stream's replicas (a Raft quorum when R3) stored the message."""

    system = "nats"
    honours_retention = True

    @property
    def durability(self) -> str:
        r = self.endpoint.replicas
        return (
            f"R{r} file-store stream per partition; PubAck after "
            f"{'a Raft quorum' if r > 1 else 'the one server'} stored it; "
            "nats-server 2.9 fsyncs on a timer (sync_interval 2 min), not per message"
        )

    async def connect(self) -> None:
        url = f"nats://{self.endpoint.host}:{self.endpoint.ports['client']}"
        self.nc = await nats.connect(url, max_reconnect_attempts=3, connect_timeout=5)
        self.js = self.nc.jetstream(publish_async_max_pending=PUBLISH_PENDING_LIMIT)

    async def create_topic(self, topic: str, partitions: int) -> None:
        for p in range(partitions):
            await self.js.add_stream(
                StreamConfig(
                    name=self.partition_name(topic, p),
                    subjects=[f"{topic}.{p}"],
                    storage=StorageType.FILE,
                    num_replicas=self.endpoint.replicas,
                    max_bytes=self.retention_bytes or None,
                )
            )

    async def delete_topic(self, topic: str, partitions: int) -> None:
        for p in range(partitions):
            await self.js.delete_stream(self.partition_name(topic, p))

    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        subject = f"{topic}.{partition}"
        if acks == "none":
            for payload in payloads:
                await self.nc.publish(subject, payload)
            return

        def acked(future: asyncio.Future[object]) -> None:
            if on_acked is not None and not future.cancelled() and future.exception() is None:
                on_acked(1)

        futures = []
        for payload in payloads:
            future = await self.js.publish_async(subject, payload)
            future.add_done_callback(acked)
            futures.append(future)
        await asyncio.gather(*futures)

    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        # A push-mode ordered consumer (no acks, flow control) delivers about ten times faster
        # through nats-py than pull fetches, whose client waits message by message.
        async def deliver(message: Msg) -> None:
            on_delivery([message.data])

        subscription = await self.js.subscribe(
            f"{topic}.{partition}",
            stream=self.partition_name(topic, partition),
            cb=deliver,
            ordered_consumer=True,
            pending_msgs_limit=PENDING_LIMIT,
        )
        try:
            await stop.wait()
        finally:
            await subscription.unsubscribe()

    async def close(self) -> None:
        await self.nc.drain()
