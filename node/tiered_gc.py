"""The sweeps that remove bucket objects no manifest will ever name (tiered/FORMAT.md §8).

Owns when and how a node deletes them: a deleted topic's partition by its leader at the time;
unrecorded uploads (a deposed leader's, or one cut short by a crash) by each partition leader,
listing its folder now and then; deleted topics' leftovers by the controller (the metadata
leader), listing the topic objects now and then: partition folders, then the topic object.
What may go is decided by tiered/garbage.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from raftline.tiered import layout
from raftline.tiered.garbage import deleted_topics, unrecorded
from raftline.tiered.store import ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

SWEEP_PARTITION_S = 600.0  # a leader lists its partition folder this often
SWEEP_TOPICS_S = 60.0  # the controller lists the topic objects this often
MAX_SWEPT_KEYS = 1000  # deletions per partition sweep (one DeleteObjects request)
MAX_SWEPT_TOPICS = 16  # deleted topics removed per controller sweep
DELETE_ATTEMPTS = 12  # a deleted topic's partition: tries (with backoff) before the sweep's turn
DELETE_BACKOFF_S = (0.5, 30.0)  # first and largest pause between tries


async def remove_partition(store: ObjectStore, topic: str, topic_id: int, partition: int) -> None:
    """Every object of one partition of a deleted topic: the manifest first (readers stop
    finding the partition), then the rest of its folder."""
    await store.delete([layout.manifest_key(topic, topic_id, partition)])
    folder = layout.partition_path(topic, topic_id, partition) + "/"
    keys = [info.key for info in await store.list(folder)]
    for at in range(0, len(keys), 1000):
        await store.delete(keys[at : at + 1000])


async def remove_deleted_partition(node: Any, tiering: Any) -> None:
    """A deleted topic's partition, by the replica that led it at the deletion. The topic
    object stays: the controller's sweep removes it once every partition folder is gone (and
    removes the folders of partitions whose leader was down now)."""
    topic, partition = tiering.topic, tiering.partition
    delay, longest = DELETE_BACKOFF_S
    for _ in range(DELETE_ATTEMPTS):
        try:
            await remove_partition(node.store, topic.name, topic.topic_id, partition)
            log.info("%s: deleted topic's objects removed from the bucket", tiering.group)
            return
        except ObjectStoreError as exc:
            log.warning("%s: removing a deleted topic's objects: %s", tiering.group, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)
    log.error("%s: gave up removing the deleted topic's objects (the sweep will)", tiering.group)


async def sweep_partition(tiering: Any) -> int:
    """The leader's sweep of its partition folder, at most every `sweep_partition_s`; returns
    how many unrecorded objects it deleted. Runs in the leader's upload loop, so never while
    this leader has an upload in flight."""
    node = tiering.node
    now = time.monotonic()
    if now - tiering.last_sweep < node.sweep_partition_s:
        return 0
    tiering.last_sweep = now
    topic = tiering.topic
    folder = layout.partition_path(topic.name, topic.topic_id, tiering.partition) + "/"
    listed = [info.key for info in await node.store.list(folder)]
    doomed = unrecorded(tiering.state, listed)[:MAX_SWEPT_KEYS]  # the state after the listing
    if doomed:
        await node.store.delete(doomed)
        node.swept_objects += len(doomed)
        log.info("%s: removed %d unrecorded objects from the bucket", tiering.group, len(doomed))
    return len(doomed)


async def sweep_topics(node: Any) -> int:
    """The controller's sweep of deleted topics' objects; returns how many topics it removed.
    The topic object goes last, so a sweep cut short is finished by the next one."""
    if not node.is_controller():
        return 0
    metadata = node.metadata()
    live = [(t.name, t.topic_id) for t in metadata.topics.values()]
    keys = [info.key for info in await node.store.list("topics/")]
    removed = 0
    for name, topic_id in deleted_topics(keys, live, metadata.next_topic_id)[:MAX_SWEPT_TOPICS]:
        key = layout.topic_key(name, topic_id)
        try:
            document = json.loads(await node.store.get(key))
        except ObjectNotFound:
            continue
        if document.get("cluster_id") != node.cluster_id():  # another cluster's: never ours
            continue
        for partition in range(int(document["partitions"])):
            await remove_partition(node.store, name, topic_id, partition)
        await node.store.delete([key])
        node.swept_topics += 1
        removed += 1
        log.info("removed deleted topic %s (id %d) from the bucket", name, topic_id)
    return removed


async def run_topic_sweeps(node: Any) -> None:
    """The node's loop of controller sweeps (a no-op while it is not the controller)."""
    last = time.monotonic()  # the first sweep one period after start
    while True:
        await asyncio.sleep(min(node.sweep_topics_s, 1.0))
        if time.monotonic() - last < node.sweep_topics_s:
            continue
        last = time.monotonic()
        try:
            await sweep_topics(node)
        except ObjectStoreError as exc:
            log.warning("sweeping deleted topics' objects: %s", exc)
        except Exception:
            log.exception("sweeping deleted topics' objects failed")
