"""Redis Streams driver: XADD pipelines per batch, XREAD from the stream start.

Owns the mapping of a topic partition to the stream key `<topic>-<p>`.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as redis

from bench.drivers.base import Driver, OnAcked, OnDelivery

READ_COUNT = 1000
# Retention (sustained runs) keeps at most this much per stream: Redis holds streams in memory.
REDIS_MAX_RETENTION_BYTES = 1 << 30
READ_BLOCK_MS = 500


class RedisStreamsDriver(Driver):
    """With replicas, each batch waits for WAIT replicas-1: asynchronous replication made sync."""

    system = "redis"
    honours_retention = True

    @property
    def durability(self) -> str:
        r = self.endpoint.replicas
        fsync = self.endpoint.extra.get("appendfsync", "always")
        replication = (
            f"primary + {r - 1} replicas, ack after WAIT {r - 1} (async replication, no consensus)"
            if r > 1
            else "single server, no replication"
        )
        return f"{replication}; AOF appendfsync {fsync}"

    def max_entries(self, message_size: int) -> int | None:
        """Entries a stream keeps (XADD MAXLEN ~) under retention_bytes; Redis holds them in
        memory, so never more than REDIS_MAX_RETENTION_BYTES' worth."""
        if not self.retention_bytes:
            return None
        return max(1, min(self.retention_bytes, REDIS_MAX_RETENTION_BYTES) // message_size)

    async def connect(self) -> None:
        self.client = redis.Redis(
            host=self.endpoint.host,
            port=self.endpoint.ports["redis"],
            max_connections=256,
            socket_connect_timeout=5,
        )
        await self.client.ping()

    async def create_topic(self, topic: str, partitions: int) -> None:
        # Streams come into being with their first XADD; start from a clean key.
        await self.delete_topic(topic, partitions)

    async def delete_topic(self, topic: str, partitions: int) -> None:
        await self.client.delete(*(self.partition_name(topic, p) for p in range(partitions)))

    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        key = self.partition_name(topic, partition)
        async with self.client.pipeline(transaction=False) as pipe:
            maxlen = self.max_entries(len(payloads[0])) if payloads else None
            for payload in payloads:
                pipe.xadd(key, {"v": payload}, maxlen=maxlen, approximate=True)
            if acks == "all" and self.endpoint.replicas > 1:
                pipe.wait(self.endpoint.replicas - 1, 10_000)
            results = await pipe.execute()
        if (
            acks == "all"
            and self.endpoint.replicas > 1
            and results[-1] < self.endpoint.replicas - 1
        ):
            raise RuntimeError(
                f"WAIT reached {results[-1]} of {self.endpoint.replicas - 1} replicas"
            )

    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        key = self.partition_name(topic, partition)
        last_id: bytes | str = "0"
        while not stop.is_set():
            answer = await self.client.xread({key: last_id}, count=READ_COUNT, block=READ_BLOCK_MS)
            for _, entries in answer:
                if entries:
                    last_id = entries[-1][0]
                    on_delivery([fields[b"v"] for _, fields in entries])

    async def close(self) -> None:
        await self.client.aclose()
