"""The coordinator duties of a node: group calls on the shards it leads, member sessions,
members' fetch positions, checkpoints, and the committed-offset gauges.

Owns the leader-local (never replicated) view of each shard it leads: when each member was last
heard from, where each member's last group fetch ended, which generation each member was last
told. All of it is dropped when the shard's leadership or term changes: a new leader gives every
member a fresh session, and members continue from the committed offsets (at-least-once).
Everything that answers a call about generations, assignments or committed offsets comes from
the shard's applied state, after a read barrier or from the result of the call's own command.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftline.node.coordinator.replica import CoordinatorReplica
from raftline.node.coordinator.state import (
    CoordinatorState,
    Group,
    GroupError,
    check_commit,
    check_group,
    check_member_id,
)
from raftline.node.errors import BrokerError
from raftline.node.shard import ShardLeadership

if TYPE_CHECKING:
    from raftline.node.broker import Broker

log = logging.getLogger(__name__)

GROUPS_TOPIC = "__groups"  # the internal topic whose partitions are the coordinator shards
SHARDS = 4
GROUPS_TOPIC_CONFIG = {"segment.bytes": str(1 << 20), "retention.ms": "-1"}
SESSION_CHECK_S = 0.1  # how often a leader looks for silent members
REVOKE_WAIT_S = 1.5  # how long a join waits for the members it takes partitions from
REFRESH_S = 1.0  # partition counts and high watermarks of the groups a leader serves
MAX_WAIT_MS = 30_000


def shard_of(group: str, shards: int) -> int:
    """The shard holding `group`: stable for a given shard count (CRC-32 of the name)."""
    return zlib.crc32(group.encode()) % shards


@dataclass
class _Leading:
    """What the leader of one shard keeps in memory during one term."""

    term: int
    seen: dict[tuple[str, str], float] = field(default_factory=dict)  # (group, member) -> time
    told: dict[tuple[str, str], int] = field(default_factory=dict)  # generation last answered
    # (group, member) -> partition -> (next offset, generation of the fetch that read it)
    positions: dict[tuple[str, str], dict[tuple[str, int], tuple[int, int]]] = field(
        default_factory=dict
    )
    expiring: set[tuple[str, str]] = field(default_factory=set)
    # group -> members a pending join takes partitions from -> whether each has been told
    revoking: dict[str, dict[str, bool]] = field(default_factory=dict)
    revoked: dict[str, asyncio.Event] = field(default_factory=dict)  # all of them came back


class Coordinator:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.shards: ShardLeadership[CoordinatorReplica, _Leading] = ShardLeadership(_Leading)
        self.watermarks: dict[tuple[str, int], int] = {}  # high watermarks (gauges)
        self._refreshed = 0.0
        self._background: set[asyncio.Future[None]] = set()

    @property
    def _timeout(self) -> float:
        return self.broker.config.request_timeout_s

    @property
    def election_s(self) -> float:
        config = self.broker.config
        return config.tick_ms * config.election_ticks * 2 / 1000

    # replicas come and go with the metadata

    @property
    def replicas(self) -> dict[str, CoordinatorReplica]:
        """This node's replicas of the shards, by Raft group name."""
        return self.shards.replicas

    def new_replica(self, shard: str) -> CoordinatorReplica:
        return self.shards.add(shard, CoordinatorReplica(self.broker.runtime, shard))

    def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        self.shards.drop_all()

    def drop_replica(self, shard: str) -> None:
        self.shards.drop(shard)

    def _lead(self, shard: str) -> tuple[CoordinatorReplica, _Leading]:
        return self.shards.lead(shard)

    # the calls, run on the shard's leader (Router.on_leader_of brings them here)

    async def handle(self, method: str, args: dict[str, Any]) -> Any:
        handler = getattr(self, f"_call_{method.removeprefix('group_')}", None)
        if handler is None or not isinstance(args, dict):
            raise BrokerError("invalid_request", f"unknown group call {method!r}")
        try:
            return await handler(str(args.get("shard")), args)
        except GroupError as exc:
            raise BrokerError(exc.code, exc.message) from None

    async def _current(self, shard: str) -> tuple[CoordinatorReplica, _Leading]:
        replica, _ = self._lead(shard)
        await replica.read_barrier(self.election_s)
        return self._lead(shard)

    def _group(self, replica: CoordinatorReplica, args: dict[str, Any]) -> Group:
        name = check_group(args.get("group"))
        group = replica.state.groups.get(name)
        if group is None:
            raise BrokerError("unknown_group", f"unknown group {name!r}")
        return group

    def _member(self, replica: CoordinatorReplica, args: dict[str, Any]) -> tuple[Group, str]:
        name = check_group(args.get("group"))
        member = check_member_id(args.get("member_id"))
        group = replica.state.groups.get(name)
        if group is None or member not in group.members:
            raise BrokerError(
                "unknown_member", f"{member!r} is not a member of group {name!r}; join again"
            )
        return group, member

    async def _propose(self, shard: str, command: dict[str, Any]) -> dict[str, Any]:
        replica, _ = self._lead(shard)
        command = {**command, "at_ms": self.broker.clock.now_ms()}
        return await replica.propose(command, self._timeout)

    async def _call_join(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        name = check_group(args.get("group"))
        member_id = args.get("member_id") or f"member-{uuid.uuid4()}"
        check_member_id(member_id)
        topics = args.get("topics")
        if not isinstance(topics, list) or not topics:
            raise BrokerError("invalid_request", "topics must be a non-empty list of topic names")
        counts = {}
        for topic in topics:
            if not isinstance(topic, str):
                raise BrokerError("invalid_request", "topics must be a list of topic names")
            counts[topic] = await self.broker.topic_partition_count(topic)
        command = {
            "op": "join",
            "group": name,
            "member_id": member_id,
            "topics": topics,
            "partitions": counts,
        }
        for key in ("session_timeout_ms", "auto_offset_reset", "client", "assignor"):
            if args.get(key) is not None:
                command[key] = args[key]
        replica, _ = self._lead(shard)
        before = replica.state.groups.get(name)
        generation = before.generation if before is not None else 0
        if before is not None:
            await self._revoke_first(shard, before, command)
        result = await self._propose(shard, command)
        if result["generation"] != generation:
            self._log_generation(shard, name, f"{member_id} joined")
        _, leading = self._lead(shard)
        leading.seen[(name, member_id)] = time.monotonic()
        leading.expiring.discard((name, member_id))
        # A join (re)starts a consumer: it reads from the committed offsets, not from where an
        # earlier incarnation with the same id got to (it may have died before processing).
        leading.positions.pop((name, member_id), None)
        return self._tell(shard, name, member_id, result)

    async def _revoke_first(self, shard: str, group: Group, join: dict[str, Any]) -> None:
        """Before a join takes partitions from live members, tell them (rebalancing: true in
        their heartbeat and fetch answers, their generation still current) and wait until each
        has come back once, so they can commit what they processed while their commits still
        count (API.md fences commits by generation); REVOKE_WAIT_S at most, for a member that
        went silent. A join that moves nothing from anyone goes ahead at once."""
        trial = CoordinatorState()
        trial.groups[group.name] = copy.deepcopy(group)
        try:
            trial.apply(join)
        except GroupError:
            return  # the join itself is refused: applying it will say why
        after = trial.groups[group.name].assignment
        losing = {
            m: False
            for m, held in group.assignment.items()
            if m != join["member_id"] and set(held) - set(after.get(m, ()))
        }
        _, leading = self._lead(shard)
        if not losing or group.name in leading.revoking:
            return
        leading.revoking[group.name] = losing
        done = leading.revoked[group.name] = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), REVOKE_WAIT_S)
        finally:
            leading.revoking.pop(group.name, None)
            leading.revoked.pop(group.name, None)

    def _revoking(self, leading: _Leading, name: str, member_id: str) -> bool:
        """Whether `member_id` must give partitions up; its second answer since it was told
        counts as having done so (it committed in between)."""
        losing = leading.revoking.get(name)
        if losing is None or member_id not in losing:
            return False
        if not losing[member_id]:
            losing[member_id] = True
            return True
        del losing[member_id]
        if not losing:
            leading.revoked[name].set()
        return False

    def _tell(
        self, shard: str, name: str, member_id: str, result: dict[str, Any]
    ) -> dict[str, Any]:
        """Answer a member with its assignment of the current generation; remember it was told."""
        replica, leading = self._lead(shard)
        group = replica.state.groups.get(name)
        generation = result["generation"]
        leading.told[(name, member_id)] = generation
        rebalancing = self._revoking(leading, name, member_id) or (
            group is not None
            and any(leading.told.get((name, m)) != group.generation for m in group.members)
        )
        return {
            "member_id": member_id,
            "generation": generation,
            "assignment": [{"topic": t, "partition": p} for t, p in result["assignment"]],
            "rebalancing": rebalancing,
        }

    async def _call_heartbeat(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, leading = await self._current(shard)
        group, member = self._member(replica, args)
        leading.seen[(group.name, member)] = time.monotonic()
        view = {
            "generation": group.generation,
            "assignment": [list(tp) for tp in group.assignment.get(member, [])],
        }
        if args.get("watch"):  # a group fetch's keep-alive: the member is not told anything,
            # but its long-poll ends when it must give partitions up
            return {**view, "revoke": self._revoking(leading, group.name, member)}
        return self._tell(shard, group.name, member, view)

    async def _call_poll(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        """Where a member's group fetch reads from: per assigned partition, the member's last
        position, else the committed offset, else its auto_offset_reset."""
        replica, leading = await self._current(shard)
        group, member = self._member(replica, args)
        key = (group.name, member)
        leading.seen[key] = time.monotonic()
        positions = leading.positions.get(key, {})
        info = group.members[member]
        plan = []
        for tp in group.assignment.get(member, []):
            start: int | str = group.offsets.get(tp, info.auto_offset_reset)
            position = positions.get(tp)
            # A position counts only if the member held the partition since it was read.
            if position is not None and group.owned_since.get(tp, position[1] + 1) <= position[1]:
                start = position[0]
            plan.append([tp[0], tp[1], start])
        answer = self._tell(
            shard,
            group.name,
            member,
            {
                "generation": group.generation,
                "assignment": [list(tp) for tp in group.assignment.get(member, [])],
            },
        )
        return {
            **answer,
            "plan": plan,
            "auto_offset_reset": info.auto_offset_reset,
            "session_timeout_ms": info.session_timeout_ms,
        }

    async def _call_advance(self, shard: str, args: dict[str, Any]) -> None:
        """A member's group fetch ended: its next one goes on from these positions (partitions
        it still holds only)."""
        replica, leading = self._lead(shard)
        group, member = self._member(replica, args)
        key = (group.name, member)
        leading.seen[key] = time.monotonic()
        held = set(group.assignment.get(member, []))
        positions = leading.positions.setdefault(key, {})
        generation = int(args.get("generation", -1))
        for topic, partition, offset in args.get("positions", []):
            tp = (str(topic), int(partition))
            if tp in held:
                positions[tp] = (int(offset), generation)
        for tp in [tp for tp in positions if tp not in held]:
            del positions[tp]

    async def _call_commit(self, shard: str, args: dict[str, Any]) -> None:
        replica, leading = self._lead(shard)
        group, member = self._member(replica, args)
        generation = args.get("generation")
        offsets = args.get("offsets")
        if type(generation) is not int or not isinstance(offsets, list):
            raise BrokerError("invalid_request", "a commit needs a generation and offsets")
        # Offsets past the high watermark (or of unknown partitions) are refused before
        # anything is proposed; fencing is decided by the state machine itself.
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for item in offsets:
            if not isinstance(item, list) or len(item) != 3:
                raise BrokerError("invalid_request", f"bad offset {item!r}")
            topic, partition, offset = item
            if type(partition) is not int or type(offset) is not int or offset < 0:
                raise BrokerError("invalid_request", f"bad offset {item!r}")
            by_topic.setdefault(str(topic), []).append((partition, offset))
        for topic, items in by_topic.items():
            marks = await self.broker.partition_offsets(topic, [p for p, _ in items])
            for partition, offset in items:
                high = marks[partition][1]
                if offset > high:
                    raise BrokerError(
                        "offset_out_of_range",
                        f"offset {offset} of {topic}/{partition} is past the high watermark {high}",
                    )
        leading.seen[(group.name, member)] = time.monotonic()
        command = {
            "op": "commit",
            "group": group.name,
            "member_id": member,
            "generation": generation,
            "offsets": offsets,
        }
        await self._propose(shard, command)

    async def _call_check_commit(self, shard: str, args: dict[str, Any]) -> None:
        """KIP-447: would `member_id` in `generation` be allowed to commit `offsets` now (the
        transaction coordinator asks before it takes a transaction's offsets)?"""
        replica, _ = await self._current(shard)
        check_commit(self._group(replica, args), args)

    async def _call_leave(self, shard: str, args: dict[str, Any]) -> None:
        replica, leading = self._lead(shard)
        group, member = self._member(replica, args)
        await self._propose(shard, {"op": "leave", "group": group.name, "member_id": member})
        self._log_generation(shard, group.name, f"{member} left")
        self._forget(leading, group.name, member)

    def _log_generation(self, shard: str, name: str, why: str) -> None:
        """Rare, and what a post-mortem of a rebalance needs first: who holds what, when."""
        replica = self.shards.replicas.get(shard)
        group = replica.state.groups.get(name) if replica is not None else None
        if group is not None:
            holds = {m: [f"{t}/{p}" for t, p in held] for m, held in group.assignment.items()}
            log.info("group %s generation %d (%s): %s", name, group.generation, why, holds)

    @staticmethod
    def _forget(leading: _Leading, group: str, member: str) -> None:
        key = (group, member)
        leading.seen.pop(key, None)
        leading.told.pop(key, None)
        leading.positions.pop(key, None)
        leading.expiring.discard(key)

    async def _offsets_view(self, group: Group) -> list[dict[str, Any]]:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(group.offsets):
            by_topic.setdefault(topic, []).append(partition)
        out = []
        for topic, partitions in by_topic.items():
            try:
                marks = await self.broker.partition_offsets(topic, partitions)
            except BrokerError:
                marks = {}
            for partition in partitions:
                offset = group.offsets[(topic, partition)]
                high = marks.get(partition, (None, None))[1]
                if high is not None:
                    self.watermarks[(topic, partition)] = high
                out.append(
                    {
                        "topic": topic,
                        "partition": partition,
                        "offset": offset,
                        "high_watermark": high,
                        "lag": None if high is None else max(high - offset, 0),
                    }
                )
        return out

    async def _call_offsets(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, _ = await self._current(shard)
        return {"offsets": await self._offsets_view(self._group(replica, args))}

    async def _call_describe(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, leading = await self._current(shard)
        group = self._group(replica, args)
        offsets = await self._offsets_view(group)
        replica, leading = self._lead(shard)
        return {
            "group": group.name,
            "state": self._state_of(leading, group),
            "generation": group.generation,
            "assignor": group.assignor,
            "members": [
                {
                    **member.to_json(),
                    "assignment": [
                        {"topic": t, "partition": p} for t, p in group.assignment.get(m, [])
                    ],
                }
                for m, member in sorted(group.members.items())
            ],
            "offsets": offsets,
            "coordinator": {"shard": shard, "leader": self.broker.node_id},
        }

    @staticmethod
    def _state_of(leading: _Leading, group: Group) -> str:
        if not group.members:
            return "empty"
        told = leading.told
        if any(told.get((group.name, m)) != group.generation for m in group.members):
            return "rebalancing"
        return "stable"

    async def _call_list(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, leading = await self._current(shard)
        return {
            "groups": [
                {
                    "group": g.name,
                    "state": self._state_of(leading, g),
                    "members": len(g.members),
                }
                for g in replica.state.groups.values()
            ]
        }

    async def _call_txn_offsets(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        """Offsets of a committed transaction (the transaction coordinator sends them once
        the commit's markers are written; a resend changes nothing)."""
        command = {"op": "txn_offsets", "group": args.get("group"), "offsets": args.get("offsets")}
        return await self._propose(shard, command)

    async def _call_reset(self, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        replica, _ = await self._current(shard)
        name = check_group(args.get("group"))
        group = replica.state.groups.get(name)
        if group is not None and group.members:
            raise BrokerError(
                "group_not_empty",
                f"group {name!r} has {len(group.members)} members: stop them (or wait for their "
                "sessions to expire) before resetting offsets",
            )
        topic = args.get("topic")
        if not isinstance(topic, str):
            raise BrokerError("invalid_request", "reset needs a topic")
        count = await self.broker.topic_partition_count(topic)
        partitions = list(range(count))
        marks = await self.broker.partition_offsets(topic, partitions)
        to = args.get("to")
        offsets = []
        for p in partitions:
            start, high = marks[p]
            if to == "earliest":
                offset = start
            elif to == "latest":
                offset = high
            elif isinstance(to, dict) and type(to.get("offset")) is int:
                offset = to["offset"]
                if not start <= offset <= high:
                    raise BrokerError(
                        "offset_out_of_range",
                        f"offset {offset} outside [{start}, {high}] of {topic}/{p}",
                        extra={"log_start_offset": start, "high_watermark": high},
                    )
            elif isinstance(to, dict) and type(to.get("timestamp")) is int:
                offset = await self.broker.offset_for_timestamp(topic, p, to["timestamp"])
            else:
                raise BrokerError(
                    "invalid_request",
                    'to must be "earliest", "latest", {"timestamp": ms} or {"offset": n}',
                )
            offsets.append([topic, p, offset])
        await self._propose(shard, {"op": "reset", "group": name, "offsets": offsets})
        return {"offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in offsets]}

    async def _call_delete(self, shard: str, args: dict[str, Any]) -> None:
        replica, _ = await self._current(shard)
        group = self._group(replica, args)
        await self._propose(shard, {"op": "delete", "group": group.name})

    # the leader's background duties

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SESSION_CHECK_S)
            try:
                await self._round()
            except Exception:
                log.exception("coordinator round failed")

    async def _round(self) -> None:
        now = time.monotonic()
        refresh = now - self._refreshed >= REFRESH_S
        if refresh:
            self._refreshed = now
        for shard, replica in list(self.shards.replicas.items()):
            if not replica.serving:
                self.shards.leading.pop(shard, None)
                continue
            _, leading = self._lead(shard)
            for group in list(replica.state.groups.values()):
                for member_id, member in list(group.members.items()):
                    key = (group.name, member_id)
                    seen = leading.seen.setdefault(key, now)  # new leader: a fresh session
                    silent = now - seen > member.session_timeout_ms / 1000
                    if silent and key not in leading.expiring:
                        leading.expiring.add(key)
                        self._spawn(self._expire(shard, group.name, member_id))
                if refresh:
                    self._spawn(self._refresh(shard, group))
            self._spawn(replica.maybe_checkpoint(self._timeout))

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _expire(self, shard: str, group: str, member_id: str) -> None:
        try:
            replica, leading = self._lead(shard)
            member = replica.state.groups[group].members.get(member_id)
            if member is None:
                return
            command = {
                "op": "expire",
                "group": group,
                "member_id": member_id,
                "joined_ms": member.joined_ms,
            }
            await self._propose(shard, command)
            self._log_generation(shard, group, f"{member_id} expired, silent for its session")
            self._forget(leading, group, member_id)
        except (BrokerError, KeyError) as exc:
            log.debug("expiring %s of %s: %s", member_id, group, exc)
            with contextlib.suppress(BrokerError):
                self._lead(shard)[1].expiring.discard((group, member_id))

    async def _refresh(self, shard: str, group: Group) -> None:
        """Follow partition-count changes of subscribed topics; refresh the lag gauges."""
        try:
            counts = {}
            for topic in group.partitions:
                try:
                    counts[topic] = await self.broker.topic_partition_count(topic)
                except BrokerError as exc:
                    if exc.code != "unknown_topic":
                        raise
                    counts[topic] = 0
            if any(group.partitions.get(t) != n for t, n in counts.items()):
                command = {"op": "partitions", "group": group.name, "partitions": counts}
                await self._propose(shard, command)
            if group.offsets:
                await self._offsets_view(group)
        except BrokerError as exc:
            log.debug("refreshing group %s: %s", group.name, exc)

    # gauges

    def metrics_lines(self) -> list[str]:
        """Committed offset and lag per group and partition, for the groups whose shard this
        node leads (so that every group is reported by exactly one node)."""
        lines = [
            "# TYPE raftline_group_committed_offset gauge",
            "# TYPE raftline_group_lag gauge",
            "# TYPE raftline_group_members gauge",
            "# TYPE raftline_group_generation gauge",
        ]
        node = self.broker.node_id
        for replica in self.shards.replicas.values():
            if not replica.serving:
                continue
            for group in replica.state.groups.values():
                base = f'node="{node}",group="{group.name}"'
                lines.append(f"raftline_group_members{{{base}}} {len(group.members)}")
                lines.append(f"raftline_group_generation{{{base}}} {group.generation}")
                for (topic, partition), offset in sorted(group.offsets.items()):
                    labels = f'{base},topic="{topic}",partition="{partition}"'
                    lines.append(f"raftline_group_committed_offset{{{labels}}} {offset}")
                    high = self.watermarks.get((topic, partition))
                    if high is not None:
                        lines.append(f"raftline_group_lag{{{labels}}} {max(high - offset, 0)}")
        return lines
