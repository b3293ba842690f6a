"""Restoring topics from object storage after every node lost its disk (`raftline restore`).

Owns turning the bucket's topics into topics of this cluster (same name, id, settings and
partition count, each partition restored at the end of what its manifest holds) and preparing a
fresh replica of a restored partition: its Raft log starts at the restore point, trimmed there as
if everything below had been uploaded and dropped locally, and its manifest state is the
bucket's. Reads below the restore point then go to the bucket (node/tiering.py) and new writes
continue after the last uploaded offset. What was never uploaded is lost: the restore's RPO.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from raftline.node.errors import BrokerError
from raftline.raftlog.types import SnapshotMeta
from raftline.tiered import layout
from raftline.tiered.restore import RestoreError, TopicBackup, read_manifest, topic_backups
from raftline.tiered.store import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

MANIFEST_READ_ATTEMPTS = 10  # a replica retries its manifest read this often (store retries too)
MANIFEST_RETRY_S = 2.0


async def restore_topics(broker: Any, names: list[str] | None) -> list[dict[str, Any]]:
    """Create every topic of the bucket (or those named) that this cluster does not have."""
    tiering = broker.tiering
    if tiering is None:
        raise BrokerError(
            "invalid_request",
            "restore reads object storage: start the node with --s3-endpoint and --s3-bucket",
        )
    try:
        backups = await topic_backups(tiering.store, names)
    except RestoreError as exc:
        raise BrokerError("invalid_request", str(exc)) from None
    except ObjectStoreError as exc:
        raise BrokerError("leader_unavailable", f"object storage unavailable: {exc}") from None
    existing = {t["name"] for t in await broker.list_topics()}
    nodes = len((await broker.cluster()).get("nodes") or [None])
    results = []
    for backup in backups:
        result = _describe(backup)
        if backup.name in existing:
            results.append({**result, "restored": False, "reason": "topic_exists"})
            continue
        factor = min(backup.replication_factor, nodes)
        restore = {"topic_id": backup.topic_id, "next_offsets": backup.next_offsets}
        await broker.create_topic(
            backup.name, len(backup.partitions), factor, backup.config, restore=restore
        )
        results.append({**result, "replication_factor": factor, "restored": True})
    return results


def _describe(backup: TopicBackup) -> dict[str, Any]:
    return {
        "name": backup.name,
        "topic_id": backup.topic_id,
        "replication_factor": backup.replication_factor,
        "partitions": [{"partition": i, **p.to_json()} for i, p in enumerate(backup.partitions)],
    }


async def prepare_replica(
    store: ObjectStore, runtime: Any, topic: Any, partition: int, storage: Any
) -> dict[str, Any] | None:
    """For a fresh replica of a restored partition: move its log start to the restore point and
    return the bucket's manifest (None: nothing to restore, the log starts at 0). Every replica
    of the partition installs the same trim point (from the metadata), so Raft's logs agree."""
    point = topic.restored_at[partition]
    if point == 0 or storage.last_index() >= 0 or storage.first_index() != 0:
        return None
    key = layout.manifest_key(topic.name, topic.topic_id, partition)
    document = None
    for attempt in range(1, MANIFEST_READ_ATTEMPTS + 1):
        try:
            document = await read_manifest(store, key)
            break
        except ObjectStoreError as exc:
            if attempt == MANIFEST_READ_ATTEMPTS:
                raise
            log.warning("%s: reading %s failed, retrying: %s", topic.name, key, exc)
            await asyncio.sleep(MANIFEST_RETRY_S)
    if document is None:
        log.error("%s/%d: the bucket lost its manifest %s", topic.name, partition, key)
    # Term 0: the new cluster's terms start over, and the trim point only has to be the same
    # entry on every replica.
    meta = SnapshotMeta(point - 1, 0, tuple(sorted(topic.replicas[partition])), ())
    await runtime.run_on_disk(_install, storage, meta)
    return document


def _install(storage: Any, meta: SnapshotMeta) -> None:
    storage.install(meta)
    storage.save(replace(storage.hard_state, commit=meta.index))
