"""Linearizability checking of metadata histories: Wing-Gong search with Lowe's memoisation.

Owns the `Model` interface, the register and topic-metadata models, and the per-key search.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from raftline.chaos.history import Completed, Op, client_ops, pair

Verdict = Literal["ok", "illegal", "unknown"]


class _Unknown:
    """The output of an operation whose completion is indeterminate (info or never returned)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


@dataclass(frozen=True)
class Operation:
    """One operation for the search: closed interval [call, ret] with its input and output."""

    client: int | str
    key: Hashable
    input: Hashable
    output: Any
    call: float
    ret: float
    index: int = -1


class Model(Protocol):
    """A sequential specification; states must be hashable and immutable."""

    def init(self) -> Hashable: ...

    def step(self, state: Hashable, input: Hashable, output: Any) -> tuple[bool, Hashable]: ...


class RegisterModel:
    """A read/write/compare-and-set register starting at None.

    Inputs: ("read",), ("write", v), ("cas", old, new). Outputs: read -> value; write -> None;
    cas -> True/False.
    """

    def init(self) -> Hashable:
        return None

    def step(self, state: Hashable, input: Hashable, output: Any) -> tuple[bool, Hashable]:
        match input:
            case ("read",):
                return (output is UNKNOWN or output == state), state
            case ("write", value):
                return True, value
            case ("cas", old, new):
                if output is UNKNOWN:
                    return True, new if state == old else state
                return (state == old) == bool(output), new if state == old else state
        raise ValueError(f"register model: unknown input {input!r}")


class TopicModel:
    """One topic name's metadata: absent (None) or its partition count.

    Inputs: ("create", partitions) -> "created" | "exists"; ("delete",) -> "deleted" |
    "unknown_topic"; ("describe",) -> partition count | "unknown_topic".
    """

    def init(self) -> Hashable:
        return None

    def step(self, state: Hashable, input: Hashable, output: Any) -> tuple[bool, Hashable]:
        absent = state is None
        match input:
            case ("create", partitions):
                legal = output is UNKNOWN or output == ("created" if absent else "exists")
                return legal, partitions if absent else state
            case ("delete",):
                legal = output is UNKNOWN or output == (
                    "deleted" if not absent else "unknown_topic"
                )
                return legal, None
            case ("describe",):
                legal = output is UNKNOWN or output == ("unknown_topic" if absent else state)
                return legal, state
        raise ValueError(f"topic model: unknown input {input!r}")


@dataclass
class PartitionResult:
    key: Hashable
    verdict: Verdict
    operations: int
    # On "illegal": the longest prefix the search could linearize, and the ops it could not place.
    longest_prefix: list[int] = field(default_factory=list)
    stuck_on: list[int] = field(default_factory=list)


def _entries(ops: list[Operation]) -> list[tuple[float, int, int]]:
    # Calls sort before returns at equal times, which makes the intervals closed.
    events = [(op.call, 0, i) for i, op in enumerate(ops)]
    events += [(op.ret, 1, i) for i, op in enumerate(ops)]
    return sorted(events)


