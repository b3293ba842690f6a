"""What the client knows of the cluster, and where a message goes.

Owns topic metadata (partition counts, leaders, node addresses, their expiry and the leader
addresses found unreachable) and the partitioner (explicit > key hash > sticky). No I/O here.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

from raftline.api.partitioner import partition_for_key

METADATA_TTL_S = 30.0


class Metadata:
    """Partition counts and leaders of topics, and the HTTP address of every node."""

    def __init__(self) -> None:
        self.partitions: dict[str, int] = {}
        self.leaders: dict[tuple[str, int], int | None] = {}
        self.nodes: dict[int, str] = {}
        self.expires: dict[str, float] = {}
        # Leader URLs this client could not connect to (a node may advertise an address only
        # its peers reach, as in docker-compose): skipped until the next update.
        self.unreachable: set[str] = set()

    def fresh(self, topic: str) -> bool:
        return self.expires.get(topic, 0.0) > time.monotonic()

    def update(self, description: dict[str, Any], cluster: dict[str, Any]) -> None:
        topic = description["name"]
        self.partitions[topic] = len(description["partitions"])
        for part in description["partitions"]:
            self.leaders[(topic, int(part["partition"]))] = part.get("leader")
        self.nodes = {
            int(n["id"]): str(n["http"]) for n in cluster.get("nodes", []) if n.get("http")
        }
        self.expires[topic] = time.monotonic() + METADATA_TTL_S
        self.unreachable.clear()

    def invalidate(self, topic: str) -> None:
        self.expires.pop(topic, None)

    def leader_moved(self, topic: str, partition: int, leader: int) -> None:
        """A node answered for `leader`: the partition's leader now, as far as it knows."""
        if leader in self.nodes and (topic, partition) in self.leaders:
            self.leaders[(topic, partition)] = leader

    def leader_url(self, topic: str, partition: int) -> str | None:
        leader = self.leaders.get((topic, partition))
        address = self.nodes.get(leader) if leader is not None else None
        url = f"http://{address}" if address else None
        return None if url in self.unreachable else url


class Partitioner:
    """Explicit partition > murmur2 of the key > one sticky partition until its batch is sent."""

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}
        self._counter = itertools.count(random.randrange(1 << 16))

    def choose(
        self, topic: str, partitions: int, key: bytes | str | None, partition: int | None
    ) -> int:
        if partition is not None:
            return partition
        if key is not None:
            raw = key.encode("utf-8") if isinstance(key, str) else key
            return partition_for_key(raw, partitions)
        if topic not in self._sticky:
            self._sticky[topic] = next(self._counter) % partitions
        return self._sticky[topic]

    def batch_sent(self, topic: str) -> None:
        self._sticky.pop(topic, None)
