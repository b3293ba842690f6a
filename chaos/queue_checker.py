"""Safety checker for produce/consume histories, modelled on Jepsen's Kafka workload checker.

Owns the per-partition version order inferred from acks and polls, and every queue anomaly in it.

History shape (one key = one topic-partition, keys are strings):
- send:  invoke {"key", "value"}; ok adds "offset". fail = definitely not written; info = unknown.
- poll:  invoke {"key", "offset", "final"?}; ok adds "messages": [[offset, value], ...] and
  "next_offset". Polls marked "final" are the reads from the earliest offset after faults healed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from raftline.chaos.history import Completed, HistoryError, Op, client_ops, pair

# Every anomaly type the checker can name; all of them fail a test unless explicitly allowed.
ANOMALY_TYPES: tuple[str, ...] = (
    "lost-write",  # an acknowledged value below the read frontier that no one ever read
    "unseen",  # an acknowledged value that the final reads never returned
    "duplicate",  # one value at more than one offset of a partition
    "garbage-read",  # a value read that no one ever sent to that partition
    "aborted-read",  # a value read whose every send definitely failed
    "inconsistent-offsets",  # two different values read or acknowledged at one offset
    "int-poll-skip",  # one poll jumped over committed values
    "int-nonmonotonic-poll",  # one poll went backwards or repeated an offset
    "poll-skip",  # a consumer's next poll skipped values after its previous one
    "nonmonotonic-poll",  # a consumer's next poll went backwards
    "nonmonotonic-send",  # a producer's later send landed at or before its earlier one
    "vanished-read",  # a value read earlier that the final reads no longer have at its offset
)
# Bounds the evidence kept per anomaly type so a broken run still yields a readable result.
MAX_EXAMPLES = 50


@dataclass(frozen=True)
class Message:
    key: str
    offset: int
    value: Hashable


@dataclass
class VersionOrder:
    """One partition's log as far as the history reveals it: offset -> values seen there."""

    values_at: dict[int, set[Hashable]] = field(default_factory=lambda: defaultdict(set))

    def add(self, offset: int, value: Hashable) -> None:
        self.values_at[offset].add(value)

    def dense_index(self) -> dict[int, int]:
        # Unobserved offsets are dropped (as Jepsen does for transaction markers): only the order
        # among observed offsets matters for skips.
        return {offset: i for i, offset in enumerate(sorted(self.values_at))}

    def offsets_of(self) -> dict[Hashable, list[int]]:
        offsets: dict[Hashable, list[int]] = defaultdict(list)
        for offset in sorted(self.values_at):
            for value in self.values_at[offset]:
                offsets[value].append(offset)
        return offsets


@dataclass
class Anomalies:
    found: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, kind: str, **evidence: Any) -> None:
        self.counts[kind] += 1
        if len(self.found[kind]) < MAX_EXAMPLES:
            self.found[kind].append(evidence)


def _hashable(value: Any) -> Hashable:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        raise HistoryError(f"message values must be scalars, got {value!r}")
    return value


def _field(op: Completed, name: str) -> Any:
    value = op.value
    if not isinstance(value, dict) or name not in value:
        raise HistoryError(f"{op.invoke.f} op {op.invoke.index} lacks {name!r}: {value!r}")
    return value[name]


def _polled(op: Completed) -> list[Message]:
    key = str(_field(op, "key"))
    messages = _field(op, "messages")
    if not isinstance(messages, list):
        raise HistoryError(f"poll {op.invoke.index}: messages must be a list")
    try:
        return [Message(key, int(offset), _hashable(value)) for offset, value in messages]
    except (TypeError, ValueError):
        raise HistoryError(
            f"poll {op.invoke.index}: messages must be [offset, value] pairs"
        ) from None


