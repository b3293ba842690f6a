"""What a bucket can restore: its topics and, per partition, where the uploaded log ends.

Owns reading the topic objects and partition manifests of a bucket (tiered/FORMAT.md §2-3) into
restore plans: one per topic name (its current incarnation), with each partition's remote log
start and next offset. The node turns a plan into a topic (node/restore.py). The one write: a
manifest that lost segments the bucket still holds is repaired first (`repair_manifest`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from raftline.tiered import layout
from raftline.tiered.manifest import FORMAT_VERSION, ManifestState
from raftline.tiered.store import ObjectNotFound, ObjectStore

TOPICS_PREFIX = "topics/"


class RestoreError(ValueError):
    """The bucket holds something a restore cannot use (an unknown format, a broken object)."""


@dataclass(frozen=True, slots=True)
class PartitionBackup:
    """One partition as its manifest has it: records [start_offset, next_offset) are in the
    bucket. No manifest yet (nothing uploaded): both 0."""

    start_offset: int = 0
    next_offset: int = 0
    segments: int = 0
    size_bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "start_offset": self.start_offset,
            "next_offset": self.next_offset,
            "segments": self.segments,
            "size_bytes": self.size_bytes,
        }


@dataclass(frozen=True, slots=True)
class TopicBackup:
    name: str
    topic_id: int
    replication_factor: int
    config: dict[str, str]
    created_ms: int
    partitions: tuple[PartitionBackup, ...]

    @property
    def next_offsets(self) -> list[int]:
        return [p.next_offset for p in self.partitions]


def _json(data: bytes, key: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise RestoreError(f"{key} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise RestoreError(f"{key} is not a JSON object")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise RestoreError(f"{key}: format_version {version!r}, this node reads {FORMAT_VERSION}")
    return document


def partition_backup(document: dict[str, Any], key: str) -> PartitionBackup:
    """What a manifest (tiered/FORMAT.md §3) says the bucket holds of its partition."""
    try:
        segments = document["segments"]
        start, next_offset = int(document["start_offset"]), int(document["next_offset"])
        size = sum(int(s["size_bytes"]) for s in segments)
    except (KeyError, TypeError, ValueError) as exc:
        raise RestoreError(f"{key} is not a manifest: {exc!r}") from None
    if not 0 <= start <= next_offset:
        raise RestoreError(f"{key}: start_offset {start} above next_offset {next_offset}")
    return PartitionBackup(start, next_offset, len(segments), size)


async def read_manifest(store: ObjectStore, key: str) -> dict[str, Any] | None:
    """The manifest document at `key`, None when the partition has uploaded nothing."""
    try:
        return _json(await store.get(key), key)
    except ObjectNotFound:
        return None


async def repair_manifest(
    store: ObjectStore, topic: str, topic_id: int, partition: int, document: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The manifest, extended by the segment objects that follow it in the bucket, rewritten
    when it grew. Such objects are committed data whose manifest was lost: an upload recorded
    in the partition's Raft log whose manifest PUT was later overwritten by an older one (a
    request the store executed after its client gave up on it). A restore that started the log
    at the manifest's end would lose them, and a new write would reuse their names."""
    state = ManifestState() if document is None else ManifestState.from_document(document)
    prefix = layout.partition_path(topic, topic_id, partition) + "/"
    names = {info.key for info in await store.list(prefix)}

    def stem(first: int, last: int) -> str:
        return layout.segment_stem(topic, topic_id, partition, first, last)

    grown = False
    while True:
        following = sorted(
            k for k in names if k.endswith(".log") and _base_of(k) == state.next_offset
        )
        if not following:
            break
        key = following[0]
        txn_key = key.removesuffix(".log") + ".txnindex"
        aborted = []
        if txn_key in names:
            aborted = layout.read_txn_index(await store.get(txn_key))
        try:
            meta = layout.build_segment(stem, await store.get(key), 0, aborted).meta
        except ValueError as exc:
            raise RestoreError(f"{key} is not a segment object: {exc}") from None
        if meta.object != key or not {meta.index, meta.time_index} <= names:
            break  # not what its name says, or its upload did not finish: not history
        # Uploads happen only below the commit index; its exact value then is not recorded.
        segment = replace(meta, committed_offset=meta.last_offset + 1)
        effect = state.apply(state.applied_index + 1, {"op": "add", "segment": segment.to_json()})
        if not effect.accepted:
            break
        grown = True
    if not grown:
        return document
    repaired = state.document(topic, topic_id, partition)
    key = layout.manifest_key(topic, topic_id, partition)
    body = json.dumps(repaired).encode()
    # Compare-and-swap, as the brokers write manifests: a manifest that changed meanwhile (a
    # cluster still writing to this bucket) is never replaced.
    try:
        current, etag = await store.get_versioned(key)
    except ObjectNotFound:
        current, etag = None, None
    unchanged = (current is None and document is None) or (
        current is not None
        and document is not None
        and json.loads(current).get("revision") == document.get("revision")
    )
    if unchanged:
        written = (
            await store.put_if_absent(key, body)
            if etag is None
            else await store.put_if_match(key, body, etag)
        )
        if written:
            return repaired
    raise RestoreError(f"{key} changed while the restore read it: is a cluster writing to it?")


def _base_of(key: str) -> int:
    try:
        return int(key.rsplit("/", 1)[-1].split("-")[0])
    except ValueError:
        return -1


async def topic_backups(store: ObjectStore, names: list[str] | None = None) -> list[TopicBackup]:
    """Every topic of the bucket (or those in `names`), by name; of several incarnations of a
    name, the latest created (FORMAT.md §2). A name asked for but absent raises RestoreError."""
    latest: dict[str, dict[str, Any]] = {}
    for info in await store.list(TOPICS_PREFIX):
        if not info.key.endswith("/topic.json"):
            continue
        document = _json(await store.get(info.key), info.key)
        name = str(document.get("topic"))
        if names is not None and name not in names:
            continue
        rank = (int(document.get("created_ms", 0)), int(document.get("topic_id", 0)))
        held = latest.get(name)
        if held is None or rank > (int(held.get("created_ms", 0)), int(held["topic_id"])):
            latest[name] = document
    missing = sorted(set(names or ()) - set(latest))
    if missing:
        raise RestoreError(f"no topic object in the bucket for {', '.join(missing)}")
    return [await _backup(store, latest[name]) for name in sorted(latest)]


async def _backup(store: ObjectStore, document: dict[str, Any]) -> TopicBackup:
    try:
        name = str(document["topic"])
        topic_id, factor = int(document["topic_id"]), int(document["replication_factor"])
        config = {str(k): str(v) for k, v in document["config"].items()}
        manifests = [str(key) for key in document["manifests"]]
        created_ms = int(document.get("created_ms", 0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        topic = document.get("topic")
        raise RestoreError(f"topic object of {topic!r} is broken: {exc!r}") from None
    if not manifests or len(manifests) != int(document.get("partitions", len(manifests))):
        raise RestoreError(f"topic {name!r}: partitions and manifests disagree")
    partitions = []
    for partition, key in enumerate(manifests):
        manifest = await read_manifest(store, key)
        manifest = await repair_manifest(store, name, topic_id, partition, manifest)
        backup = PartitionBackup() if manifest is None else partition_backup(manifest, key)
        partitions.append(backup)
    return TopicBackup(name, topic_id, factor, config, created_ms, tuple(partitions))
