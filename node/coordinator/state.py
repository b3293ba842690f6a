"""The consumer-group state machine of one coordinator shard: members, generations, assignments
and committed offsets of every group whose name hashes to the shard.

Owns `CoordinatorState.apply(command) -> result` over plain JSON data, `snapshot()` and
`restore()`. No clocks, sockets or files: the shard leader stamps what it knows (time, partition
counts, generated member ids) into a command before proposing it, and every replica applies the
committed commands in log order to equal states. A command that breaks a rule raises GroupError
and changes nothing.

Commands (`op`): join, leave, expire, commit, reset, partitions, delete, txn_offsets (offsets
a committed transaction carried: applied once its markers are written), checkpoint (the whole
shard state, written by the leader so the log can be trimmed to start with it).

Invariants (the cheap ones asserted in `_rebalance` and `_check`):
- I1 a group's generation never decreases; every change of members, subscriptions or partition
  counts that changes the assignment or the membership bumps it by one.
- I2 within a generation no partition is assigned to two members.
- I3 while a group has members, every partition of every topic a member subscribes to (of known
  partition count) is assigned to a member that subscribes to its topic.
- I4 committed offsets never decrease except through `reset`; a commit below the committed
  offset leaves it as it is.
- I5 a commit applies all of its offsets or none: it must carry the group's current generation
  and name only partitions the member is assigned in it; else the whole commit fails with
  `stale_generation` (API.md). A member never commits a partition it does not hold now.
- I6 `reset` applies only to a group without members (`group_not_empty`).
- I4 holds for `txn_offsets` too (a transaction's offsets only move committed offsets on); they
  are fenced by the producer's epoch at the transaction coordinator, not by generations.
- I7 a join that repeats a member's current subscription changes nothing (no new member, no new
  generation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from raftline.node.coordinator.assign import ASSIGNORS, TopicPartition, all_partitions, assign

GROUP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MEMBER_ID = re.compile(r"^[A-Za-z0-9._~:@-]{1,249}$")
OFFSET_RESETS = ("earliest", "latest")
MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 300_000
MAX_TOPICS_PER_MEMBER = 1_000


class GroupError(Exception):
    """A command that breaks a group rule; `code` is an API error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class Member:
    member_id: str
    topics: tuple[str, ...]  # sorted, unique
    session_timeout_ms: int
    auto_offset_reset: str
    client: str | None = None
    joined_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "topics": list(self.topics),
            "session_timeout_ms": self.session_timeout_ms,
            "auto_offset_reset": self.auto_offset_reset,
            "client": self.client,
            "joined_ms": self.joined_ms,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        return cls(
            str(data["member_id"]),
            tuple(data["topics"]),
            int(data["session_timeout_ms"]),
            str(data["auto_offset_reset"]),
            data.get("client"),
            int(data.get("joined_ms", 0)),
        )


@dataclass(slots=True)
class Group:
    name: str
    generation: int = 0
    assignor: str = "sticky"
    members: dict[str, Member] = field(default_factory=dict)
    assignment: dict[str, list[TopicPartition]] = field(default_factory=dict)
    # partition -> the generation since which its current owner holds it (commit fencing)
    owned_since: dict[TopicPartition, int] = field(default_factory=dict)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)  # subscribed topic -> count
    rebalanced_ms: int = 0

    @property
    def state(self) -> str:
        return "stable" if self.members else "empty"

    def owner_of(self, tp: TopicPartition) -> str | None:
        for member, held in self.assignment.items():
            if tp in held:
                return member
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "generation": self.generation,
            "assignor": self.assignor,
            "members": [m.to_json() for m in self.members.values()],
            "assignment": {m: [list(tp) for tp in held] for m, held in self.assignment.items()},
            "owned_since": [[t, p, g] for (t, p), g in sorted(self.owned_since.items())],
            "offsets": [[t, p, o] for (t, p), o in sorted(self.offsets.items())],
            "partitions": dict(self.partitions),
            "rebalanced_ms": self.rebalanced_ms,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Group:
        members = [Member.from_json(m) for m in data["members"]]
        return cls(
            name=str(data["name"]),
            generation=int(data["generation"]),
            assignor=str(data.get("assignor", "sticky")),
            members={m.member_id: m for m in members},
            assignment={
                m: [(str(t), int(p)) for t, p in held] for m, held in data["assignment"].items()
            },
            owned_since={(str(t), int(p)): int(g) for t, p, g in data["owned_since"]},
            offsets={(str(t), int(p)): int(o) for t, p, o in data["offsets"]},
            partitions={str(t): int(n) for t, n in data["partitions"].items()},
            rebalanced_ms=int(data.get("rebalanced_ms", 0)),
        )