@dataclass
class _Index:
    """The history grouped by partition: sends by outcome, polls, and every value read."""

    sends: list[Completed] = field(default_factory=list)
    polls: list[tuple[Completed, list[Message]]] = field(default_factory=list)
    attempted: dict[str, set[Hashable]] = field(default_factory=lambda: defaultdict(set))
    failed: dict[str, set[Hashable]] = field(default_factory=lambda: defaultdict(set))
    not_failed: dict[str, set[Hashable]] = field(default_factory=lambda: defaultdict(set))
    read: dict[str, set[Hashable]] = field(default_factory=lambda: defaultdict(set))
    orders: dict[str, VersionOrder] = field(default_factory=lambda: defaultdict(VersionOrder))

    @staticmethod
    def build(pairs: Iterable[Completed]) -> _Index:
        index = _Index()
        for op in pairs:
            if op.invoke.f == "send":
                index.sends.append(op)
                key = str(_field(op, "key"))
                value = _hashable(_field(op, "value"))
                index.attempted[key].add(value)
                (index.failed if op.type == "fail" else index.not_failed)[key].add(value)
            elif op.invoke.f == "poll" and op.type == "ok":
                messages = _polled(op)
                index.polls.append((op, messages))
                for m in messages:
                    index.read[m.key].add(m.value)
                    index.orders[m.key].add(m.offset, m.value)
        for op in index.sends:
            key, value = str(_field(op, "key")), _hashable(_field(op, "value"))
            if index.must_have_committed(op, key, value) and op.type == "ok":
                index.orders[key].add(int(_field(op, "offset")), value)
        return index

    def must_have_committed(self, op: Completed, key: str, value: Hashable) -> bool:
        return op.type == "ok" or (op.type == "info" and value in self.read[key])


def _check_offsets(index: _Index, out: Anomalies) -> None:
    for key, order in sorted(index.orders.items()):
        for offset, values in sorted(order.values_at.items()):
            if len(values) > 1:
                out.add(
                    "inconsistent-offsets", key=key, offset=offset, values=sorted(map(str, values))
                )
        for value, offsets in order.offsets_of().items():
            if len(offsets) > 1:
                out.add("duplicate", key=key, value=value, offsets=offsets)


def _check_reads_against_writes(index: _Index, out: Anomalies) -> None:
    for op, messages in index.polls:
        for m in messages:
            if m.value not in index.attempted[m.key]:
                kind = "garbage-read"
            elif m.value in index.failed[m.key] and m.value not in index.not_failed[m.key]:
                kind = "aborted-read"
            else:
                continue
            out.add(kind, key=m.key, offset=m.offset, value=m.value, reader=op.invoke.index)


def _check_lost_and_unseen(index: _Index, out: Anomalies) -> None:
    frontiers: dict[str, tuple[dict[int, int], dict[Hashable, list[int]], int]] = {}
    for key, order in index.orders.items():
        dense, offsets = order.dense_index(), order.offsets_of()
        # The read frontier: the furthest first appearance of any value a successful read returned.
        frontier = max((dense[offsets[v][0]] for v in index.read[key]), default=-1)
        frontiers[key] = (dense, offsets, frontier)
    for op in index.sends:
        key, value = str(_field(op, "key")), _hashable(_field(op, "value"))
        if op.type != "ok" or value in index.read[key]:
            continue
        dense, offsets, frontier = frontiers[key]
        # The last appearance keeps this right when the value is also duplicated further on.
        last = max(dense[o] for o in offsets[value])
        out.add(
            "lost-write" if last <= frontier else "unseen",
            key=key,
            value=value,
            offset=_field(op, "offset"),
            writer=op.invoke.index,
        )


def _skips(
    dense: dict[int, int], order: VersionOrder, before: int, after: int
) -> tuple[str | None, list[Hashable]]:
    """Classifies the step from offset `before` to `after` as a skip, a step back, or fine."""
    delta = dense[after] - dense[before]
    if delta <= 0:
        return "nonmonotonic", []
    if delta == 1:
        return None, []
    offsets = sorted(order.values_at)[dense[before] + 1 : dense[after]]
    return "skip", [v for o in offsets for v in sorted(order.values_at[o], key=str)]


