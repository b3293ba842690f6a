"""The interface every benchmark driver implements, modelled on the OpenMessaging Benchmark's.

Owns the Driver base class and the Endpoint a started peer hands to its driver.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

# Called with the payloads of one delivery, right when they arrive.
OnDelivery = Callable[[list[bytes]], None]
# Called with how many more messages of a batch the system acknowledged, right when it did.
OnAcked = Callable[[int], None]


@dataclass(frozen=True)
class Endpoint:
    """Where a started peer listens: host, ports by protocol, and its replication factor."""

    host: str
    ports: dict[str, int]
    replicas: int = 1
    extra: dict[str, str] = field(default_factory=dict)


class Driver(abc.ABC):
    """A connection to one system that creates partitioned topics, publishes and consumes.

    A topic of P partitions maps to the system's unit of replication and ordering (a JetStream
    stream, a quorum queue, a RabbitMQ stream, a Redis stream key, a Raftline partition).
    """

    system: str = ""
    queues: bool = False  # has create_queue / consume_queue (workload kind "queue-ack")
    # Topics created from now on keep about this many bytes per partition (0: the system's
    # default); sustained runs set it so that minutes at max rate fit on the disk.
    retention_bytes: int = 0
    honours_retention: bool = False  # create_topic applies retention_bytes

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    @property
    @abc.abstractmethod
    def durability(self) -> str:
        """Replication factor and what an acknowledgement means on disk, in one sentence."""

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def create_topic(self, topic: str, partitions: int) -> None: ...

    @abc.abstractmethod
    async def delete_topic(self, topic: str, partitions: int) -> None: ...

    @abc.abstractmethod
    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        """Send one batch to one partition; return once the system acknowledged all of it.

        A system that acknowledges message by message reports each acknowledgement through
        `on_acked` as it comes (as OMB times every message); what a driver did not report
        counts as acknowledged when publish returns.
        """

    @abc.abstractmethod
    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        """Deliver the partition from its start to on_delivery until stop is set."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # Queues (workload kind "queue-ack"): shared consumption with per-message acknowledgement.

    async def create_queue(self, topic: str, partitions: int) -> None:
        """The topic and a queue over all its partitions that `consume_queue` receives from."""
        raise NotImplementedError(f"{self.system} has no queue driver")

    async def delete_queue(self, topic: str, partitions: int) -> None:
        raise NotImplementedError(f"{self.system} has no queue driver")

    async def consume_queue(
        self,
        topic: str,
        partitions: int,
        on_delivery: OnDelivery,
        stop: asyncio.Event,
        on_received: OnDelivery,
        on_ack_sent: OnDelivery,
    ) -> None:
        """One receiver of the topic's queue, sharing it with the others, until stop is set:
        calls on_received with the payloads as soon as it has them, on_ack_sent as it sends
        their acknowledgement, and on_delivery with them once it acknowledged them (as far as
        the system confirms an acknowledgement: see the driver's durability)."""
        raise NotImplementedError(f"{self.system} has no queue driver")

    def max_length_argument(self) -> dict[str, int]:
        """RabbitMQ's queue argument for retention_bytes (streams and quorum queues)."""
        return {"x-max-length-bytes": self.retention_bytes} if self.retention_bytes else {}

    @staticmethod
    def partition_name(topic: str, partition: int) -> str:
        return f"{topic}-{partition}"
