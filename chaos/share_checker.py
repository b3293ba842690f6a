"""Safety checker for queue (share group) histories: receivers that lock, acknowledge, release
and reject records of a topic, with a dead-letter topic.

Owns the queue anomalies and how to find them in a history. Records are named by
"partition/offset" of the source topic.

History shape (values are JSON):
- send:    invoke {"value"}; ok adds "partition" and "offset" (or has the chaos producers'
  "key": "topic/partition"). fail: definitely not written.
- receive: ok {"messages": [{"partition", "offset", "value", "delivery_count"}]}.
- settle:  invoke {"outcome": "accept" | "release" | "reject", "records": [[partition, offset,
  delivery_count], ...]}; ok adds "results": [true | false, ...] (whether each receipt held
  its lock); info: unknown.
- queue-create: invoke and ok hold the queue's config, "max_deliveries" among it (report.py
  reads it from there).
- final:   ok {"dead": [{"partition", "offset", "value", "delivery_count", "reason"}]}: the
  whole dead-letter topic read after the faults healed and the queue was drained.
`max_deliveries` is the queue's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from raftline.chaos.history import Completed, Op, client_ops, pair

ANOMALY_TYPES: tuple[str, ...] = (
    "lost",  # an acknowledged send that ended neither acknowledged nor dead-lettered
    "double-ack",  # two accepts of one record both answered ok
    "redelivered-after-ack",  # received by a receive invoked after an ok accept of it
    "delivery-count-decreased",  # a later receive saw a lower (or equal) delivery count
    "too-many-deliveries",  # delivered more than max_deliveries times
    "acked-and-dead",  # acknowledged and also dead-lettered
    "unjustified-dead-letter",  # dead-lettered though never rejected and not spent
    "garbage",  # a received value that no send wrote at that record
)
MAX_EXAMPLES = 50

Key = str  # "partition/offset"


@dataclass
class Result:
    valid: bool
    anomalies: dict[str, list[Any]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


def _key(partition: Any, offset: Any) -> Key:
    return f"{int(partition)}/{int(offset)}"


def _sent_partition(value: dict[str, Any]) -> Any:
    if "partition" in value:
        return value["partition"]
    return str(value["key"]).rsplit("/", 1)[1]


def check(history: Iterable[Op], max_deliveries: int) -> Result:
    ops = pair(client_ops(history))
    anomalies: dict[str, list[Any]] = defaultdict(list)

    def note(kind: str, evidence: Any) -> None:
        assert kind in ANOMALY_TYPES, kind
        if len(anomalies[kind]) < MAX_EXAMPLES:
            anomalies[kind].append(evidence)

    sent: dict[Key, Any] = {}
    for op in ops:
        if op.invoke.f == "send" and op.type == "ok":
            sent[_key(_sent_partition(op.value), op.value["offset"])] = op.value["value"]

    accepted: dict[Key, list[Completed]] = defaultdict(list)  # ok accepts
    rejected: set[Key] = set()  # rejects that may have applied (ok or unknown)
    maybe_accepted: set[Key] = set()  # accepts whose outcome is unknown
    receives: dict[Key, list[tuple[Completed, int]]] = defaultdict(list)
    dead: dict[Key, dict[str, Any]] = {}
    for op in ops:
        f = op.invoke.f
        if f == "settle" and op.type in ("ok", "info"):
            records = op.invoke.value["records"]
            results = op.value.get("results") if op.type == "ok" else None
            for index, (partition, offset, _count) in enumerate(records):
                key = _key(partition, offset)
                held = results is None or bool(results[index])
                if op.invoke.value["outcome"] == "accept" and op.type == "ok" and held:
                    accepted[key].append(op)
                elif op.invoke.value["outcome"] == "accept" and op.type == "info":
                    maybe_accepted.add(key)
                if op.invoke.value["outcome"] == "reject" and held:
                    rejected.add(key)
        elif f == "receive" and op.type == "ok":
            for m in op.value["messages"]:
                key = _key(m["partition"], m["offset"])
                receives[key].append((op, int(m["delivery_count"])))
                if key in sent and sent[key] != m["value"]:
                    note("garbage", {"record": key, "read": m["value"], "sent": sent[key]})
        elif f == "final" and op.type == "ok":
            for d in op.value["dead"]:
                dead[_key(d["partition"], d["offset"])] = d

    for key, acks in accepted.items():
        if len(acks) > 1:
            note("double-ack", {"record": key, "at": [a.invoke.index for a in acks]})
        first_done = min(a.complete.time for a in acks if a.complete is not None)
        for receive, _ in receives.get(key, []):
            if receive.invoke.time > first_done:
                note("redelivered-after-ack", {"record": key, "receive": receive.invoke.index})
        if key in dead:
            note("acked-and-dead", {"record": key, "dead": dead[key]})
    for key, seen in receives.items():
        for earlier, count in seen:
            if count > max_deliveries:
                note("too-many-deliveries", {"record": key, "delivery_count": count})
            done = earlier.complete.time if earlier.complete is not None else None
            for later, later_count in seen:
                if done is not None and later.invoke.time > done and later_count <= count:
                    note(
                        "delivery-count-decreased",
                        {"record": key, "counts": [count, later_count]},
                    )
    for key, d in dead.items():
        spent = int(d["delivery_count"]) >= max_deliveries
        if key not in rejected and not spent:
            note("unjustified-dead-letter", {"record": key, "dead": d})
    for key in sent:
        if key not in accepted and key not in dead and key not in maybe_accepted:
            note("lost", {"record": key, "value": sent[key]})
    stats = {
        "sent": len(sent),
        "acknowledged": len(accepted),
        "dead_lettered": len(dead),
        "deliveries": sum(len(v) for v in receives.values()),
    }
    return Result(not anomalies, dict(anomalies), stats)


def has_share_ops(ops: Iterable[Op]) -> bool:
    return any(op.f in ("receive", "settle") for op in ops)


def max_deliveries_of(ops: Iterable[Op], default: int = 5) -> int:
    """The queue's max_deliveries as its create call recorded it (the API's default else)."""
    for op in ops:
        if op.f == "queue-create" and isinstance(op.value, dict) and "max_deliveries" in op.value:
            return int(op.value["max_deliveries"])
    return default


def verdict(ops: list[Op]) -> dict[str, Any]:
    """`check` as report.py shows it: valid, anomaly types and counts, examples, stats."""
    result = check(ops, max_deliveries_of(ops))
    return {
        "valid": result.valid,
        "max_deliveries": max_deliveries_of(ops),
        "anomaly_types": sorted(result.anomalies),
        "anomaly_counts": {k: len(v) for k, v in result.anomalies.items()},
        "anomalies": result.anomalies,
        "stats": result.stats,
    }