def _check_polls(index: _Index, out: Anomalies) -> None:
    dense = {key: order.dense_index() for key, order in index.orders.items()}
    # Per (process, key): the last offset read and the offset the consumer would read next.
    position: dict[tuple[int | str, str], tuple[int | None, int]] = {}
    for op, messages in index.polls:
        key = str(_field(op, "key"))
        order, where = index.orders[key], dense.get(key, {})
        for earlier, later in pairwise(messages):
            kind, skipped = _skips(where, order, earlier.offset, later.offset)
            if kind:
                out.add(
                    f"int-poll-{kind}" if kind == "skip" else "int-nonmonotonic-poll",
                    key=key,
                    reader=op.invoke.index,
                    offsets=[earlier.offset, later.offset],
                    skipped=skipped,
                )
        state_key = (op.invoke.process, key)
        last, expected_next = position.get(state_key, (None, -1))
        # A symbolic start ("earliest", "latest") never continues the previous poll.
        start = op.invoke.value.get("offset")
        requested = start if isinstance(start, int) else -2
        if messages and last is not None and requested == expected_next:
            kind, skipped = _skips(where, order, last, messages[0].offset)
            if kind:
                out.add(
                    "poll-skip" if kind == "skip" else "nonmonotonic-poll",
                    key=key,
                    process=op.invoke.process,
                    reader=op.invoke.index,
                    offsets=[last, messages[0].offset],
                    skipped=skipped,
                )
        if messages:
            last = messages[-1].offset
        elif requested != expected_next:
            last = None  # a seek to a new position restarts tracking, as Jepsen's assign does
        next_offset = op.value.get("next_offset") if isinstance(op.value, dict) else None
        if not isinstance(next_offset, int):
            next_offset = messages[-1].offset + 1 if messages else requested
        position[state_key] = (last, next_offset)


def _check_sends(index: _Index, out: Anomalies) -> None:
    last_offset: dict[tuple[int | str, str], int] = {}
    for op in index.sends:
        if op.type != "ok":
            continue
        key, offset = str(_field(op, "key")), int(_field(op, "offset"))
        state_key = (op.invoke.process, key)
        if state_key in last_offset and offset <= last_offset[state_key]:
            out.add(
                "nonmonotonic-send",
                key=key,
                process=op.invoke.process,
                writer=op.invoke.index,
                offsets=[last_offset[state_key], offset],
            )
        last_offset[state_key] = offset


def _check_vanished(index: _Index, out: Anomalies) -> None:
    final: dict[str, dict[int, Hashable]] = defaultdict(dict)
    for op, messages in index.polls:
        if op.invoke.value.get("final"):
            for m in messages:
                final[m.key][m.offset] = m.value
    # Only offsets inside the span the final reads covered can be judged.
    span = {key: (min(seen), max(seen)) for key, seen in final.items() if seen}
    for op, messages in index.polls:
        if op.invoke.value.get("final"):
            continue
        for m in messages:
            if m.key not in span or not span[m.key][0] <= m.offset <= span[m.key][1]:
                continue
            final_value = final[m.key].get(m.offset)
            if final_value != m.value:
                out.add(
                    "vanished-read",
                    key=m.key,
                    offset=m.offset,
                    value=m.value,
                    reader=op.invoke.index,
                    final_value=final_value,
                )


def check(ops: Iterable[Op], allowed: Iterable[str] = ()) -> dict[str, Any]:
    """Checks a produce/consume history; `valid` is False if any anomaly type not allowed occurs."""
    allowed_types = frozenset(allowed)
    unknown = allowed_types - set(ANOMALY_TYPES)
    if unknown:
        raise ValueError(f"unknown anomaly types {sorted(unknown)}")
    pairs = [p for p in pair(client_ops(ops)) if p.invoke.f in ("send", "poll")]
    index = _Index.build(pairs)
    out = Anomalies()
    _check_offsets(index, out)
    _check_reads_against_writes(index, out)
    _check_lost_and_unseen(index, out)
    _check_polls(index, out)
    _check_sends(index, out)
    _check_vanished(index, out)
    found = sorted(out.found)
    return {
        "valid": not set(found) - allowed_types,
        "anomaly_types": found,
        "anomaly_counts": dict(sorted(out.counts.items())),
        "anomalies": {kind: out.found[kind] for kind in found},
        "stats": {
            "sends": len(index.sends),
            "acknowledged": sum(op.type == "ok" for op in index.sends),
            "polls": len(index.polls),
            "values_read": sum(len(v) for v in index.read.values()),
            "partitions": len(index.orders),
        },
    }
