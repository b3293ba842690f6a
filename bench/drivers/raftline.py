"""Raftline driver over the v1 HTTP contract (shared API.md), with aiohttp directly.

Owns produce batches as one POST per partition batch and long-poll fetches per partition.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp

from bench.drivers.base import Driver, OnDelivery

FETCH_MAX_MESSAGES = 1000
FETCH_MAX_BYTES = 16 * 1024 * 1024
FETCH_WAIT_MS = 500


class RaftlineError(RuntimeError):
    """A non-2xx answer from a Raftline node, with the contract's error code."""


class RaftlineDriver(Driver):
    """acks=all returns once a majority of the partition's replicas have the batch on disk."""

    system = "raftline"

    @property
    def durability(self) -> str:
        r = self.endpoint.replicas
        return (
            f"Raft group per partition, replication factor {r}; acks=all answers after "
            f"{'a majority' if r > 1 else 'the one replica'} wrote the batch to its segment"
        )

    async def connect(self) -> None:
        self.base = f"http://{self.endpoint.host}:{self.endpoint.ports['http']}"
        connector = aiohttp.TCPConnector(limit=256)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60)
        )

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        async with self.session.request(method, self.base + path, **kwargs) as response:
            if response.status >= 400:
                raise RaftlineError(f"{method} {path}: {response.status} {await response.text()}")
            if response.status == 204 or response.content_length == 0:
                return None
            return await response.json()

    async def create_topic(self, topic: str, partitions: int) -> None:
        body = {
            "name": topic,
            "partitions": partitions,
            "replication_factor": self.endpoint.replicas,
        }
        await self._call("POST", "/v1/topics", json=body)

    async def delete_topic(self, topic: str, partitions: int) -> None:
        await self._call("DELETE", f"/v1/topics/{topic}")

    async def publish(self, topic: str, partition: int, payloads: list[bytes], acks: str) -> None:
        messages = [
            {"partition": partition, "value_b64": base64.b64encode(p).decode()} for p in payloads
        ]
        await self._call(
            "POST", f"/v1/topics/{topic}/messages", json={"acks": acks, "messages": messages}
        )

    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        offset: int | str = "earliest"
        path = f"/v1/topics/{topic}/partitions/{partition}/messages"
        while not stop.is_set():
            params = {
                "offset": str(offset),
                "max_messages": str(FETCH_MAX_MESSAGES),
                "max_bytes": str(FETCH_MAX_BYTES),
                "wait_ms": str(FETCH_WAIT_MS),
            }
            answer = await self._call("GET", path, params=params)
            messages = answer["messages"]
            if messages:
                on_delivery([_value(m) for m in messages])
            offset = answer["next_offset"]

    async def close(self) -> None:
        await self.session.close()


def _value(message: dict[str, Any]) -> bytes:
    if "value_b64" in message:
        return base64.b64decode(message["value_b64"])
    return message["value"].encode()
