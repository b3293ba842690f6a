"""Log upkeep on one node: retention trims, compaction of compacted topics, producer clocks.

Owns the periodic passes over the node's partition replicas and the cleaners of its compacted
ones; the broker tells it which replicas come and go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeVar

from raftline.raftlog.cleaner import Cleaner, CleanerConfig
from raftline.raftlog.log import PartitionLog

if TYPE_CHECKING:
    from raftline.node.broker import Broker

T = TypeVar("T")

log = logging.getLogger(__name__)

PASS_SLICE = 256  # partitions a periodic pass over all of them handles between loop turns


def cleaner_config(topic_config: dict[str, str]) -> CleanerConfig:
    defaults = CleanerConfig()
    return CleanerConfig(
        int(topic_config.get("delete.retention.ms", defaults.delete_retention_ms)),
        float(topic_config.get("min.cleanable.dirty.ratio", defaults.min_cleanable_dirty_ratio)),
        int(topic_config.get("min.compaction.lag.ms", defaults.min_compaction_lag_ms)),
    )


async def in_slices(items: list[T], size: int = PASS_SLICE) -> AsyncIterator[T]:
    """The items, letting the loop run (read the sockets, fire timers) after every `size` of
    them: a retention pass over 60,000 replicas in one go held the loop for about a second,
    past the peers' dead-after window."""
    for i, item in enumerate(items):
        if i and i % size == 0:
            await asyncio.sleep(0)
        yield item


class LogUpkeep:
    """Every `retention_check_s`: producer clock entries, retention trims, then cleaning."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.cleaners: dict[str, Cleaner] = {}  # compacted partitions' log cleaners

    def attach(self, group: str, partition_log: PartitionLog, topic_config: dict[str, str]) -> None:
        """A replica started here: clean it when its topic is compacted."""
        if "compact" in topic_config.get("cleanup.policy", "delete"):
            self.cleaners[group] = Cleaner(partition_log, cleaner_config(topic_config))

    def detach(self, group: str) -> None:
        self.cleaners.pop(group, None)

    def keep_producer_clocks(self) -> None:
        """Led partitions with producer state get a clock entry when one is due."""
        now = self.broker.clock.now_ms()
        for replica in self.broker.partitions.values():
            replica.keep_clock(now)

    async def run_retention(self) -> None:
        while True:
            await asyncio.sleep(self.broker.config.retention_check_s)
            self.keep_producer_clocks()
            await self.trim_once()

    async def trim_once(self) -> None:
        """Trim every local log to its retention point, keeping what the bucket lacks and
        what a restart needs to rebuild producer state."""
        broker = self.broker
        runtime = broker.runtime
        # The log is thread-safe: reading its retention point beside a round's write is fine.
        async for group in in_slices(list(broker.partitions)):
            raft_group = runtime.groups.get(group)
            if raft_group is None:
                continue
            storage = raft_group.storage
            point = storage.retention_point()
            if broker.tiering is not None:  # local disk keeps what the bucket lacks
                point = broker.tiering.trim_point(group, point)
            if point < storage.first_index():
                continue
            replica = broker.partitions.get(group)
            producers = None if replica is None else replica.producers
            if producers is not None and producers.durable_offset <= point:
                # a restart must find producer state that needs no trimmed entry
                try:
                    await producers.persist(runtime.run_on_disk)
                except OSError as exc:
                    log.warning("no producer snapshot for %s: %s", group, exc)
                    continue
            runtime.trim(group, point)

    async def run_cleaning(self) -> None:
        """Compact the local replicas of compacted topics, one partition at a time on the disk
        pool, below each group's commit index (see raftlog/cleaner.py)."""
        while True:
            await asyncio.sleep(self.broker.config.retention_check_s)
            await self.clean_once()

    async def clean_once(self) -> None:
        runtime = self.broker.runtime
        counters = self.broker.counters
        for group, cleaner in list(self.cleaners.items()):
            raft_group = runtime.groups.get(group)
            if raft_group is None:
                continue
            upto = raft_group.storage.hard_state.commit + 1
            try:
                stats = await runtime.run_on_disk(cleaner.clean, upto)
            except Exception:  # e.g. retention deleted the segment being read
                log.exception("cleaning %s failed", group)
                continue
            counters["cleaner_bytes_cleaned"] += stats.bytes_read
            counters["cleaner_bytes_freed"] += stats.bytes_freed
            counters["cleaner_records_removed"] += stats.records_removed