def check_partition(
    model: Model, key: Hashable, ops: list[Operation], deadline: float = math.inf
) -> PartitionResult:
    """Decides whether one key's operations are linearizable (Wing & Gong, Lowe's cache)."""
    events = _entries(ops)
    n = len(events)
    if not n:
        return PartitionResult(key, "ok", 0)
    # A doubly linked list over the events, with a sentinel head at position n.
    head = n
    nxt = [*range(1, n), head, 0]
    prv = [head, *range(n - 1), n - 1]
    ret_pos = {i: p for p, (_, kind, i) in enumerate(events) if kind == 1}

    def lift(call: int) -> None:
        for p in (call, ret_pos[events[call][2]]):
            nxt[prv[p]], prv[nxt[p]] = nxt[p], prv[p]

    def unlift(call: int) -> None:
        for p in (ret_pos[events[call][2]], call):
            nxt[prv[p]], prv[nxt[p]] = p, p

    state: Hashable = model.init()
    linearized = 0
    seen: set[tuple[int, Hashable]] = set()
    stack: list[tuple[int, Hashable]] = []
    longest: list[int] = []
    cursor = nxt[head]
    steps = 0
    while nxt[head] != head:
        steps += 1
        if steps % 4096 == 0 and time.monotonic() > deadline:
            return PartitionResult(key, "unknown", len(ops))
        _, kind, i = events[cursor]
        if kind == 0:
            op = ops[i]
            legal, new_state = model.step(state, op.input, op.output)
            candidate = (linearized | (1 << i), new_state)
            if legal and candidate not in seen:
                seen.add(candidate)
                stack.append((cursor, state))
                state, linearized = new_state, candidate[0]
                lift(cursor)
                cursor = nxt[head]
            else:
                cursor = nxt[cursor]
            continue
        # A pending operation returns here: nothing later may go first, so undo the last choice.
        if len(stack) > len(longest):
            longest = [ops[events[p][2]].index for p, _ in stack]
        if not stack:
            pending = []
            p = nxt[head]
            while p != head and len(pending) < 8:
                if events[p][1] == 0:
                    pending.append(ops[events[p][2]].index)
                p = nxt[p]
            return PartitionResult(key, "illegal", len(ops), longest, pending)
        cursor, state = stack.pop()
        linearized &= ~(1 << events[cursor][2])
        unlift(cursor)
        cursor = nxt[cursor]
    return PartitionResult(key, "ok", len(ops))


def check_operations(
    model: Model, ops: Iterable[Operation], timeout_s: float = 10.0
) -> dict[str, Any]:
    """P-compositional check: each key is checked on its own; one illegal key fails the history."""
    by_key: dict[Hashable, list[Operation]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    deadline = time.monotonic() + timeout_s
    results = [
        check_partition(model, key, by_key[key], deadline) for key in sorted(by_key, key=str)
    ]
    verdicts = {r.verdict for r in results}
    verdict: Verdict = (
        "illegal" if "illegal" in verdicts else "unknown" if "unknown" in verdicts else "ok"
    )
    return {
        "valid": verdict == "ok",
        "verdict": verdict,
        "keys": len(results),
        "failures": [
            {
                "key": r.key,
                "verdict": r.verdict,
                "longest_prefix": r.longest_prefix,
                "stuck_on": r.stuck_on,
            }
            for r in results
            if r.verdict != "ok"
        ],
    }


# Error codes that are definite answers about the topic, not failures to act (API.md).
_TOPIC_ANSWERS = {"topic_exists": "exists", "unknown_topic": "unknown_topic"}


def topic_operation(op: Completed) -> Operation | None:
    """Maps a recorded topic-metadata op to the search's form; None for ops that had no effect.

    History shape: f in create|delete|describe, invoke value {"topic", "partitions"?}; an ok
    completion's value holds "result" ("created", "deleted" or the partition count).
    """
    inputs: dict[str, Callable[[], Hashable]] = {
        "create": lambda: ("create", op.invoke.value["partitions"]),
        "delete": lambda: ("delete",),
        "describe": lambda: ("describe",),
    }
    if op.invoke.f not in inputs:
        return None
    topic = op.invoke.value["topic"]
    if op.type == "ok":
        output = op.complete.value["result"] if op.complete else UNKNOWN
    elif op.type == "fail" and op.complete and op.complete.error in _TOPIC_ANSWERS:
        output = _TOPIC_ANSWERS[op.complete.error]
    elif op.type == "fail" or op.invoke.f == "describe":
        return None  # a definite failure had no effect; an unanswered read constrains nothing
    else:
        output = UNKNOWN
    end = math.inf if output is UNKNOWN else op.end
    return Operation(
        op.invoke.process, topic, inputs[op.invoke.f](), output, op.start, end, op.invoke.index
    )


def check_topics(ops: Iterable[Op], timeout_s: float = 10.0) -> dict[str, Any]:
    """Checks the create/delete/describe operations of a history against `TopicModel`."""
    mapped = (topic_operation(p) for p in pair(client_ops(ops)))
    return check_operations(TopicModel(), (m for m in mapped if m is not None), timeout_s)
