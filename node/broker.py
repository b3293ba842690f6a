"""The broker facade the HTTP layer talks to: topics, produce, fetch, cluster view, health, metrics.

Owns the node's wiring: runtime, metadata replica, router, local replicas, controller commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import time
import uuid
from typing import Any

from raftline.node import restore
from raftline.node.clock import WallClock
from raftline.node.collector import COLLECTOR
from raftline.node.config import NodeConfig
from raftline.node.controller import LeaderWatch, MetaReplica, encode_command
from raftline.node.coordinator.service import (
    GROUPS_TOPIC,
    GROUPS_TOPIC_CONFIG,
    SHARDS,
    Coordinator,
    shard_of,
)
from raftline.node.errors import BrokerError, NotLeader, OutcomeUnknown
from raftline.node.exchanges.model import COMMANDS as EXCHANGE_COMMANDS
from raftline.node.exchanges.service import ExchangeService
from raftline.node.metadata import (
    META_GROUP,
    MetadataError,
    TopicInfo,
    check_topic_name,
    place_replicas,
    validate_topic_config,
)
from raftline.node.partition import PartitionReplica
from raftline.node.producers import PartitionProducers
from raftline.node.queues.service import (
    QUEUES_SHARDS,
    QUEUES_TOPIC,
    QUEUES_TOPIC_CONFIG,
    QueueService,
)
from raftline.node.replies import expire_temporary_topics
from raftline.node.routing import Router
from raftline.node.runtime import Runtime
from raftline.node.tiering import NodeTiering, s3_config_of
from raftline.node.transactions.service import (
    SHARDS as TXN_SHARDS,
)
from raftline.node.transactions.service import (
    TXN_TOPIC,
    TXN_TOPIC_CONFIG,
    TxnService,
)
from raftline.node.transactions.service import (
    shard_of as txn_shard_of,
)
from raftline.node.transport import RemoteError
from raftline.node.upkeep import LogUpkeep
from raftline.raftlog.log import LogConfig
from raftline.raftlog.records import decode_batch
from raftline.raftlog.storage import RaftStorage
from raftline.tiered import topic_config as tiered_config

__all__ = ["Broker", "BrokerError", "NotLeader", "OutcomeUnknown"]


log = logging.getLogger(__name__)

INTERNAL_TOPICS = (GROUPS_TOPIC, QUEUES_TOPIC, TXN_TOPIC)
MAINTAIN_S = 0.2  # period of registration, bootstrap and controller rounds
STARTS_AT_ONCE = 32  # partition replicas a reconciliation opens side by side
PRODUCER_COUNTS_EVERY_S = 10.0  # /metrics recounts producers over every replica this seldom
BALANCE_S = 1.0  # the controller's leader balancing runs at most this often
CREATE_WAIT_S = 5.0  # create_topic waits this long for its partitions to elect leaders
DEFAULT_REPLICATION_FACTOR = 3  # capped at the number of registered nodes
PRODUCER_ID_BLOCK = 100  # producer ids a node asks the controller for at a time


def check_keyed(batch: bytes) -> None:
    """Kafka refuses records without a key on a compacted topic: so does Raftline."""
    try:
        records = decode_batch(batch).records
    except ValueError:
        return  # a malformed batch: the replica's own check names the problem
    if any(record.key is None for record in records):
        raise BrokerError(
            "invalid_request", "a compacted topic (cleanup.policy compact) needs a key per record"
        )


def _freeze_replicas(reclaim: bool) -> None:
    """Keep the live replicas out of the cyclic collector's full scans: they live as long as
    their partition, and at thousands of replicas those scans took ~45% of the loop, stalling it
    past the peers' dead-after window. After replicas were dropped, one full collection first
    reclaims them."""
    if reclaim:
        gc.unfreeze()
        gc.collect()
    else:
        gc.collect(1)
    gc.freeze()


class Broker:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.clock = WallClock()  # every wall-clock read of this node goes through it
        self.runtime = Runtime(config, on_rpc=self._on_rpc)
        self.meta = MetaReplica(on_change=self._metadata_changed)
        self.router = Router(config, self.runtime, self.meta, self._on_rpc)  # who leads what
        self.partitions: dict[str, PartitionReplica] = {}
        self.coordinator = Coordinator(self)  # consumer groups: shards of the __groups topic
        self.transactions = TxnService(self)  # transaction coordinator: shards of __transactions
        self.queues = QueueService(self)  # queues: shards of the __queues topic
        self.exchanges = ExchangeService(self)  # exchanges: in the cluster metadata
        self._reconciling: asyncio.Task[None] | None = None
        self._reconcile_again = False
        self._tasks: list[asyncio.Task[None]] = []
        self.leaders = LeaderWatch()  # leader changes seen here, for the controller's balancing
        self.runtime.leader_view.listeners.append(self._leader_changed)
        self._balanced_at = 0.0
        self._producer_counts: tuple[float, int, int] | None = None  # (at, producers, expired)
        self.counters: dict[str, int] = {
            "produce_requests": 0,
            "produce_bytes": 0,
            "fetch_requests": 0,
            "fetch_bytes": 0,
            "leadership_moves": 0,
            "producer_ids": 0,
            "cleaner_bytes_cleaned": 0,  # of segments the cleaner read
            "cleaner_bytes_freed": 0,  # by which cleaning shrank them
            "cleaner_records_removed": 0,
            "exchange_messages_routed": 0,  # published through an exchange, written somewhere
            "exchange_messages_unroutable": 0,  # matched no binding and no alternate: dropped
            "exchange_messages_alternate": 0,  # matched no binding: written to the alternate
            "exchange_transactions": 0,  # multi-destination publishes committed atomically
            "requests": 0,  # POST /v1/request calls answered with a reply
            "request_timeouts": 0,  # POST /v1/request calls that got no reply in time
            "forwarded_requests": 0,  # requests passed on to the partition leader (HTTP)
        }
        self._producer_ids: range = range(0)
        self._producer_ids_lock = asyncio.Lock()
        self.upkeep = LogUpkeep(self)  # retention, compaction, producer clocks
        s3 = s3_config_of(config)  # tiered storage: uploads, remote reads (node/tiering.py)
        self.tiering = (
            NodeTiering(
                s3,
                self.runtime,
                lambda: self.meta.state.cluster_id,
                self.clock.now_ms,
                topics=lambda: self.meta.state.topics,
                cache_bytes=config.tiered_cache_bytes,
                metadata=lambda: self.meta.state,
                is_controller=lambda: self.meta.role == "leader",
            )
            if s3 is not None
            else None
        )

    # lifecycle

    async def start(self) -> None:
        data_dir = self.config.data_dir
        await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
        await self.runtime.start()
        storage = await self.runtime.run_on_disk(self._open_storage, data_dir / META_GROUP, {})
        members = sorted(self.config.members())
        # Replay the whole metadata log into the in-memory state machine (it is small).
        self.runtime.add_group(META_GROUP, storage, members, self.meta, applied=-1)
        self.runtime.first_groups.add(META_GROUP)  # the controller keeps up under load
        if members == [self.node_id]:
            self.runtime.campaign(META_GROUP)
        self._tasks.append(asyncio.ensure_future(self._maintain()))
        self._tasks.append(asyncio.ensure_future(self.upkeep.run_retention()))
        self._tasks.append(asyncio.ensure_future(self.upkeep.run_cleaning()))
        self._tasks.append(asyncio.ensure_future(self.coordinator.run()))
        self._tasks.append(asyncio.ensure_future(self.transactions.run()))
        self._tasks.append(asyncio.ensure_future(self.queues.run()))
        if self.tiering is not None:
            self.tiering.start()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._reconciling is not None:
            self._reconciling.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for replica in list(self.partitions.values()):  # a cancelled reconcile may drop one
            replica.close()
            try:
                await self.runtime.run_on_disk(replica.save_producers)
            except Exception as exc:  # the next start replays more of the log instead
                log.warning("no producer snapshot for %s: %s", replica.group, exc)
        if self.tiering is not None:
            self.tiering.close()
        self.coordinator.close()
        self.transactions.close()
        self.queues.close()
        await self.runtime.stop()

    def _open_storage(self, path: Any, topic_config: dict[str, str]) -> RaftStorage:
        settings: dict[str, Any] = {"fsync": self.config.fsync}
        if "segment.bytes" in topic_config:
            settings["segment_bytes"] = int(topic_config["segment.bytes"])
        if "segment.ms" in topic_config:
            settings["segment_ms"] = int(topic_config["segment.ms"])
        if "retention.ms" in topic_config:
            settings["retention_ms"] = int(topic_config["retention.ms"])
        if "retention.bytes" in topic_config:
            settings["retention_bytes"] = int(topic_config["retention.bytes"])
        if self.tiering is not None and tiered_config.remote_enabled(topic_config):
            settings.update(tiered_config.local_retention(topic_config))
        if "delete" not in topic_config.get("cleanup.policy", "delete"):
            settings["retention_ms"] = settings["retention_bytes"] = -1  # compact only
        return RaftStorage(path, LogConfig(**settings), clock=self.clock.now_ms)

    # local replicas follow the applied metadata

    def _metadata_changed(self) -> None:
        for node in self.meta.state.nodes.values():
            self.runtime.transport.add_peer(node.id, node.raft)
        if self._reconciling is not None and not self._reconciling.done():
            self._reconcile_again = True
            return
        self._reconciling = asyncio.ensure_future(self._reconcile())

    async def _reconcile(self) -> None:
        """Start the partition replicas the metadata places here; stop and delete the others."""
        self._reconcile_again = True
        while self._reconcile_again:
            self._reconcile_again = False
            wanted = self.meta.state.groups_of(self.node_id)
            # Set operations, not a loop over every local replica: this runs on each change.
            local = self.partitions.keys() | self.coordinator.replicas.keys()
            local |= self.queues.replicas.keys() | self.transactions.replicas.keys()
            leaving = local - wanted.keys()
            for group in leaving:
                if group in self.partitions:
                    self.partitions.pop(group).close()
                self.upkeep.detach(group)
                if self.tiering is not None:
                    self.tiering.detach(group)
                self.coordinator.drop_replica(group)
                self.queues.drop_replica(group)
                self.transactions.drop_replica(group)
                await self.runtime.remove_group(group)
                await self.runtime.run_on_disk(shutil.rmtree, self._partition_dir(group), True)
            shards = (
                self.partitions,
                self.coordinator.replicas,
                self.queues.replicas,
                self.transactions.replicas,
            )
            local = set().union(*shards)  # what is left of it
            starting = [
                (group, topic, partition)
                for topic_info in self.meta.state.topics.values()
                if not (mine := topic_info.groups_on(self.node_id)).keys() <= local
                for group, (topic, partition) in mine.items()
                if group not in local
            ]
            # Opening a log waits for a disk thread: open a batch at a time, side by side.
            for i in range(0, len(starting), STARTS_AT_ONCE):
                batch = starting[i : i + STARTS_AT_ONCE]
                await asyncio.gather(*(self._start_partition(*item) for item in batch))
            if leaving or starting:
                _freeze_replicas(reclaim=bool(leaving))

    def _partition_dir(self, group: str) -> Any:
        return self.config.data_dir / "partitions" / group

    async def _start_partition(self, group: str, topic: TopicInfo, partition: int) -> None:
        try:
            storage = await self.runtime.run_on_disk(
                self._open_storage, self._partition_dir(group), topic.config
            )
        except Exception:
            log.exception("cannot open the log of %s", group)
            return
        if self.meta.state.topics.get(topic.name) is not topic:  # deleted while opening
            await self.runtime.run_on_disk(storage.close)
            return
        commit = storage.hard_state.commit
        replicas = topic.replicas[partition]
        fresh = storage.last_index() < 0
        if topic.name in INTERNAL_TOPICS:
            # A coordinator or queue shard replays its whole log, which starts with a checkpoint.
            if topic.name == GROUPS_TOPIC:
                shard: Any = self.coordinator.new_replica(group)
            elif topic.name == TXN_TOPIC:
                shard = self.transactions.new_replica(group)
            else:
                shard = self.queues.new_replica(group)
            self.runtime.add_group(group, storage, replicas, shard, applied=-1)
            if replicas == [self.node_id] or (fresh and replicas[0] == self.node_id):
                self.runtime.campaign(group, pre_vote=not fresh)
            return
        restored = None
        if topic.restored_at and self.tiering is not None:
            try:
                restored = await restore.prepare_replica(
                    self.tiering.store, self.runtime, topic, partition, storage
                )
            except Exception:
                log.exception("cannot restore %s from the bucket", group)
                await self.runtime.run_on_disk(storage.close)
                return
        producers = PartitionProducers(
            self._partition_dir(group),
            expiry_ms=self.config.producer_expiry_ms,
            snapshot_every=self.config.producer_snapshot_every,
            log=storage.log,
        )
        # Producer state replays the committed entries after its snapshot (the runtime hands
        # them to on_commit as it does after any restart with applied < commit).
        replay_from = await self.runtime.run_on_disk(producers.load, storage.first_index(), commit)
        replica = PartitionReplica(
            self.runtime,
            group,
            topic.name,
            partition,
            storage.log,
            commit,
            self.router.not_leader,
            self.config.request_timeout_s,
            producers,
            self._verifier(topic.name, partition),
        )
        self.partitions[group] = replica
        self.upkeep.attach(group, storage.log, topic.config)
        if self.tiering is not None and tiered_config.remote_enabled(topic.config):
            tiering = self.tiering.attach(group, topic, partition, storage, replica)
            if restored is not None:
                tiering.restore_from(restored, topic.restored_at[partition])
            replay_from = max(storage.first_index(), min(replay_from, tiering.replay_from))
        applied = min(commit, replay_from - 1)
        wait_for = replicas[0] if fresh else None
        self.runtime.add_group(group, storage, replicas, replica, applied, wait_for)
        if replicas == [self.node_id] or (fresh and replicas[0] == self.node_id):
            self.runtime.campaign(group, pre_vote=not fresh)  # a new group: no leader to disrupt

    # background: registration, bootstrap, controller (log upkeep: node/upkeep.py)

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(MAINTAIN_S)
            try:
                await self._maintain_once()
            except (BrokerError, RemoteError) as exc:
                log.debug("maintenance round: %s", exc)
            except Exception:
                log.exception("maintenance round failed")

    async def _maintain_once(self) -> None:
        state = self.meta.state
        if self.meta.role == "leader" and state.cluster_id is None:
            await self._propose_meta({"op": "bootstrap", "cluster_id": str(uuid.uuid4())})
        me = state.nodes.get(self.node_id)
        wanted = {
            "id": self.node_id,
            "raft": self.config.raft,
            "http": self.config.http,
            "rack": self.config.rack,
        }
        if me is None or (me.raft, me.http, me.rack) != (
            self.config.raft,
            self.config.http,
            self.config.rack,
        ):
            await self.router.on_controller("register_node", wanted)
        now = time.monotonic()
        settled = now - self.meta.leader_since > self.config.leader_settle_s
        if self.meta.role == "leader" and settled and now - self._balanced_at >= BALANCE_S:
            self._balanced_at = now
            await self._balance_leaders(now)
        if self.meta.role == "leader":
            await expire_temporary_topics(self)

    def _leader_changed(self, group: str) -> None:
        self.leaders.saw(group, self.runtime.leader_view.leader_of(group), time.monotonic())

    async def _balance_leaders(self, now: float) -> None:
        for group, current, preferred in self.leaders.moves(
            self.meta.state,
            self.router.live_leader,
            self.runtime.transport.alive,
            now,
            self.config.leader_settle_s,
        ):
            self.counters["leadership_moves"] += 1
            self.leaders.moved(group, now)
            if current == self.node_id:
                self._transfer(group, preferred)
            else:
                with contextlib.suppress(RemoteError):
                    await self.runtime.transport.call(current, "transfer", [group, preferred], 1.0)

    def _transfer(self, group: str, to: int) -> None:
        if group in self.runtime.groups and self.runtime.groups[group].role == "leader":
            self.runtime.transfer_leadership(group, to)

    # metadata commands go through the controller (the metadata leader)

    async def _on_rpc(self, peer: int, method: str, args: Any) -> Any:
        if method == "transfer":
            group, to = args
            self._transfer(str(group), int(to))
            return None
        if method == "offsets":
            return {g: self._local_offsets(g) for g in args if g in self.partitions}
        if method.startswith("group_"):
            return await self.coordinator.handle(method, args)
        if method.startswith("txn_"):
            return await self.transactions.handle(method, args)
        if method == "marker":
            return await self._local_marker(args)
        if method.startswith("queue_"):
            return await self.queues.handle(method, args)
        if method == "offset_for_timestamp":
            topic, partition, timestamp = args
            return await self.local_offset_for_timestamp(str(topic), int(partition), int(timestamp))
        return await self._controller_local(method, args)

    async def _controller_local(self, method: str, args: Any) -> dict[str, Any]:
        if self.meta.role != "leader":
            raise BrokerError("not_leader", f"node {self.node_id} is not the controller")
        try:
            if method == "register_node":
                return await self._propose_meta({"op": "register_node", "node": args})
            if method == "create_topic":
                name = check_topic_name(args["name"])
                config = validate_topic_config(args["config"])
                factor = args["replication_factor"]
                if factor is None:  # at least 1: before any node registered, a retryable 503
                    factor = min(DEFAULT_REPLICATION_FACTOR, len(self.meta.state.nodes)) or 1
                replicas = place_replicas(self.meta.state, int(args["partitions"]), int(factor))
                command = {"op": "create_topic", "name": name, "config": config}
                if args.get("restore") is not None:  # from the bucket (node/restore.py)
                    command["restore"] = args["restore"]
                if args.get("expires_ms") is not None:  # a temporary (reply) topic
                    command["expires_ms"] = int(args["expires_ms"])
                return await self._propose_meta({**command, "replicas": replicas})
            if method == "allocate_producer_ids":
                command = {"op": "allocate_producer_ids", "count": int(args["count"])}
                return await self._propose_meta(command)
            if method == "delete_topic":
                return await self._propose_meta({"op": "delete_topic", "name": args["name"]})
            if method == "metadata_command" and args.get("op") in (
                *EXCHANGE_COMMANDS,
                "touch_topic",
            ):  # commands whose every rule MetadataState.apply checks
                return await self._propose_meta(dict(args))
        except MetadataError as exc:
            raise BrokerError(exc.code, exc.message) from None
        raise BrokerError("invalid_request", f"unknown controller method {method!r}")

    async def _propose_meta(self, command: dict[str, Any]) -> dict[str, Any]:
        applied: list[asyncio.Future[dict[str, Any]]] = []

        def accepted(index: int, term: int) -> None:
            applied.append(self.meta.expect(index, term))

        appended = self.runtime.propose(META_GROUP, encode_command(command), on_accept=accepted)
        try:
            await asyncio.wait_for(appended, self.config.request_timeout_s)
            return await asyncio.wait_for(applied[0], self.config.request_timeout_s)
        except TimeoutError:
            raise BrokerError("timeout", "the metadata change did not commit in time") from None
        except BrokerError:
            raise
        except Exception as exc:  # NotLeaderError: leadership moved under us
            raise BrokerError("leader_unavailable", f"controller changed: {exc}") from None

    async def _topic(self, name: str, current: bool) -> TopicInfo:
        if current:
            await self.router.barrier()
        topic = self.meta.state.topics.get(name)
        if topic is None and not current:
            await self.router.barrier()
            topic = self.meta.state.topics.get(name)
        if topic is None:
            raise BrokerError("unknown_topic", f"unknown topic {name!r}")
        return topic

    # the HTTP layer's interface

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int | None,
        config: dict[str, str],
        restore: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`replication_factor` None: min(3, registered nodes), as the controller sees them."""
        try:
            check_topic_name(self._user_topic(name))
            validate_topic_config(config)
        except MetadataError as exc:
            raise BrokerError(exc.code, exc.message) from None
        if self.tiering is None and tiered_config.remote_enabled(config):
            raise BrokerError(
                "invalid_request",
                "remote.storage.enable=true needs object storage: this node was started "
                "without --s3-endpoint and --s3-bucket",
            )
        args = {
            "name": name,
            "partitions": partitions,
            "replication_factor": replication_factor,
            "config": config,
            "restore": restore,
        }
        await self.router.on_controller("create_topic", args)
        topic = await self._topic(name, current=True)
        deadline = time.monotonic() + CREATE_WAIT_S
        groups = [topic.group(p) for p in range(len(topic.replicas))]
        while time.monotonic() < deadline and any(
            self.router.live_leader(g) is None for g in groups
        ):
            await asyncio.sleep(0.05)
        return await self.describe_topic(name)

    async def restore_topics(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Topics from the bucket after the cluster lost its disks (node/restore.py)."""
        return await restore.restore_topics(self, names)

    async def list_topics(self) -> list[dict[str, Any]]:
        await self.router.barrier()
        return [
            {
                "name": t.name,
                "partitions": len(t.replicas),
                "replication_factor": t.replication_factor,
            }
            for t in sorted(self.meta.state.topics.values(), key=lambda t: t.name)
            if t.name not in INTERNAL_TOPICS
        ]

    async def describe_topic(self, name: str) -> dict[str, Any]:
        topic = await self._topic(self._user_topic(name), current=True)
        groups = [topic.group(p) for p in range(len(topic.replicas))]
        offsets = await self._offsets(groups)
        alive = self.runtime.transport.alive

        def in_sync(partition: int, group: str) -> list[int]:
            known = offsets.get(group, (0, 0, None))[2]
            return (
                known if known is not None else [r for r in topic.replicas[partition] if alive(r)]
            )

        return {
            "name": topic.name,
            "config": dict(topic.config),
            "replication_factor": topic.replication_factor,
            "partitions": [
                {
                    "partition": p,
                    "leader": self.router.live_leader(group),
                    "replicas": list(topic.replicas[p]),
                    "in_sync": in_sync(p, group),
                    "log_start_offset": offsets.get(group, (0, 0, None))[0],
                    "high_watermark": offsets.get(group, (0, 0, None))[1],
                }
                for p, group in enumerate(groups)
            ],
        }

    def _local_offsets(self, group: str) -> tuple[int, int, list[int] | None]:
        """(log start, high watermark, in-sync replicas) of a local replica; the in-sync set
        (replicas holding everything committed, on live nodes) is known only on the leader."""
        replica = self.partitions[group]
        core = self.runtime.groups[group].core
        in_sync = None
        if core.role == "leader":
            in_sync = sorted(
                peer
                for peer in core.voters
                if peer == self.node_id
                or (
                    (progress := core.progress(peer)) is not None
                    and progress.match >= core.commit_index
                    and self.runtime.transport.alive(peer)
                )
            )
        return replica.log_start_offset, replica.high_watermark, in_sync

    async def _offsets(self, groups: list[str]) -> dict[str, tuple[int, int, list[int] | None]]:
        """(log start, high watermark, in-sync replicas) per group, from each group's leader."""
        by_leader: dict[int, list[str]] = {}
        out: dict[str, tuple[int, int, list[int] | None]] = {}
        for group in groups:
            leader = self.router.live_leader(group)
            if leader == self.node_id or (leader is None and group in self.partitions):
                out[group] = self._local_offsets(group)
            elif leader is not None:
                by_leader.setdefault(leader, []).append(group)
        for leader, asked in by_leader.items():
            try:
                answer = await self.runtime.transport.call(leader, "offsets", asked, 1.0)
                out.update({g: (int(v[0]), int(v[1]), v[2]) for g, v in answer.items()})
            except (RemoteError, TypeError, ValueError, AttributeError, IndexError):
                out.update({g: self._local_offsets(g) for g in asked if g in self.partitions})
        return out

    async def delete_topic(self, name: str) -> None:
        await self.router.on_controller("delete_topic", {"name": self._user_topic(name)})

    async def topic_partition_count(self, name: str) -> int:
        return len((await self._topic(self._user_topic(name), current=False)).replicas)

    async def topic_settings(self, name: str) -> tuple[int, dict[str, str]]:
        """A topic's partition count and config as the metadata holds them now: what the
        HTTP layer caches per topic. describe_topic asks every partition's leader for its
        offsets besides, an RPC per leader and a walk over all partitions: as the cache's
        refresh (every second per topic produced to) that held loops at 2,000-partition topics."""
        topic = await self._topic(self._user_topic(name), current=True)
        return len(topic.replicas), dict(topic.config)

    async def _replica(self, topic_name: str, partition: int) -> PartitionReplica:
        topic = await self._topic(self._user_topic(topic_name), current=False)
        if not 0 <= partition < len(topic.replicas):
            raise BrokerError(
                "unknown_partition", f"topic {topic_name!r} has no partition {partition}"
            )
        group = topic.group(partition)
        replica = self.partitions.get(group)
        if replica is None or group not in self.runtime.groups:
            raise self.router.not_leader(
                group,
                f"node {self.node_id} holds no replica of {topic_name}/{partition}",
                topic.replicas[partition],
            )
        return replica

    async def produce(
        self, topic: str, partition: int, batch: bytes, acks: str, crc_checked: bool = False
    ) -> int:
        base, _ = await self.append(topic, partition, batch, acks, crc_checked)
        return base

    async def append(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        acks: str,
        crc_checked: bool = False,
        transactional_id: str | None = None,
    ) -> tuple[int, bool]:
        """Append a batch on this node (its leader): (base offset, duplicate). A duplicate is
        a retry of an idempotent producer's batch: nothing written, the original's offset."""
        replica = await self._replica(topic, partition)
        info = self.meta.state.topics.get(topic)
        if info is not None and "compact" in info.config.get("cleanup.policy", "delete"):
            check_keyed(batch)
        self.counters["produce_requests"] += 1
        self.counters["produce_bytes"] += len(batch)
        return await replica.append(batch, acks, crc_checked, transactional_id)

    async def new_producer(self) -> tuple[int, int]:
        """A producer id never handed out before (and epoch 0), from this node's block of
        ids; a used-up block is replaced by a new one from the controller (a metadata
        command, so ids survive controller moves and restarts; a block left unused by a
        restart is simply skipped)."""
        async with self._producer_ids_lock:
            if not self._producer_ids:
                block = await self.router.on_controller(
                    "allocate_producer_ids", {"count": PRODUCER_ID_BLOCK}
                )
                first, count = int(block["first"]), int(block["count"])
                self._producer_ids = range(first, first + count)
            producer_id = self._producer_ids[0]
            self._producer_ids = self._producer_ids[1:]
        self.counters["producer_ids"] += 1
        return producer_id, 0

    async def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int
    ) -> tuple[list[memoryview], int, int]:
        replica = await self._replica(topic, partition)
        self.counters["fetch_requests"] += 1
        batches, log_start, high_watermark = await replica.fetch(offset, max_bytes, wait_ms)
        self.counters["fetch_bytes"] += sum(len(b) for b in batches)
        return batches, log_start, high_watermark

    async def fetch_stable(
        self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int
    ) -> tuple[list[memoryview], int, int, int, int]:
        """A read_committed fetch on this node (the leader): see PartitionReplica.fetch_stable."""
        replica = await self._replica(topic, partition)
        self.counters["fetch_requests"] += 1
        answer = await replica.fetch_stable(offset, max_bytes, wait_ms)
        self.counters["fetch_bytes"] += sum(len(b) for b in answer[0])
        return answer

    async def local_offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> int:
        """On the partition's leader: the first offset whose message is at or after `timestamp`
        (the high watermark when none is); NotLeader elsewhere."""
        replica = await self._replica(topic, partition)
        return await replica.offset_for_timestamp(timestamp)

    # consumer groups: the coordinator shards are the partitions of the internal __groups topic

    async def _groups_topic(self) -> TopicInfo:
        """The internal topic of coordinator shards, created on the first group call."""
        return await self._internal_topic(GROUPS_TOPIC, SHARDS, GROUPS_TOPIC_CONFIG)

    async def _internal_topic(self, name: str, shards: int, config: dict[str, str]) -> TopicInfo:
        """An internal topic whose partitions are state-machine shards, created on first use."""
        topic = self.meta.state.topics.get(name)
        if topic is None:
            await self.router.barrier()
            topic = self.meta.state.topics.get(name)
        if topic is None:
            args = {
                "name": name,
                "partitions": shards,
                "replication_factor": min(3, len(self.config.members())),
                "config": dict(config),
            }
            try:
                await self.router.on_controller("create_topic", args)
            except BrokerError as exc:
                if exc.code != "topic_exists":
                    raise
            topic = await self._topic(name, current=True)
            deadline = time.monotonic() + CREATE_WAIT_S
            shards = [topic.group(p) for p in range(len(topic.replicas))]
            while time.monotonic() < deadline and any(
                self.router.live_leader(g) is None for g in shards
            ):
                await asyncio.sleep(0.05)
        return topic

    async def group_call(self, group: str, method: str, args: dict[str, Any]) -> Any:
        """Run a group call (Coordinator._call_*) on the leader of the group's shard."""
        topic = await self._groups_topic()
        shard = topic.group(shard_of(group, len(topic.replicas)))
        voters = topic.replicas[shard_of(group, len(topic.replicas))]
        return await self.router.on_leader_of(
            shard, method, {**args, "group": group, "shard": shard}, voters
        )

    # transactions: the coordinator shards are the partitions of the internal __transactions

    async def txn_call(self, transactional_id: str, method: str, args: dict[str, Any]) -> Any:
        """Run a transaction call (TxnService.handle) on the leader of the id's shard."""
        topic = await self._internal_topic(TXN_TOPIC, TXN_SHARDS, TXN_TOPIC_CONFIG)
        index = txn_shard_of(transactional_id)
        shard = topic.group(index)
        args = {**args, "transactional_id": transactional_id, "shard": shard}
        return await self.router.on_leader_of(shard, method, args, topic.replicas[index])

    async def allocate_producer_ids(self, count: int) -> dict[str, int]:
        block = await self.router.on_controller("allocate_producer_ids", {"count": count})
        return {"first": int(block["first"]), "count": int(block["count"])}

    async def write_marker(
        self,
        topic: str,
        partition: int,
        *,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> None:
        """Write a transaction marker on the partition's leader (wherever it is). A deleted
        topic needs none (nothing of the transaction is left to read)."""
        try:
            info = await self._topic(topic, current=False)
        except BrokerError as exc:
            if exc.code == "unknown_topic":
                return
            raise
        if not 0 <= partition < len(info.replicas):
            return  # the topic shrank or was re-created: nothing of the transaction is there
        args = [topic, partition, producer_id, producer_epoch, commit, coordinator_epoch]
        await self.router.on_leader_of(
            info.group(partition), "marker", args, info.replicas[partition]
        )

    def _verifier(self, topic: str, partition: int) -> Any:
        """What a partition leader calls before a transaction's first write to it."""

        async def verify(transactional_id: str, producer_id: int, epoch: int) -> None:
            args = {
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "partitions": [[topic, partition]],
            }
            await self.txn_call(transactional_id, "txn_add_partitions", args)

        return verify

    async def _local_marker(self, args: Any) -> None:
        topic, partition, producer_id, epoch, commit, coordinator_epoch = args
        replica = await self._replica(str(topic), int(partition))
        await replica.write_marker(
            int(producer_id), int(epoch), bool(commit), int(coordinator_epoch), self.clock.now_ms()
        )

    async def list_groups(self) -> list[dict[str, Any]]:
        topic = await self._groups_topic()
        groups: list[dict[str, Any]] = []
        for index, voters in enumerate(topic.replicas):
            shard = topic.group(index)
            answer = await self.router.on_leader_of(shard, "group_list", {"shard": shard}, voters)
            groups.extend(answer["groups"])
        return sorted(groups, key=lambda g: str(g["group"]))

    async def partition_offsets(
        self, topic: str, partitions: list[int]
    ) -> dict[int, tuple[int, int]]:
        """(log start, high watermark) of some partitions of a topic, from their leaders."""
        info = await self._topic(self._user_topic(topic), current=False)
        groups = {}
        for partition in partitions:
            if not 0 <= partition < len(info.replicas):
                raise BrokerError(
                    "unknown_partition", f"topic {topic!r} has no partition {partition}"
                )
            groups[partition] = info.group(partition)
        offsets = await self._offsets(sorted(set(groups.values())))
        missing = [p for p, g in groups.items() if g not in offsets]
        if missing:
            raise BrokerError("leader_unavailable", f"no leader known for {topic} {missing}")
        return {p: (offsets[g][0], offsets[g][1]) for p, g in groups.items()}

    async def offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> int:
        info = await self._topic(self._user_topic(topic), current=False)
        if not 0 <= partition < len(info.replicas):
            raise BrokerError("unknown_partition", f"topic {topic!r} has no partition {partition}")
        args = [topic, partition, timestamp]
        result: int = await self.router.on_leader_of(
            info.group(partition), "offset_for_timestamp", args, info.replicas[partition]
        )
        return result

    # queues: the queue shards are the partitions of the internal __queues topic

    async def queue_call(self, queue: str, method: str, args: dict[str, Any]) -> Any:
        """Run a queue call (QueueService._call_*) on the leader of the queue's shard."""
        topic = await self._internal_topic(QUEUES_TOPIC, QUEUES_SHARDS, QUEUES_TOPIC_CONFIG)
        index = shard_of(queue, len(topic.replicas))
        shard = topic.group(index)
        return await self.router.on_leader_of(
            shard, method, {**args, "queue": queue, "shard": shard}, topic.replicas[index]
        )

    def queue_leader_http(self, queue: str) -> str | None:
        """HOST:PORT of the queue's shard leader as this node sees it; None when none is known
        (clients send their next queue calls there: no node-to-node forward)."""
        topic = self.meta.state.topics.get(QUEUES_TOPIC)
        if topic is None:
            return None
        return self.router.http_of(
            self.router.live_leader(topic.group(shard_of(queue, len(topic.replicas))))
        )

    async def list_queues(self) -> list[dict[str, Any]]:
        topic = await self._internal_topic(QUEUES_TOPIC, QUEUES_SHARDS, QUEUES_TOPIC_CONFIG)
        queues: list[dict[str, Any]] = []
        for index, voters in enumerate(topic.replicas):
            shard = topic.group(index)
            answer = await self.router.on_leader_of(shard, "queue_list", {"shard": shard}, voters)
            queues.extend(answer["queues"])
        return sorted(queues, key=lambda q: str(q["name"]))

    async def partition_call(self, topic: str, partition: int, method: str, args: Any) -> Any:
        """Run the node RPC `method` on the leader of a user topic's partition."""
        info = await self._topic(self._user_topic(topic), current=False)
        if not 0 <= partition < len(info.replicas):
            raise BrokerError("unknown_partition", f"topic {topic!r} has no partition {partition}")
        return await self.router.on_leader_of(
            info.group(partition), method, args, info.replicas[partition]
        )

    @staticmethod
    def _user_topic(name: str) -> str:
        """Users see no internal topic: they can neither create, read nor write one."""
        if name in INTERNAL_TOPICS:
            raise BrokerError("unknown_topic", f"{name!r} is an internal topic")
        return name

    async def cluster(self) -> dict[str, Any]:
        state = self.meta.state
        return {
            "cluster_id": state.cluster_id,
            "controller": self.router.live_leader(META_GROUP),
            "nodes": [
                {
                    "id": node.id,
                    "http": node.http,
                    "raft": node.raft,
                    "rack": node.rack,
                    "alive": self.runtime.transport.alive(node.id),
                }
                for node in sorted(state.nodes.values(), key=lambda n: n.id)
            ],
        }

    def ready(self) -> bool:
        """Joined: a metadata leader is known and this node's registration has been applied."""
        return (
            self.router.live_leader(META_GROUP) is not None
            and self.meta.state.cluster_id is not None
            and self.node_id in self.meta.state.nodes
        )

    def producer_counts(self) -> tuple[int, int]:
        """(idempotent producers, producers expired) in the producer state of the local
        replicas (every replica applies it, leader or not), recounted at most every
        PRODUCER_COUNTS_EVERY_S: a walk over every replica per /metrics read was 3% of a
        restarting node's loop at 18 k replicas, read every second."""
        now = time.monotonic()
        if self._producer_counts is None or now - self._producer_counts[0] >= (
            PRODUCER_COUNTS_EVERY_S
        ):
            states = [r.producers for r in self.partitions.values() if r.producers is not None]
            producers = sum(len(p.state.producers) for p in states)
            self._producer_counts = (now, producers, sum(p.expired for p in states))
        return self._producer_counts[1], self._producer_counts[2]

    def metrics_text(self) -> str:
        runtime, transport = self.runtime, self.runtime.transport
        producers, expired = self.producer_counts()
        values = {
            **{f"raftline_{k}_total": v for k, v in self.counters.items()},
            **{f"raftline_raft_{k}_total": v for k, v in runtime.stats.items()},
            "raftline_frames_sent_total": transport.frames_sent,
            "raftline_frames_received_total": transport.frames_received,
            "raftline_frames_dropped_total": transport.frames_dropped,
            "raftline_bad_frames_total": transport.bad_frames,
            "raftline_peers_gone_total": transport.peers_gone,
            # silence after which a peer counts as gone (the quiet groups it leads are woken):
            # widened while this node's loop stalls
            "raftline_link_dead_after_seconds": round(transport.dead_after.seconds(), 3),
            "raftline_raft_groups": len(runtime.groups),
            "raftline_raft_groups_quiet": runtime.quiet_groups(),
            "raftline_raft_groups_leading": runtime.leading_groups(),
            "raftline_ready": int(self.ready()),
            "raftline_idempotent_producers": producers,
            "raftline_producers_expired_total": expired,
            **(self.tiering.metrics() if self.tiering is not None else {}),
            **COLLECTOR.metrics(),  # of the whole process
        }
        lines = []
        for name, value in values.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# TYPE {name} {kind}", f'{name}{{node="{self.node_id}"}} {value}']
        lines += runtime.stage_times.metrics_lines(self.node_id)
        lines += self.coordinator.metrics_lines()
        lines += self.transactions.metrics_lines()
        lines += self.queues.metrics_lines()
        return "\n".join(lines) + "\n"
