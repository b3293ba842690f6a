"""The cluster metadata state machine replicated by the "__meta" Raft group, and replica placement.

Owns the node registry, topics, topic configs and replica sets, and the pure rules that change them;
the exchanges (rules in node/exchanges/model.py) and the expiry times of temporary topics.

Every replica applies the same JSON commands in log order with `MetadataState.apply`; a command
that breaks a rule changes nothing and yields the same MetadataError everywhere, so all replicas
stay identical. Placement runs on the controller before it proposes a topic, so apply stays pure.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from raftline.node.exchanges.model import COMMANDS as EXCHANGE_COMMANDS
from raftline.node.exchanges.model import ExchangeError, Exchanges
from raftline.tiered import topic_config as tiered_config

META_GROUP = "__meta"
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MAX_PARTITIONS = 10_000
MAX_MESSAGE_BYTES = 10 * 1024 * 1024
MAX_PRODUCER_ID_BLOCK = 10_000  # producer ids one allocate_producer_ids command hands out at most
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
COMPRESSION_TYPES = ("producer", "uncompressed", "none", "gzip", "snappy", "lz4", "zstd")
_INTEGER_CONFIGS = (
    "retention.ms",
    "retention.bytes",
    "max.message.bytes",
    "segment.bytes",
    "segment.ms",
    "delete.retention.ms",
    "min.compaction.lag.ms",
)


class MetadataError(Exception):
    """A command or request that breaks a metadata rule; `code` is one of API.md's error codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: int
    raft: str
    http: str
    rack: str | None = None


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: int  # unique per creation, so a re-created topic never reuses old replicas' data
    config: dict[str, str]
    replicas: list[list[int]]  # per partition; the first replica is the preferred leader
    # Restored from object storage (node/restore.py): per partition, the offset its local log
    # starts at (what the bucket held ends there); empty for a topic created as new.
    restored_at: tuple[int, ...] = ()
    # node -> its groups of this topic (see groups_on)
    _groups_on: dict[int, dict[str, tuple[TopicInfo, int]]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _load: tuple[Counter[int], Counter[int]] | None = field(default=None, repr=False, compare=False)

    @property
    def replication_factor(self) -> int:
        return len(self.replicas[0])

    def load(self) -> tuple[Counter[int], Counter[int]]:
        """(preferred leaders, replicas) per node among this topic's partitions, counted once
        (place_replicas adds them up for every topic at each creation)."""
        if self._load is None:
            self._load = (
                Counter(replica_set[0] for replica_set in self.replicas),
                Counter(node for replica_set in self.replicas for node in replica_set),
            )
        return self._load

    def groups_on(self, node_id: int) -> dict[str, tuple[TopicInfo, int]]:
        """Partition groups of this topic with a replica on `node_id`: group -> (topic,
        partition). Worked out once per node (a topic's replica sets never change); do not
        modify the answer."""
        groups = self._groups_on.get(node_id)
        if groups is None:
            groups = self._groups_on[node_id] = {
                self.group(p): (self, p)
                for p, replica_set in enumerate(self.replicas)
                if node_id in replica_set
            }
        return groups

    def group(self, partition: int) -> str:
        """The partition's Raft group name; `~` never occurs in topic names, so names are unique."""
        return f"{self.name}~{self.topic_id}~{partition}"


def validate_topic_config(config: Any) -> dict[str, str]:
    """Check Kafka-named topic settings; returns them as a str -> str dict."""
    if not isinstance(config, dict):
        raise MetadataError("invalid_request", "config must be an object")
    out: dict[str, str] = {}
    for key, value in config.items():
        text = str(value)
        if key in _INTEGER_CONFIGS:
            if not re.fullmatch(r"-?\d{1,19}", text):
                raise MetadataError("invalid_request", f"{key} must be an integer, got {text!r}")
            if key == "max.message.bytes" and not 0 < int(text) <= MAX_MESSAGE_BYTES:
                raise MetadataError(
                    "invalid_request", f"max.message.bytes must be 1..{MAX_MESSAGE_BYTES}"
                )
            if key == "segment.bytes" and int(text) < 1024:
                raise MetadataError("invalid_request", "segment.bytes must be at least 1024")
            if key == "segment.ms" and int(text) < 1:
                raise MetadataError("invalid_request", "segment.ms must be at least 1")
            if key in ("delete.retention.ms", "min.compaction.lag.ms") and int(text) < 0:
                raise MetadataError("invalid_request", f"{key} must be at least 0")
        elif key == "min.cleanable.dirty.ratio":
            try:
                ratio = float(text)
            except ValueError:
                ratio = -1.0
            if not 0.0 <= ratio <= 1.0:  # NaN fails too
                raise MetadataError(
                    "invalid_request", f"min.cleanable.dirty.ratio must be 0..1, got {text!r}"
                )
        elif key == "cleanup.policy":
            if text not in ("delete", "compact", "compact,delete", "delete,compact"):
                raise MetadataError("invalid_request", f"bad cleanup.policy {text!r}")
        elif key == "compression.type":
            if text not in COMPRESSION_TYPES:
                raise MetadataError("invalid_request", f"bad compression.type {text!r}")
        elif key in tiered_config.KEYS:
            pass  # checked together below: they depend on each other and on retention.*
        else:
            raise MetadataError("invalid_request", f"unknown topic config {key!r}")
        out[str(key)] = text
    if (problem := tiered_config.check(out)) is not None:
        raise MetadataError("invalid_request", problem)
    return out


def _restore_point(restore: Any, partitions: int) -> tuple[int, tuple[int, ...]]:
    """(topic id, per-partition log start) of a create_topic that restores from the bucket."""
    if not isinstance(restore, dict):
        raise MetadataError("invalid_request", "restore must be an object")
    topic_id, starts = restore.get("topic_id"), restore.get("next_offsets")
    if type(topic_id) is not int or topic_id < 1:
        raise MetadataError("invalid_request", "restore.topic_id must be a positive integer")
    if (
        not isinstance(starts, list)
        or len(starts) != partitions
        or any(type(s) is not int or s < 0 for s in starts)
    ):
        raise MetadataError(
            "invalid_request", "restore.next_offsets needs one offset >= 0 per partition"
        )
    return topic_id, tuple(starts)


def check_topic_name(name: Any) -> str:
    if not isinstance(name, str) or not TOPIC_NAME.match(name):
        raise MetadataError(
            "invalid_request", f"topic names are 1-249 of [A-Za-z0-9._-], got {name!r}"
        )
    return name


@dataclass
class MetadataState:
    cluster_id: str | None = None
    nodes: dict[int, NodeInfo] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    next_topic_id: int = 1
    next_producer_id: int = 0  # ids below were handed out (to a node's block): never again
    exchanges: Exchanges = field(default_factory=Exchanges)
    # temporary topics (request/reply) -> wall-clock ms after which the controller deletes them
    expiring: dict[str, int] = field(default_factory=dict)

    def apply(self, command: dict[str, Any]) -> dict[str, Any]:
        """Apply one command; a broken rule raises MetadataError and changes nothing."""
        op = command.get("op")
        if op in EXCHANGE_COMMANDS:
            try:
                return self.exchanges.apply(command, self.topics)
            except ExchangeError as exc:
                raise MetadataError(exc.code, exc.message) from None
        handler = getattr(self, f"_apply_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise MetadataError("invalid_request", f"unknown metadata command {op!r}")
        return handler(command)

    def apply_bytes(self, data: bytes) -> dict[str, Any]:
        try:
            command = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MetadataError("invalid_request", f"undecodable metadata command: {exc}") from exc
        if not isinstance(command, dict):
            raise MetadataError("invalid_request", "a metadata command is a JSON object")
        return self.apply(command)

    def _apply_bootstrap(self, command: dict[str, Any]) -> dict[str, Any]:
        if self.cluster_id is None:
            self.cluster_id = str(command["cluster_id"])
        return {"cluster_id": self.cluster_id}

    def _apply_register_node(self, command: dict[str, Any]) -> dict[str, Any]:
        node = command.get("node")
        if not isinstance(node, dict) or type(node.get("id")) is not int:
            raise MetadataError("invalid_request", "register_node needs a node with an integer id")
        rack = node.get("rack")
        info = NodeInfo(
            node["id"], str(node["raft"]), str(node["http"]), None if rack is None else str(rack)
        )
        self.nodes[info.id] = info
        return {"node": info.id}

    def _apply_create_topic(self, command: dict[str, Any]) -> dict[str, Any]:
        name = check_topic_name(command.get("name"))
        if name in self.topics:
            raise MetadataError("topic_exists", f"topic {name!r} already exists")
        config = validate_topic_config(command.get("config", {}))
        replicas = command.get("replicas")
        if not isinstance(replicas, list) or not 0 < len(replicas) <= MAX_PARTITIONS:
            raise MetadataError("invalid_request", f"a topic has 1..{MAX_PARTITIONS} partitions")
        factor = len(replicas[0]) if isinstance(replicas[0], list) else 0
        for replica_set in replicas:
            if (
                not isinstance(replica_set, list)
                or len(replica_set) != factor
                or factor == 0
                or len(set(replica_set)) != factor
                or any(r not in self.nodes for r in replica_set)
            ):
                raise MetadataError("invalid_request", f"bad replica set {replica_set!r}")
        expires_ms = command.get("expires_ms")
        if expires_ms is not None and type(expires_ms) is not int:
            raise MetadataError("invalid_request", "expires_ms is an integer (ms since epoch)")
        topic_id, restored_at = self.next_topic_id, ()
        restore = command.get("restore")
        if restore is not None:
            topic_id, restored_at = _restore_point(restore, len(replicas))
        topic = TopicInfo(name, topic_id, config, [list(r) for r in replicas], restored_at)
        self.topics[name] = topic
        if expires_ms is not None:
            self.expiring[name] = expires_ms
        # A restored topic keeps its id (its objects in the bucket are named by it); later ids
        # stay above it so that no re-creation of the name writes under the same one.
        self.next_topic_id = max(self.next_topic_id, topic_id) + 1
        return {"name": name, "topic_id": topic.topic_id}

    def _apply_delete_topic(self, command: dict[str, Any]) -> dict[str, Any]:
        name = command.get("name")
        if name not in self.topics:
            raise MetadataError("unknown_topic", f"unknown topic {name!r}")
        del self.topics[name]
        self.expiring.pop(name, None)
        self.exchanges.topic_deleted(name)
        return {"name": name}

    def _apply_touch_topic(self, command: dict[str, Any]) -> dict[str, Any]:
        """A temporary topic in use: it expires at `expires_ms` now (never earlier than set)."""
        name, expires_ms = command.get("name"), command.get("expires_ms")
        if name not in self.expiring:
            raise MetadataError("unknown_topic", f"no temporary topic {name!r}")
        if type(expires_ms) is not int:
            raise MetadataError("invalid_request", "expires_ms is an integer (ms since epoch)")
        self.expiring[name] = max(self.expiring[name], expires_ms)
        return {"name": name, "expires_ms": self.expiring[name]}

    def _apply_allocate_producer_ids(self, command: dict[str, Any]) -> dict[str, Any]:
        """A block of producer ids for one node to hand out. Ids only grow and every id is in
        at most one block, so an id is never reused, across controller moves and restarts
        alike (the metadata log is replayed whole)."""
        count = command.get("count")
        if type(count) is not int or not 0 < count <= MAX_PRODUCER_ID_BLOCK:
            raise MetadataError(
                "invalid_request", f"allocate 1..{MAX_PRODUCER_ID_BLOCK} producer ids"
            )
        first = self.next_producer_id
        self.next_producer_id += count
        assert self.next_producer_id > first
        return {"first": first, "count": count}

    def topic(self, name: str) -> TopicInfo:
        try:
            return self.topics[name]
        except KeyError:
            raise MetadataError("unknown_topic", f"unknown topic {name!r}") from None

    def groups_of(self, node_id: int) -> dict[str, tuple[TopicInfo, int]]:
        """Partition groups with a replica on `node_id`: group name -> (topic, partition).
        Each metadata change asks this: merging the topics' own answers keeps it from building
        every partition's group name again (a quadratic cost over a batch of topic creations)."""
        groups: dict[str, tuple[TopicInfo, int]] = {}
        for topic in self.topics.values():
            groups.update(topic.groups_on(node_id))
        return groups

    def replicas_of_group(self, group: str) -> list[int] | None:
        """The replica set of a partition's Raft group (see TopicInfo.group), or None."""
        name, _, rest = group.partition("~")
        topic_id, _, partition = rest.partition("~")
        topic = self.topics.get(name)
        if topic is None or str(topic.topic_id) != topic_id or not partition.isdigit():
            return None
        index = int(partition)
        return topic.replicas[index] if index < len(topic.replicas) else None


def place_replicas(state: MetadataState, partitions: int, factor: int) -> list[list[int]]:
    """Replica sets for a new topic, spreading replicas and preferred leaders evenly over the
    registered nodes (counting existing topics) and each set over as many racks as possible."""
    if not 0 < partitions <= MAX_PARTITIONS:
        raise MetadataError("invalid_request", f"partitions must be 1..{MAX_PARTITIONS}")
    nodes = sorted(state.nodes)
    if not 0 < factor <= len(nodes):
        raise MetadataError(
            "not_enough_replicas" if factor > 0 else "invalid_request",
            f"replication_factor {factor} needs 1..{len(nodes)} (registered nodes)",
        )
    replica_load: Counter[int] = Counter()
    leader_load: Counter[int] = Counter()
    for topic in state.topics.values():  # counted once per topic: 100 k partitions took ~0.3 s
        leaders, replicas = topic.load()
        leader_load.update(leaders)
        replica_load.update(replicas)

    def rack(node: int) -> str:
        return state.nodes[node].rack or f"node-{node}"

    placement = []
    for _ in range(partitions):
        leader = min(nodes, key=lambda n: (leader_load[n], replica_load[n], n))
        chosen = [leader]
        while len(chosen) < factor:
            used_racks = {rack(n) for n in chosen}
            chosen.append(
                min(
                    (n for n in nodes if n not in chosen),
                    key=lambda n: (
                        rack(n) in used_racks,
                        replica_load[n],
                        (n - leader) % (nodes[-1] + 1),
                    ),
                )
            )
        leader_load[leader] += 1
        replica_load.update(chosen)
        placement.append(chosen)
    return placement
