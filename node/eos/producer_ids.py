"""Producer id allocation: one replicated counter handing out ranges of ids, never reused.

Owns the next free producer id and the blocks a transaction coordinator shard draws ids from.
Invariants: every id handed out (by allocate or from a block) is handed out once, ids only grow,
and a restored snapshot continues after the last id handed out before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_PRODUCER_ID = 2**63 - 1


class ProducerIdsExhausted(RuntimeError):
    """No producer id is left (in the allocator, or in a coordinator shard's blocks)."""


class ProducerIdAllocator:
    """The cluster-wide allocator (apply it from one Raft group's log, e.g. the metadata's)."""

    def __init__(self, next_id: int = 0) -> None:
        self.next_id = next_id

    def allocate(self, count: int = 1) -> range:
        if count < 1:
            raise ValueError(f"allocate at least one producer id, not {count}")
        if self.next_id + count - 1 > MAX_PRODUCER_ID:
            raise ProducerIdsExhausted("producer ids exhausted")
        ids = range(self.next_id, self.next_id + count)
        self.next_id += count
        return ids

    def apply(self, command: dict[str, Any]) -> dict[str, int]:
        """{"type": "allocate", "count": n} -> {"first": id, "count": n}."""
        if command.get("type") != "allocate":
            raise ValueError(f"unknown producer id command {command.get('type')!r}")
        ids = self.allocate(int(command.get("count", 1)))
        return {"first": ids.start, "count": len(ids)}

    def snapshot(self) -> dict[str, int]:
        return {"next_id": self.next_id}

    @classmethod
    def restore(cls, snapshot: dict[str, int]) -> ProducerIdAllocator:
        return cls(snapshot["next_id"])


@dataclass(slots=True)
class IdBlocks:
    """Ranges of ids the allocator gave one consumer, drawn in order."""

    ranges: list[list[int]] = field(default_factory=list)  # [first, end) pairs, ascending
    end: int = 0  # one past the last id of every block ever added, used up or not

    def add(self, first: int, count: int) -> None:
        if count < 1:
            raise ValueError("an empty block of producer ids")
        if first < self.end:
            raise ValueError(f"block at {first} overlaps or precedes an earlier one")
        self.ranges.append([first, first + count])
        self.end = first + count

    def take(self) -> int | None:
        """The next id, or None when the blocks are used up (ask the allocator for more)."""
        while self.ranges:
            block = self.ranges[0]
            if block[0] < block[1]:
                block[0] += 1
                return block[0] - 1
            del self.ranges[0]
        return None

    def remaining(self) -> int:
        return sum(end - first for first, end in self.ranges)

    def snapshot(self) -> dict[str, Any]:
        return {"ranges": [list(r) for r in self.ranges], "end": self.end}

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> IdBlocks:
        return cls([list(r) for r in snapshot["ranges"]], snapshot["end"])
