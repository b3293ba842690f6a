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
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from raftline.node.errors import BrokerError
from raftline.node.tiered_gc import (
    SWEEP_PARTITION_S,
    SWEEP_TOPICS_S,
    remove_deleted_partition,
    run_topic_sweeps,
    sweep_partition,
)
from raftline.raftlog.batch import iter_headers
from raftline.raftlog.log import write_atomically
from raftline.raftlog.records import TIERED, build_control_batch, control_type_of, decode_batch
from raftline.raftlog.types import Entry, EntryKind
from raftline.tiered import layout
from raftline.tiered.manifest import (
    Effect,
    ManifestState,
    SegmentMeta,
    decode_command,
    encode_command,
)
from raftline.tiered.reader import (
    DEFAULT_CACHE_BYTES,
    ChunkCache,
    RemoteRead,
    chunks_ahead,
    read_segment,
)
from raftline.tiered.store import ObjectNotFound, ObjectStore, ObjectStoreError, S3Config

log = logging.getLogger(__name__)
T = TypeVar("T")

SNAPSHOT_FILE = "tiered-manifest.json"
UPLOAD_POLL_S = 0.5  # a leader with nothing to upload looks again after this
MAX_OBJECT_BYTES = 64 << 20  # a longer sealed segment is uploaded as several objects
MAX_ADDS_PER_MANIFEST = 16  # segments recorded before the manifest is rewritten
UPLOAD_RUNS = 4  # runs whose objects are in flight together (MAX_OBJECT_BYTES at most in all)
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
        topics: Callable[[], dict[str, Any]] = dict,  # the applied metadata's topics by name
        metadata: Callable[[], Any] | None = None,  # the applied MetadataState (topic sweeps)
        is_controller: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = ObjectStore(config)
        self.topics = topics
        self.metadata = metadata
        self.is_controller = is_controller
        self.sweep_partition_s = SWEEP_PARTITION_S
        self.sweep_topics_s = SWEEP_TOPICS_S
        self.swept_objects = 0
        self.swept_topics = 0
        self._sweeps: asyncio.Task[None] | None = None
        self._deletions: set[asyncio.Task[None]] = set()
        self.cache = ChunkCache(self.store, cache_bytes)
        self.runtime = runtime
        self.cluster_id = cluster_id
        self.now_ms = now_ms
        self.upload_slots = asyncio.Semaphore(UPLOAD_CONCURRENCY)
        # Reading and indexing runs to upload: a thread of its own, so that neither Raft's
        # disk rounds nor consumers' fetch reads queue behind a 64 MiB read.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftline-tiered")
        self.partitions: dict[str, PartitionTiering] = {}
        self.uploaded_bytes = 0
        self.uploaded_segments = 0
        self.upload_errors = 0
        self.remote_reads = 0
        self.remote_read_bytes = 0

    def start(self) -> None:
        """The controller's sweeps of deleted topics' objects (node/tiered_gc.py)."""
        if self.metadata is not None and self._sweeps is None:
            self._sweeps = asyncio.ensure_future(run_topic_sweeps(self))

    def attach(
        self, group: str, topic: Any, partition: int, storage: Any, replica: Any
    ) -> PartitionTiering:
        tiering = PartitionTiering(self, group, topic, partition, storage, replica)
        self.partitions[group] = tiering
        replica.remote = tiering
        return tiering

    def detach(self, group: str) -> None:
        """The replica leaves this node. When its topic was deleted and it led the partition,
        the partition's objects (and, for partition 0, the topic object) leave the bucket."""
        tiering = self.partitions.pop(group, None)
        if tiering is None:
            return
        tiering.stop()
        topic = tiering.topic
        current = self.topics().get(topic.name)
        deleted = current is None or current.topic_id != topic.topic_id
        if deleted and tiering.replica.role == "leader":
            task = asyncio.ensure_future(remove_deleted_partition(self, tiering))
            self._deletions.add(task)
            task.add_done_callback(self._deletions.discard)

    def trim_point(self, group: str, point: int) -> int:
        """The last offset local retention may drop: never past what a durable manifest holds."""
        tiering = self.partitions.get(group)
        if tiering is None:
            return point
        state = tiering.state
        # Never past what a durable manifest holds; always past what retention.* removed from
        # the bucket (the whole log's retention: expired on local disk too).
        return max(min(point, state.durable_next - 1), state.start_offset - 1)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        for task in self._deletions:
            task.cancel()
        if self._sweeps is not None:
            self._sweeps.cancel()
        for tiering in self.partitions.values():
            tiering.stop()
            try:  # a clean stop leaves current snapshots: the next start replays nothing
                _write_snapshot(tiering.path, tiering.state)
            except OSError as exc:
                log.warning("%s: tiered manifest snapshot not written: %s", tiering.group, exc)
        self.cache.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

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
            "raftline_tiered_swept_objects_total": self.swept_objects,
            "raftline_tiered_swept_topics_total": self.swept_topics,
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
        # index -> (term, effect) of applied commands: a leader finds its proposals' outcome
        self._effects: dict[int, tuple[int, Effect]] = {}
        self._held: list[tuple[int, dict[str, Any]]] | None = None  # while rebuilding
        self._saving: asyncio.Task[None] | None = None
        self._save_wanted = False
        self._read_end = -1  # where the last remote read ended (sequential readers continue)
        self._task: asyncio.Task[None] | None = None
        self._topic_written = False
        self._checked_new = False  # the bucket had nothing for this partition before it
        self._last_verify = 0.0
        self.last_upload_s = 0.0
        self.last_sweep = 0.0  # monotonic time of the leader's last sweep of its folder
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
        if self._held is not None:  # the state is being rebuilt: apply after it
            self._held.append((entry.index, command))
        effect = self.state.apply(entry.index, command)
        if effect.reason != "replayed":
            self._effects[entry.index] = (entry.term, effect)
            if len(self._effects) > 1024:
                self._effects.pop(next(iter(self._effects)))
            self._save_soon()

    def _save_soon(self) -> None:
        """Write the state's snapshot file off the loop, the latest state once per write. A
        file left behind by a crash is safe: a restart replays the commands after it, or, when
        local trimming removed them, rebuilds from the bucket (_catch_up_from_bucket)."""
        self._save_wanted = True
        if self._saving is None or self._saving.done():
            self._saving = asyncio.ensure_future(self._save())

    async def _save(self) -> None:
        while self._save_wanted:
            self._save_wanted = False
            state = self.state.copy()  # immutable segments: the copy is a few list copies
            try:
                await self.node.off_loop(_write_snapshot, self.path, state)
            except Exception:
                log.exception("%s: tiered manifest snapshot not written", self.group)

    def restore_from(self, document: dict[str, Any], restore_point: int) -> None:
        """A replica restored from the bucket (node/restore.py): its log starts at
        `restore_point`, and the bucket's manifest says what lies below (segments the new
        leader added since are left to the commands in the log, which apply on top)."""
        state = ManifestState.from_document(document)
        state.segments = [s for s in state.segments if s.last_offset < restore_point]
        state.durable_next = min(state.durable_next, state.next_offset)
        state.applied_index = restore_point - 1
        self.state = state
        write_atomically(self.path, json.dumps(state.snapshot()).encode())

    def start_offset(self, local_start: int) -> int:
        """The partition's log start: the bucket's when it joins the local log."""
        state = self.state
        if state.start_offset > local_start:  # retention.* removed more than local disk did
            return state.start_offset
        if state.segments and local_start <= state.next_offset:
            return state.start_offset
        return local_start

    def pending_upload(self) -> tuple[int, int]:
        """(bytes, segments) of sealed local segments not yet (wholly) in the bucket."""
        pending_bytes = pending_segments = 0
        next_offset = self.state.next_offset
        for segment in self.storage.log.sealed_segments():
            if segment.next_offset > next_offset:
                pending_bytes += segment.size
                pending_segments += 1
        return pending_bytes, pending_segments

    # ---- remote reads (the leader serves them) ----------------------------------------

    async def read(self, offset: int, max_bytes: int, upto: int) -> RemoteRead | None:
        """Batches below the local log start, from the bucket; None if it has none there."""
        segments = self.state.segments
        at = self.state.segment_index(offset)
        if at is None:
            return None
        segment = segments[at]
        try:
            answer = await read_segment(self.node.cache, segment, offset, max_bytes, upto)
        except ObjectStoreError as exc:
            raise BrokerError(
                "leader_unavailable", f"object storage read failed, retry later: {exc}"
            ) from exc
        self.node.remote_reads += 1
        self.node.remote_read_bytes += len(answer.data)
        if offset in (self._read_end, segment.base_offset):  # sequential: load what comes next
            for key, number, size in chunks_ahead(segments, at, answer.end_position):
                self.node.cache.prefetch(key, number, size)
        self._read_end = answer.next_offset
        return answer

    def offset_for_timestamp(self, timestamp: int, local_start: int) -> int | None:
        """Where to look for the first record at or after `timestamp` below the local log
        start: the first uploaded segment whose largest timestamp reaches it (None: local)."""
        for segment in self.state.segments:
            if segment.last_offset >= local_start:
                return None
            if segment.max_timestamp >= timestamp:
                return max(segment.base_offset, self.state.start_offset)
        return None

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
            except BrokerError as exc:  # not the leader any more, Raft did not commit, or a
                # bucket this partition must not write to
                if self.replica.role != "leader":
                    return
                self.node.upload_errors += 1
                self.last_error = exc.message
                log.warning("%s: tiered round stopped: %s", self.group, exc.message)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except Exception:
                self.node.upload_errors += 1
                log.exception("%s: tiered round failed", self.group)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def upload_round(self) -> bool:
        """One round of the leader's work; True when it did something (look again at once)."""
        await self._catch_up_from_bucket()
        # segment.ms seals an idle partition's active segment too, so that it gets uploaded.
        await self.node.runtime.run_on_disk(self.storage.log.roll_if_older)
        await self._write_topic_object()
        await self._check_partition_is_new()
        added = await self._upload_runs(MAX_ADDS_PER_MANIFEST)
        truncated = await self._apply_remote_retention()
        wrote = await self._publish_manifest()
        collected = await self._collect_garbage()
        await sweep_partition(self)
        await self._verify_manifest()
        return bool(added or truncated or wrote or collected)

    async def _check_partition_is_new(self) -> None:
        """Before a partition's first upload: the bucket must hold nothing under its keys. A
        manifest there with segments belongs to another cluster that gave a topic of the same
        name the same id (a bucket shared by two clusters): writing on would mix both."""
        state = self.state
        if state.revision or self._checked_new:
            return
        try:
            document = json.loads(await self.node.store.get(self._manifest_key()))
        except ObjectNotFound:
            self._checked_new = True
            return
        if document.get("segments"):
            raise BrokerError(
                "internal_error",
                f"the bucket already holds {self._manifest_key()} (another cluster's topic "
                "of the same name and id?): not uploading into it; restore it, or use "
                "another bucket or --s3-prefix",
            )
        self._checked_new = True

    async def _catch_up_from_bucket(self) -> None:
        """A replica that missed commands (its log was trimmed past them while it lagged, and
        it installed the leader's trim point) takes the bucket's durable manifest as its start;
        the commands after it are still in its log and apply on top (adds are idempotent)."""
        state = self.state
        first = self.storage.first_index()
        # A replica's own retention never trims past its last durable mark (an entry after
        # the segments it covers), so a gap here means a trim point came from the leader. A
        # follower that installed one goes on applying the later commands (refused: they do not
        # follow its state) and so moves applied_index past the gap: its state then ends below
        # the local log start, which is the same gap.
        behind = bool(state.revision) and state.next_offset < self.storage.log.log_start_offset
        if state.applied_index + 1 >= first and not behind:
            return
        try:
            document = json.loads(await self.node.store.get(self._manifest_key()))
        except ObjectNotFound:
            return
        restored = ManifestState.from_document(document)
        if restored.revision < state.revision:
            return
        # The commands still in the local log apply on top of the bucket's manifest (the old
        # state applied them already, against missing history); commands committed meanwhile
        # wait in `_held` and follow.
        restored.applied_index = first - 1
        self._held = []
        try:
            upto = self.replica.high_watermark
            commands = await self.node.off_loop(self._tiered_commands, first, upto)
            for index, command in [*commands, *self._held]:
                restored.apply(index, command)
        finally:
            held, self._held = self._held, None
        self.state = restored
        log.warning(
            "%s: rebuilt the tiered manifest from the bucket (revision %d) and %d local commands",
            self.group,
            restored.revision,
            len(commands) + len(held),
        )
        self._save_soon()

    def _tiered_commands(self, start: int, end: int) -> list[tuple[int, dict[str, Any]]]:
        """Blocking: the TIERED commands of the local log in [start, end)."""
        found = []
        offset = start
        log_ = self.storage.log
        while offset < end:
            data = log_.read(offset, 1 << 20, upto=end)
            if not data:
                break
            for position, header in iter_headers(data):
                offset = header.last_offset + 1
                if not header.is_control:
                    continue
                decoded = decode_batch(memoryview(data)[position : position + header.size])
                if control_type_of(decoded.records) == TIERED:
                    value = decoded.records[0].value or b""
                    found.append((header.base_offset, decode_command(value)))
        return found

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
        if not await self.node.store.put_if_absent(key, _json(document)) and topic.restored_at:
            # A topic restored from another cluster's objects: they are this cluster's now, so
            # its sweep removes them once the topic is deleted (tiered/FORMAT.md section 8).
            stored = json.loads(await self.node.store.get(key))
            if stored.get("cluster_id") != document["cluster_id"]:
                stored["cluster_id"] = document["cluster_id"]
                await self.node.store.put(key, _json(stored))
        self._topic_written = True

    def _upload_start(self) -> int:
        """Where the next upload starts: the bucket's end (the local log start at first)."""
        start = self.state.next_offset
        local_start = self.storage.log.log_start_offset
        if start < local_start:
            if self.state.revision:  # the bucket holds this partition's history up to `start`
                raise BrokerError(
                    "internal_error",
                    f"offsets {start}..{local_start - 1} left the local log before upload",
                )
            start = local_start
        return start

    def _next_range(self, start: int) -> tuple[int, int] | None:
        """(start, end) of the run to upload from `start`: inside one sealed segment, below the
        commit index and the last stable offset (every transaction in it is decided)."""
        replica = self.replica
        limit = replica.high_watermark
        if replica.producers is not None:
            limit = replica.producers.state.last_stable_offset(limit)
        for segment in self.storage.log.sealed_segments():
            if segment.next_offset <= start:
                continue
            if segment.next_offset > limit:
                return None
            return max(start, segment.base_offset), segment.next_offset
        return None

    async def _upload_runs(self, limit: int) -> int:
        """Upload up to `limit` runs as a pipeline: while the objects of up to UPLOAD_RUNS runs
        (MAX_OBJECT_BYTES in all at most) are being PUT, the oldest whose objects are durable
        is recorded through Raft (in order); returns how many were recorded."""
        pending: deque[tuple[layout.SegmentObjects, asyncio.Task[None]]] = deque()
        start = self._upload_start()
        recorded = 0
        try:
            while True:
                while (
                    len(pending) < UPLOAD_RUNS
                    and recorded + len(pending) < limit
                    and (sum(run.meta.size_bytes for run, _ in pending) < MAX_OBJECT_BYTES)
                ):
                    found = self._next_range(start)
                    run = None if found is None else await self._prepare(*found)
                    if run is None:
                        break
                    puts = asyncio.gather(*(self._put(key, body) for key, body in _puts(run)))
                    pending.append((run, asyncio.ensure_future(puts)))
                    start = run.meta.last_offset + 1
                if not pending:
                    return recorded
                run, puts = pending.popleft()
                await puts  # objects first: an add names only durable objects
                await self._record(run.meta)
                recorded += 1
        finally:
            for _, puts in pending:
                puts.cancel()

    async def _record(self, meta: SegmentMeta) -> None:
        effect = await self._propose({"op": "add", "segment": meta.to_json()})
        if not effect.accepted and effect.reason != "already recorded":
            raise BrokerError("internal_error", f"{meta.object} refused: {effect.reason}")
        self.node.uploaded_bytes += meta.size_bytes
        self.node.uploaded_segments += 1
        self.last_upload_s = time.time()

    async def _prepare(self, start: int, end: int) -> layout.SegmentObjects | None:
        """Read a run of the local log and build its objects (on the disk pool)."""
        data = await self.node.off_loop(self._read_run, start, end)
        if not data:
            return None
        # the log's transaction index: every abort with data in the run, markers in later
        # segments included, each with the LSO recorded after it
        aborted = layout.aborted_ranges(self.replica.log.aborted_txns(start, end))
        return await self.node.off_loop(self._build, data, aborted)

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
        if not await self._write_manifest(state.document(*self._names())):
            return False  # a newer leader wrote a newer manifest: this one is deposed
        await self._propose({"op": "durable", "revision": revision, "next_offset": next_offset})
        return True

    async def _write_manifest(self, document: dict[str, Any]) -> bool:
        """Replace the bucket's manifest by `document` unless the bucket holds a newer one
        (a deposed leader's late write must never replace a new leader's): read it with its
        ETag, compare revisions, write with If-Match (If-None-Match when there is none).
        True: the bucket holds `document`; False: it holds a newer manifest."""
        store, key = self.node.store, self._manifest_key()
        body = _json(document)
        while True:
            try:
                current, etag = await store.get_versioned(key)
            except ObjectNotFound:
                if await store.put_if_absent(key, body):
                    return True
                continue  # another writer created it meanwhile: compare with theirs
            held = int(json.loads(current).get("revision", -1))
            if held >= document["revision"]:  # equal: the same state, so the same document
                return held == document["revision"]
            if etag is None:  # a store without ETags: the plain write (see FORMAT.md)
                await store.put(key, body)
                return True
            if await store.put_if_match(key, body, etag):
                return True

    async def _collect_garbage(self) -> bool:
        keys = self.state.collectable()
        if not keys:
            return False
        await self.node.store.delete(keys)
        await self._propose({"op": "collected", "keys": keys})
        return True

    async def _verify_manifest(self) -> None:
        """Now and then the leader checks that the bucket's manifest is not behind the durable
        state (e.g. deleted by hand), and rewrites it if so."""
        now = time.monotonic()
        if now - self._last_verify < VERIFY_MANIFEST_S or self.state.durable_revision == 0:
            return
        self._last_verify = now
        state = self.state
        if state.revision == state.durable_revision:
            await self._write_manifest(state.document(*self._names()))

    def _names(self) -> tuple[str, int, int]:
        return self.topic.name, self.topic.topic_id, self.partition

    def _manifest_key(self) -> str:
        return layout.manifest_key(self.topic.name, self.topic.topic_id, self.partition)

    async def _propose(self, command: dict[str, Any]) -> Effect:
        """Append a TIERED entry through Raft and return its effect once applied here."""
        batch = build_control_batch(TIERED, encode_command(command))
        replica = self.replica
        try:
            index, term = await replica.runtime.propose(
                self.group, batch, 1, kind=EntryKind.CONTROL
            )
        except Exception as exc:
            raise BrokerError("leader_unavailable", f"proposal failed: {exc}") from exc
        await replica.until_committed(index)  # committed entries are applied first
        applied = self._effects.pop(index, None)
        if applied is None or applied[0] != term:  # another leader's entry took the index
            raise BrokerError("leader_unavailable", "the tiered entry was overwritten")
        return applied[1]


def _puts(run: layout.SegmentObjects) -> list[tuple[str, Any]]:
    meta = run.meta
    puts = [(meta.object, run.log), (meta.index, run.index), (meta.time_index, run.time_index)]
    if run.txn_index is not None and meta.txn_index is not None:
        puts.append((meta.txn_index, run.txn_index))
    return puts


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, indent=1, sort_keys=True).encode()


def _write_snapshot(path: Path, state: ManifestState) -> None:
    write_atomically(path, json.dumps(state.snapshot()).encode())


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
