"""Group membership for the Raft core: the CONFIG entry format and the history of configurations.

Owns the encoding of voters/learners in CONFIG entries and which configuration rules an offset.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Membership:
    """Voters decide elections and commits; learners only receive the log."""

    voters: frozenset[int]
    learners: frozenset[int] = frozenset()

    @classmethod
    def of(cls, voters: Iterable[int], learners: Iterable[int] = ()) -> Membership:
        member = cls(frozenset(voters), frozenset(learners))
        if not member.voters:
            raise ValueError("a configuration needs at least one voter")
        if member.voters & member.learners:
            raise ValueError(
                f"nodes both voter and learner: {sorted(member.voters & member.learners)}"
            )
        return member

    def encode(self) -> bytes:
        doc = {"voters": sorted(self.voters), "learners": sorted(self.learners)}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Membership:
        try:
            doc = json.loads(data)
            voters, learners = doc["voters"], doc.get("learners", [])
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"malformed CONFIG entry: {data[:80]!r}") from exc
        if not all(isinstance(n, int) for n in [*voters, *learners]):
            raise ValueError(f"CONFIG entry node ids must be integers: {data[:80]!r}")
        return cls.of(voters, learners)

    def voter_changes(self, other: Membership) -> int:
        return len(self.voters ^ other.voters)


class ConfigHistory:
    """Configurations by the offset of the CONFIG entry that introduced them.

    Per the Raft thesis a configuration is in force as soon as its entry is in the log
    (committed or not), so truncating the log can revert to an older configuration.
    The base (offset of the snapshot point, or -1 for bootstrap) can never be truncated.
    """

    __slots__ = ("_indexes", "_members")

    def __init__(self, base_index: int, base: Membership) -> None:
        self._indexes: list[int] = [base_index]
        self._members: list[Membership] = [base]

    @property
    def current(self) -> Membership:
        return self._members[-1]

    @property
    def current_index(self) -> int:
        """Offset of the CONFIG entry in force (the base offset if none is in the log)."""
        return self._indexes[-1]

    def append(self, index: int, member: Membership) -> None:
        if index <= self._indexes[-1]:
            raise ValueError(f"config at offset {index} is not after {self._indexes[-1]}")
        self._indexes.append(index)
        self._members.append(member)

    def truncate_from(self, index: int) -> bool:
        """Forget configurations at offsets >= index. Returns whether the current one changed."""
        keep = max(1, bisect_right(self._indexes, index - 1))
        changed = keep < len(self._indexes)
        del self._indexes[keep:]
        del self._members[keep:]
        return changed

    def at(self, index: int) -> Membership:
        """The configuration in force at an offset (at or after the base)."""
        pos = bisect_right(self._indexes, index) - 1
        if pos < 0:
            raise ValueError(f"offset {index} is before the oldest known configuration")
        return self._members[pos]

    def compact(self, index: int) -> None:
        """The log is trimmed through `index`: older entries fold into the base."""
        pos = bisect_right(self._indexes, index) - 1
        if pos > 0:
            del self._indexes[:pos]
            del self._members[:pos]

    def reset(self, base_index: int, base: Membership) -> None:
        """A snapshot replaced the whole log."""
        self._indexes[:] = [base_index]
        self._members[:] = [base]