@dataclass
class CoordinatorState:
    groups: dict[str, Group] = field(default_factory=dict)
    # commands applied since the last checkpoint (the leader's checkpoint cadence); not state
    applied_commands: int = field(default=0, compare=False)

    # ---- the replicated interface -----------------------------------------------------------

    def apply(self, command: dict[str, Any]) -> dict[str, Any]:
        """Apply one committed command; a broken rule raises GroupError and changes nothing."""
        op = command.get("op")
        handler = getattr(self, f"_apply_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise GroupError("invalid_request", f"unknown group command {op!r}")
        self.applied_commands += 1
        result: dict[str, Any] = handler(command)
        return result

    def snapshot(self) -> dict[str, Any]:
        return {"groups": [g.to_json() for g in sorted(self.groups.values(), key=_name)]}

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> CoordinatorState:
        state = cls()
        for data in snapshot.get("groups", []):
            group = Group.from_json(data)
            state.groups[group.name] = group
        return state

    # ---- commands ---------------------------------------------------------------------------

    def _apply_checkpoint(self, command: dict[str, Any]) -> dict[str, Any]:
        restored = CoordinatorState.restore(command["snapshot"])
        self.groups = restored.groups
        self.applied_commands = 0
        return {"groups": len(self.groups)}

    def _apply_join(self, command: dict[str, Any]) -> dict[str, Any]:
        name = check_group(command.get("group"))
        member = _member_of(command)
        counts = _counts(command.get("partitions", {}))
        missing = [t for t in member.topics if t not in counts]
        if missing:
            raise GroupError("invalid_request", f"no partition count for topics {missing}")
        assignor = command.get("assignor") or None
        if assignor is not None and assignor not in ASSIGNORS:
            raise GroupError("invalid_request", f"assignor must be one of {ASSIGNORS}")
        group = self.groups.get(name) or Group(name)
        self.groups[name] = group
        old = group.members.get(member.member_id)
        if (
            old is not None
            and (old.topics, old.session_timeout_ms, old.auto_offset_reset)
            == (member.topics, member.session_timeout_ms, member.auto_offset_reset)
            and all(group.partitions.get(t) == counts[t] for t in member.topics)
        ):
            return self._member_view(group, member.member_id)  # I7: a retry changes nothing
        if not group.members and assignor is not None:
            group.assignor = assignor
        if old is not None:
            member.joined_ms = old.joined_ms
        group.members[member.member_id] = member
        group.partitions.update({t: counts[t] for t in member.topics})
        self._rebalance(group, int(command.get("at_ms", 0)))
        return self._member_view(group, member.member_id)

    def _apply_leave(self, command: dict[str, Any]) -> dict[str, Any]:
        group = self._group(command)
        member_id = str(command.get("member_id"))
        if member_id not in group.members:
            raise GroupError("unknown_member", f"{member_id!r} is not a member of {group.name!r}")
        del group.members[member_id]
        self._rebalance(group, int(command.get("at_ms", 0)))
        return {"generation": group.generation}

    def _apply_expire(self, command: dict[str, Any]) -> dict[str, Any]:
        """Remove a member the leader saw silent; a member already gone is no error (the leader
        may propose twice), and a member that joined again since (`joined_ms` differs) stays."""
        group = self.groups.get(str(command.get("group")))
        member_id = str(command.get("member_id"))
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return {"expired": False}
        if "joined_ms" in command and int(command["joined_ms"]) != member.joined_ms:
            return {"expired": False}
        del group.members[member_id]
        self._rebalance(group, int(command.get("at_ms", 0)))
        return {"expired": True, "generation": group.generation}

    def _apply_commit(self, command: dict[str, Any]) -> dict[str, Any]:
        group = self._group(command)
        offsets = check_commit(group, command)
        # I5 checked for every offset above; only now does anything change.
        for tp, offset in offsets:
            if offset > group.offsets.get(tp, -1):  # I4
                group.offsets[tp] = offset
        return {"generation": group.generation}

    def _apply_txn_offsets(self, command: dict[str, Any]) -> dict[str, Any]:
        name = check_group(command.get("group"))
        offsets = _offsets(command.get("offsets"))
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = Group(name)
        for tp, offset in offsets:
            if offset > group.offsets.get(tp, -1):  # I4
                group.offsets[tp] = offset
        return {}

    def _apply_reset(self, command: dict[str, Any]) -> dict[str, Any]:
        name = check_group(command.get("group"))
        offsets = _offsets(command.get("offsets"))
        group = self.groups.get(name)
        if group is not None and group.members:
            raise GroupError(
                "group_not_empty",
                f"group {name!r} has {len(group.members)} members; offsets can be reset only "
                "while it has none",
            )
        if group is None:
            group = self.groups[name] = Group(name)
        for tp, offset in offsets:
            group.offsets[tp] = offset
        return {"offsets": [[t, p, o] for (t, p), o in offsets]}

    def _apply_partitions(self, command: dict[str, Any]) -> dict[str, Any]:
        """Partition counts of subscribed topics changed (a topic deleted: count 0)."""
        group = self._group(command)
        counts = _counts(command.get("partitions", {}))
        changed = {t: n for t, n in counts.items() if group.partitions.get(t) != n}
        if changed:
            group.partitions.update(changed)
            self._rebalance(group, int(command.get("at_ms", 0)))
        return {"generation": group.generation}

    def _apply_delete(self, command: dict[str, Any]) -> dict[str, Any]:
        group = self._group(command)
        if group.members:
            raise GroupError("group_not_empty", f"group {group.name!r} has members")
        del self.groups[group.name]
        return {}

    # ---- helpers ----------------------------------------------------------------------------

    def _group(self, command: dict[str, Any]) -> Group:
        name = check_group(command.get("group"))
        group = self.groups.get(name)
        if group is None:
            raise GroupError("unknown_group", f"unknown group {name!r}")
        return group

    @staticmethod
    def _member_view(group: Group, member_id: str) -> dict[str, Any]:
        return {
            "member_id": member_id,
            "generation": group.generation,
            "assignment": [list(tp) for tp in group.assignment.get(member_id, [])],
        }

    @staticmethod
    def _rebalance(group: Group, at_ms: int) -> None:
        """A new generation by the group's assignor; ownership ages restart where owners change."""
        subscriptions = {m: member.topics for m, member in group.members.items()}
        subscribed = {t for topics in subscriptions.values() for t in topics}
        group.partitions = {t: n for t, n in group.partitions.items() if t in subscribed}
        new = assign(group.assignor, subscriptions, group.partitions, group.assignment)
        group.generation += 1  # I1
        old = {tp: m for m, held in group.assignment.items() for tp in held}
        owner = {tp: m for m, held in new.items() for tp in held}
        since = {}
        for tp, member in owner.items():
            kept = old.get(tp) == member
            since[tp] = group.owned_since.get(tp, group.generation) if kept else group.generation
        group.assignment = {m: held for m, held in new.items() if m in group.members}
        group.owned_since = since
        group.rebalanced_ms = at_ms
        _check(group)


def check_commit(group: Group, command: dict[str, Any]) -> list[tuple[TopicPartition, int]]:
    """The offsets of a commit by `member_id` in `generation` (I5: the current generation, and
    partitions the member holds now), or GroupError. Also fences a transaction's offsets that
    name their member and generation (KIP-447)."""
    member_id = str(command.get("member_id"))
    generation = command.get("generation")
    if type(generation) is not int:
        raise GroupError("invalid_request", "generation must be an integer")
    offsets = _offsets(command.get("offsets"))
    if member_id not in group.members:
        raise GroupError("unknown_member", f"{member_id!r} is not a member of {group.name!r}")
    if generation != group.generation:
        raise GroupError(
            "stale_generation",
            f"generation {generation} is not the current generation of {group.name!r} "
            f"({group.generation})",
        )
    held = set(group.assignment.get(member_id, ()))
    for tp, _ in offsets:
        if tp not in held:
            raise GroupError(
                "stale_generation",
                f"{member_id!r} is not assigned {tp[0]}/{tp[1]} in generation {generation}",
            )
    return offsets


def _check(group: Group) -> None:
    """I2 and I3 after every rebalance (cheap: one pass over the assignment)."""
    seen: set[TopicPartition] = set()
    for member, held in group.assignment.items():
        topics = set(group.members[member].topics)
        for tp in held:
            assert tp not in seen, f"{tp} assigned twice in generation {group.generation}"
            assert tp[0] in topics, f"{tp} assigned to {member}, not subscribed"
            seen.add(tp)
    subscriptions = {m: member.topics for m, member in group.members.items()}
    assert seen == set(all_partitions(subscriptions, group.partitions)), "partition unassigned"


def _name(group: Group) -> str:
    return group.name


def check_group(name: Any) -> str:
    if not isinstance(name, str) or not GROUP_NAME.match(name):
        raise GroupError(
            "invalid_request", f"group names are 1-249 of [A-Za-z0-9._-], got {name!r}"
        )
    return name


def check_member_id(member_id: Any) -> str:
    if not isinstance(member_id, str) or not MEMBER_ID.match(member_id):
        raise GroupError(
            "invalid_request", f"member ids are 1-249 of [A-Za-z0-9._~:@-], got {member_id!r}"
        )
    return member_id


def _member_of(command: dict[str, Any]) -> Member:
    member_id = check_member_id(command.get("member_id"))
    topics = command.get("topics")
    if (
        not isinstance(topics, list)
        or not 0 < len(topics) <= MAX_TOPICS_PER_MEMBER
        or not all(isinstance(t, str) and t for t in topics)
    ):
        raise GroupError("invalid_request", "topics must be a non-empty list of topic names")
    timeout = command.get("session_timeout_ms", 10_000)
    if type(timeout) is not int or not MIN_SESSION_TIMEOUT_MS <= timeout <= MAX_SESSION_TIMEOUT_MS:
        raise GroupError(
            "invalid_request",
            f"session_timeout_ms must be {MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS}",
        )
    reset = command.get("auto_offset_reset", "latest")
    if reset not in OFFSET_RESETS:
        raise GroupError("invalid_request", f"auto_offset_reset must be one of {OFFSET_RESETS}")
    client = command.get("client")
    return Member(
        member_id,
        tuple(sorted(set(topics))),
        timeout,
        reset,
        None if client is None else str(client),
        int(command.get("at_ms", 0)),
    )


def _counts(data: Any) -> dict[str, int]:
    if not isinstance(data, dict) or not all(
        isinstance(t, str) and type(n) is int and n >= 0 for t, n in data.items()
    ):
        raise GroupError("invalid_request", "partitions must map topic names to counts")
    return dict(data)


def _offsets(data: Any) -> list[tuple[TopicPartition, int]]:
    """[[topic, partition, offset], ...] checked; a partition named twice is an error."""
    if not isinstance(data, list):
        raise GroupError("invalid_request", "offsets must be a list")
    out: list[tuple[TopicPartition, int]] = []
    seen: set[TopicPartition] = set()
    for item in data:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 3
            or not isinstance(item[0], str)
            or type(item[1]) is not int
            or type(item[2]) is not int
        ):
            raise GroupError("invalid_request", f"bad offset entry {item!r}")
        topic, partition, offset = item
        if partition < 0 or offset < 0:
            raise GroupError("invalid_request", f"negative partition or offset in {item!r}")
        if (topic, partition) in seen:
            raise GroupError("invalid_request", f"{topic}/{partition} named twice")
        seen.add((topic, partition))
        out.append(((topic, partition), offset))
    return out
