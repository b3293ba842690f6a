"""Tiered storage on a node: each partition's manifest replica, its leader's uploads, remote reads.

Owns applying TIERED entries of a partition's log to its ManifestState (and the state's local
snapshot file), the leader's upload loop (sealed segments below the commit index and the last
stable offset: objects first, then the add entries, then the manifest, then the durable mark),
remote retention and garbage collection, the bound on local trimming, remote fetches through
the node's chunk cache, and the upload metrics. The broker calls it; it never calls the API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftline.node.errors import BrokerError
from raftline.raftlog.log import write_atomically
from raftline.raftlog.records import TIERED, build_control_batch, control_type_of, decode_batch
from raftline.raftlog.types import Entry, EntryKind
from raftline.tiered import layout
from raftline.tiered.manifest import Effect, ManifestState, decode_command, encode_command
from raftline.tiered.reader import DEFAULT_CACHE_BYTES, ChunkCache, RemoteRead, read_segment
from raftline.tiered.store import ObjectNotFound, ObjectStore, ObjectStoreError, S3Config

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "tiered-manifest.json"
UPLOAD_POLL_S = 0.5  # a leader with nothing to upload looks again after this
MAX_OBJECT_BYTES = 64 << 20  # a longer sealed segment is uploaded as several objects
MAX_ADDS_PER_MANIFEST = 16  # segments recorded before the manifest is rewritten
UPLOAD_CONCURRENCY = 4  # object PUTs in flight per node
BACKOFF_MAX_S = 30.0
VERIFY_MANIFEST_S = 30.0  # the leader re-reads the bucket's manifest this often


class NodeTiering:
    """The node's object store, chunk cache and upload slots, and its tiered partitions."""

    def __init__(
        self,
        config: S3Config,
        runtime: Any,
        cluster_id: Callable[[], str | None],
        now_ms: Callable[[], int],
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.store = ObjectStore(config)
        self.cache = ChunkCache(self.store, cache_bytes)
        self.runtime = runtime
        self.cluster_id = cluster_id
        self.now_ms = now_ms
        self.upload_slots = asyncio.Semaphore(UPLOAD_CONCURRENCY)
        self.partitions: dict[str, PartitionTiering] = {}
        self.uploaded_bytes = 0
        self.uploaded_segments = 0
        self.upload_errors = 0
        self.remote_reads = 0
        self.remote_read_bytes = 0

    def attach(
        self, group: str, topic: Any, partition: int, storage: Any, replica: Any
    ) -> PartitionTiering:
        tiering = PartitionTiering(self, group, topic, partition, storage, replica)
        self.partitions[group] = tiering
        replica.remote = tiering
        return tiering

    def detach(self, group: str) -> None:
        tiering = self.partitions.pop(group, None)
        if tiering is not None:
            tiering.stop()

    def trim_point(self, group: str, point: int) -> int:
        """The last offset local retention may drop: never past what a durable manifest holds."""
        tiering = self.partitions.get(group)
        return point if tiering is None else min(point, tiering.state.durable_next - 1)

    def close(self) -> None:
        for tiering in self.partitions.values():
            tiering.stop()
        self.cache.close()

    def metrics(self) -> dict[str, int | float]:
        lag_bytes = lag_segments = 0
        last_upload = 0.0
        for tiering in self.partitions.values():
            pending = tiering.pending_upload()
            lag_bytes += pending[0]
            lag_segments += pending[1]
            last_upload = max(last_upload, tiering.last_upload_s)
        return {
            "raftline_tiered_uploaded_bytes_total": self.uploaded_bytes,
            "raftline_tiered_uploaded_segments_total": self.uploaded_segments,
            "raftline_tiered_upload_errors_total": self.upload_errors,
            "raftline_tiered_upload_lag_bytes": lag_bytes,
            "raftline_tiered_upload_lag_segments": lag_segments,
            "raftline_tiered_last_upload_timestamp_seconds": round(last_upload, 3),
            "raftline_tiered_remote_reads_total": self.remote_reads,
            "raftline_tiered_remote_read_bytes_total": self.remote_read_bytes,
            "raftline_tiered_cache_bytes": self.cache.held_bytes,
            "raftline_tiered_cache_hits_total": self.cache.hits,
            "raftline_tiered_cache_misses_total": self.cache.misses,
            "raftline_tiered_store_retries_total": self.store.retries,
        }


class PartitionTiering:
    """Tiered storage of one local partition replica (leader or follower)."""

    def __init__(
        self, node: NodeTiering, group: str, topic: Any, partition: int, storage: Any, replica: Any
    ) -> None:
        self.node = node
        self.group = group
        self.topic = topic  # metadata.TopicInfo
        self.partition = partition
        self.storage = storage  # raftlog.storage.RaftStorage
        self.replica = replica  # node.partition.PartitionReplica
        self.path = Path(storage.log.directory) / SNAPSHOT_FILE
        self.state = _load_snapshot(self.path)
        self._effects: dict[int, Effect] = {}  # leader: effects of its own proposals
        self._task: asyncio.Task[None] | None = None
        self._topic_written = False
        self._last_verify = 0.0
        self.last_upload_s = 0.0
        self.last_error: str | None = None

    @property
    def replay_from(self) -> int:
        """The first committed index the replica must replay for this state to be current."""
        return self.state.applied_index + 1

    # ---- applied state (every replica) ------------------------------------------------

    def apply_entry(self, entry: Entry) -> None:
        """A committed CONTROL entry of the partition: apply it when it is a TIERED one."""
        try:
            decoded = decode_batch(entry.data)
            if control_type_of(decoded.records) != TIERED:
                return
            command = decode_command(decoded.records[0].value or b"")
        except ValueError as exc:
            log.error("%s: unreadable tiered entry at %d: %s", self.group, entry.index, exc)
            return
        effect = self.state.apply(entry.index, command)
        if effect.reason != "replayed":
            self._effects[entry.index] = effect
            if len(self._effects) > 1024:
                self._effects.pop(next(iter(self._effects)))
            write_atomically(self.path, json.dumps(self.state.snapshot()).encode())

    def start_offset(self, local_start: int) -> int:
        """The partition's log start: the bucket's when it joins the local log."""
        state = self.state
        if state.segments and state.start_offset < local_start <= state.next_offset:
            return state.start_offset
        return local_start

    def pending_upload(self) -> tuple[int, int]:
        """(bytes, segments) of the local log not yet in the bucket (sealed or not)."""
        log_ = self.storage.log
        pending_bytes = pending_segments = 0
        next_offset = self.state.next_offset
        for segment in [*log_.sealed_segments()]:
            if segment.next_offset > next_offset:
                pending_bytes += segment.size
                pending_segments += 1
        return pending_bytes, pending_segments

    # ---- remote reads (the leader serves them) ----------------------------------------

    async def read(self, offset: int, max_bytes: int, upto: int) -> RemoteRead | None:
        """Batches below the local log start, from the bucket; None if it has none there."""
        segment = self.state.segment_for(offset)
        if segment is None:
            return None
        try:
            answer = await read_segment(self.node.cache, segment, offset, max_bytes, upto)
        except ObjectStoreError as exc:
            raise BrokerError(
                "leader_unavailable", f"object storage read failed, retry later: {exc}"
            ) from exc
        self.node.remote_reads += 1
        self.node.remote_read_bytes += len(answer.data)
        return answer

    # ---- the leader's loop ------------------------------------------------------------

    def on_role(self, role: str) -> None:
        if role == "leader" and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._lead())
        elif role != "leader":
            self.stop()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _lead(self) -> None:
        backoff = UPLOAD_POLL_S
        while True:
            try:
                await self.replica.until_settled()
                busy = await self.upload_round()
                backoff = UPLOAD_POLL_S
                if not busy:
                    await asyncio.sleep(UPLOAD_POLL_S)
            except asyncio.CancelledError:
                raise
            except ObjectStoreError as exc:
                self.node.upload_errors += 1
                self.last_error = str(exc)
                log.warning(
                    "%s: tiered upload failed, retrying in %.1fs: %s", self.group, backoff, exc
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except BrokerError as exc:  # not the leader any more, or Raft did not commit
                log.info("%s: tiered round stopped: %s", self.group, exc.message)
                if self.replica.role != "leader":
                    return
                await asyncio.sleep(backoff)
            except Exception:
                self.node.upload_errors += 1
                log.exception("%s: tiered round failed", self.group)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def upload_round(self) -> bool:
        """One round of the leader's work; True when it did something (look again at once)."""
        await self._catch_up_from_bucket()
        await self._write_topic_object()
        added = 0
        while added < MAX_ADDS_PER_MANIFEST and await self._upload_next():
            added += 1
        truncated = await self._apply_remote_retention()
        wrote = await self._publish_manifest()
        collected = await self._collect_garbage()
        await self._verify_manifest()
        return bool(added or truncated or wrote or collected)

    async def _catch_up_from_bucket(self) -> None:
        """A replica that missed commands (its log was trimmed past them while it lagged, and
        it installed the leader's trim point) takes the bucket's durable manifest as its start;
        the commands after it are still in its log and apply on top (adds are idempotent)."""
        state = self.state
        first = self.storage.first_index()
        if state.applied_index + 1 >= first or state.segments:
            return
        try:
            document = json.loads(await self.node.store.get(self._manifest_key()))
        except ObjectNotFound:
            return
        restored = ManifestState.from_document(document)
        restored.applied_index = state.applied_index
        self.state = restored
        write_atomically(self.path, json.dumps(restored.snapshot()).encode())

    async def _write_topic_object(self) -> None:
        if self._topic_written:
            return
        topic = self.topic
        document = layout.topic_document(
            self.node.cluster_id(),
            topic.name,
            topic.topic_id,
            len(topic.replicas),
            topic.replication_factor,
            topic.config,
            self.node.now_ms(),
        )
        key = layout.topic_key(topic.name, topic.topic_id)
        await self.node.store.put_if_absent(key, _json(document))
        self._topic_written = True

    def _next_range(self) -> tuple[int, int] | None:
        """(first offset, end) of the next run to upload: inside one sealed segment, below the
        commit index and the last stable offset (every transaction in it is decided)."""
        replica = self.replica
        limit = replica.high_watermark
        if replica.producers is not None:
            limit = replica.producers.state.last_stable_offset(limit)
        start = self.state.next_offset
        log_ = self.storage.log
        if start < log_.log_start_offset:
            if self.state.segments:
                raise BrokerError(
                    "internal_error",
                    f"offsets {start}..{log_.log_start_offset - 1} left the local log "
                    "before they were uploaded",
                )
            start = log_.log_start_offset  # the first upload starts at the local log start
        for segment in log_.sealed_segments():
            if segment.next_offset <= start:
                continue
            if segment.next_offset > limit:
                return None
            return max(start, segment.base_offset), segment.next_offset
        return None

    async def _upload_next(self) -> bool:
        found = self._next_range()
        if found is None:
            return False
        start, end = found
        data = await self.node.runtime.run_on_disk(self._read_run, start, end)
        if not data:
            return False
        producers = self.replica.producers
        aborted = []
        if producers is not None:
            aborted = layout.aborted_ranges(producers.state.aborted_in(start, end))
        objects = await self.node.runtime.run_on_disk(self._build, data, aborted)
        meta = objects.meta
        puts = [(meta.object, objects.log), (meta.index, objects.index)]
        puts.append((meta.time_index, objects.time_index))
        if objects.txn_index is not None and meta.txn_index is not None:
            puts.append((meta.txn_index, objects.txn_index))
        # Objects first: the add entry (and later the manifest) names only durable objects.
        await asyncio.gather(*(self._put(key, body) for key, body in puts))
        effect = await self._propose({"op": "add", "segment": meta.to_json()})
        if not effect.accepted and effect.reason != "already recorded":
            raise BrokerError("internal_error", f"upload of {meta.object} refused: {effect.reason}")
        self.node.uploaded_bytes += meta.size_bytes
        self.node.uploaded_segments += 1
        self.last_upload_s = time.time()
        return True

    def _read_run(self, start: int, end: int) -> bytes:
        data: bytes = self.storage.log.read(start, MAX_OBJECT_BYTES, upto=end)
        return data

    def _build(self, data: bytes, aborted: list[layout.AbortedRange]) -> layout.SegmentObjects:
        topic = self.topic

        def stem(base: int, last: int) -> str:
            return layout.segment_stem(topic.name, topic.topic_id, self.partition, base, last)

        return layout.build_segment(stem, data, self.replica.high_watermark, aborted)

    async def _put(self, key: str, body: Any) -> None:
        async with self.node.upload_slots:
            await self.node.store.put_if_absent(key, body)

    def _retention_start(self) -> int:
        """The remote log start retention.* asks for (the whole log: bucket and local disk)."""
        state, config = self.state, self.topic.config
        start = state.start_offset
        retention_ms = int(config.get("retention.ms", 7 * 24 * 3600 * 1000))
        retention_bytes = int(config.get("retention.bytes", -1))
        now = self.node.now_ms()
        log_ = self.storage.log
        uploaded_locally = sum(
            s.size for s in log_.sealed_segments() if s.next_offset <= state.next_offset
        )
        total = state.uploaded_bytes + log_.size_bytes - uploaded_locally
        for segment in state.segments:
            expired = retention_ms >= 0 and segment.max_timestamp < now - retention_ms
            oversize = retention_bytes >= 0 and total - segment.size_bytes >= retention_bytes
            if not (expired or oversize):
                break
            total -= segment.size_bytes
            start = segment.last_offset + 1
        return start

    async def _apply_remote_retention(self) -> bool:
        start = self._retention_start()
        if start <= self.state.start_offset:
            return False
        effect = await self._propose({"op": "truncate", "start_offset": start})
        return effect.accepted

    async def _publish_manifest(self) -> bool:
        """Manifest last: written once the adds it lists are applied, then marked durable."""
        state = self.state
        if state.revision <= state.durable_revision:
            return False
        revision, next_offset = state.revision, state.next_offset
        document = state.document(self.topic.name, self.topic.topic_id, self.partition)
        await self.node.store.put(self._manifest_key(), _json(document))
        await self._propose({"op": "durable", "revision": revision, "next_offset": next_offset})
        return True

    async def _collect_garbage(self) -> bool:
        keys = self.state.collectable()
        if not keys:
            return False
        await self.node.store.delete(keys)
        await self._propose({"op": "collected", "keys": keys})
        return True

    async def _verify_manifest(self) -> None:
        """A deposed leader's late manifest PUT could land over a newer one: the leader reads
        the bucket's manifest now and then, and rewrites it when it is behind."""
        now = time.monotonic()
        if now - self._last_verify < VERIFY_MANIFEST_S or self.state.durable_revision == 0:
            return
        self._last_verify = now
        try:
            document = json.loads(await self.node.store.get(self._manifest_key()))
            behind = int(document.get("revision", -1)) < self.state.durable_revision
        except ObjectNotFound:
            behind = True
        if behind:
            log.warning("%s: the bucket's manifest is behind; rewriting it", self.group)
            state = self.state
            document = state.document(self.topic.name, self.topic.topic_id, self.partition)
            await self.node.store.put(self._manifest_key(), _json(document))

    def _manifest_key(self) -> str:
        return layout.manifest_key(self.topic.name, self.topic.topic_id, self.partition)

    async def _propose(self, command: dict[str, Any]) -> Effect:
        """Append a TIERED entry through Raft and return its effect once applied here."""
        batch = build_control_batch(TIERED, encode_command(command))
        replica = self.replica
        try:
            index, _ = await replica.runtime.propose(self.group, batch, 1, kind=EntryKind.CONTROL)
        except Exception as exc:
            raise BrokerError("leader_unavailable", f"proposal failed: {exc}") from exc
        deadline = time.monotonic() + replica.timeout_s
        while replica.high_watermark <= index:  # committed entries are applied first
            if time.monotonic() > deadline:
                raise BrokerError("timeout", "the tiered entry did not commit in time")
            if replica.role != "leader":
                raise BrokerError("leader_unavailable", "leadership moved")
            await asyncio.sleep(0.01)
        effect = self._effects.pop(index, None)
        if effect is None:
            raise BrokerError("leader_unavailable", "the tiered entry was overwritten")
        return effect


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, indent=1, sort_keys=True).encode()


def _load_snapshot(path: Path) -> ManifestState:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ManifestState()
    return ManifestState.restore(json.loads(data))


def s3_config_of(node_config: Any) -> S3Config | None:
    """The node's S3 settings (flags --s3-*), None when tiered storage is not configured."""
    if not node_config.s3_endpoint or not node_config.s3_bucket:
        return None
    return S3Config.from_env(
        node_config.s3_endpoint,
        node_config.s3_bucket,
        region=node_config.s3_region,
        prefix=node_config.s3_prefix,
    )
