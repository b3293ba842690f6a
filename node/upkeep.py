"""Log upkeep on one node: retention trims, compaction of compacted topics, producer clocks.

Owns the periodic passes over the node's partition replicas and the cleaners of its compacted
ones; the broker tells it which replicas come and go.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """Every `retention_check_s`: producer clock entries, retention trims, then cleaning; and
    a retention trim of a log as soon as it rolled a segment."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.cleaners: dict[str, Cleaner] = {}  # compacted partitions' log cleaners
        self._rolled: set[str] = set()  # groups whose log rolled since their last trim
        self._roll_seen = asyncio.Event()

    def attach(self, group: str, partition_log: PartitionLog, topic_config: dict[str, str]) -> None:
        """A replica started here: trim it when it rolls; clean it when its topic is compacted."""
        loop = asyncio.get_running_loop()

        def rolled() -> None:  # on the log's appending thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the node is stopping
                loop.call_soon_threadsafe(self._note_roll, group)

        partition_log.on_roll = rolled
        if "compact" in topic_config.get("cleanup.policy", "delete"):
            self.cleaners[group] = Cleaner(partition_log, cleaner_config(topic_config))

    def detach(self, group: str) -> None:
        self.cleaners.pop(group, None)
        self._rolled.discard(group)

    def _note_roll(self, group: str) -> None:
        self._rolled.add(group)
        self._roll_seen.set()

    def keep_producer_clocks(self) -> None:
        """Led partitions with producer state get a clock entry when one is due."""
        now = self.broker.clock.now_ms()
        for replica in self.broker.partitions.values():
            replica.keep_clock(now)

    async def run_retention(self) -> None:
        """A pass over every log each `retention_check_s`, and between passes the logs that
        rolled. Trimmed only by the pass, a log filling at ~800 MB/s piled up 20+ GB past its
        retention and then unlinked it in one ~4 s burst (with discards: the disk is mounted
        with `discard`), in which appends slowed; at each roll it goes a segment at a time."""
        loop = asyncio.get_running_loop()
        period = self.broker.config.retention_check_s
        next_pass = loop.time() + period
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._roll_seen.wait(), max(0.0, next_pass - loop.time()))
            self._roll_seen.clear()
            groups, self._rolled = self._rolled, set()
            if loop.time() >= next_pass:
                next_pass = loop.time() + period
                self.keep_producer_clocks()
                await self.trim_once()
            else:
                await self.trim_once(sorted(groups))

    async def trim_once(self, groups: list[str] | None = None) -> None:
        """Trim the local logs of `groups` (None: every one) to their retention point,
        keeping what the bucket lacks and what a restart needs to rebuild producer state."""
        broker = self.broker
        runtime = broker.runtime
        # The log is thread-safe: reading its retention point beside a round's write is fine.
        async for group in in_slices(list(broker.partitions) if groups is None else groups):
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
