"""Safety checker for routing histories: publishers that send unique values through one fanout
exchange bound to several topics (chaos/route_workload.py), and a final read of every
destination with read_committed.

Owns the routing anomalies and how to find them. A publish that reaches several partitions is
one transaction, so each value must be in every destination or in none.

History shape (values are JSON):
- publish:     invoke {"value"}; ok adds "routed": [[topic, partition, offset], ...]; fail:
  definitely not written (a 4xx: refused, or aborted); info: unknown.
- route-final: ok {"topics": {topic: [[partition, offset, value], ...]}}: every destination
  read from its start to its end after the faults healed (read_committed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from raftline.chaos.history import Op, client_ops, pair

ANOMALY_TYPES: tuple[str, ...] = (
    "lost",  # an acknowledged publish missing from a destination
    "partial",  # a value in some destinations but not all: the publish was not atomic
    "duplicate",  # a value twice in one destination (publishes are never retried)
    "garbage",  # a value in a destination that no publish sent
    "failed-but-visible",  # a publish answered with a definite failure, yet readable
    "misrouted",  # an acknowledged publish whose answer names other topics than the bindings
    "wrong-offset",  # an acknowledged publish's answer names a place holding another value
    "unread",  # the final read of the destinations is missing: nothing can be judged
)
ROUTE_FS = ("publish", "route-final")
MAX_EXAMPLES = 50


@dataclass
class Result:
    valid: bool
    anomalies: dict[str, list[Any]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


def has_route_ops(ops: Iterable[Op]) -> bool:
    return any(op.f in ROUTE_FS for op in ops)


def check(history: Iterable[Op]) -> Result:
    anomalies: dict[str, list[Any]] = defaultdict(list)

    def note(kind: str, evidence: Any) -> None:
        assert kind in ANOMALY_TYPES, kind
        if len(anomalies[kind]) < MAX_EXAMPLES:
            anomalies[kind].append(evidence)

    sent: set[str] = set()
    failed: set[str] = set()
    acked: dict[str, list[list[Any]]] = {}
    final: dict[str, list[list[Any]]] | None = None
    for op in pair(client_ops(history)):
        if op.invoke.f == "publish":
            value = str(op.invoke.value["value"])
            sent.add(value)
            if op.type == "ok":
                acked[value] = list(op.value["routed"])
            elif op.type == "fail":
                failed.add(value)
        elif op.invoke.f == "route-final" and op.type == "ok":
            final = op.value["topics"]
    if final is None:
        note("unread", {"published": len(sent)})
        return Result(False, dict(anomalies), {"published": len(sent), "acknowledged": len(acked)})

    destinations = sorted(final)
    places: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for topic, entries in final.items():
        for partition, offset, value in entries:
            places[str(value)][topic].append((int(partition), int(offset)))
    for value, found in places.items():
        if value not in sent:
            note("garbage", {"value": value, "in": sorted(found)})
            continue
        for topic, at in found.items():
            if len(at) > 1:
                note("duplicate", {"value": value, "topic": topic, "at": at})
        if len(found) < len(destinations):
            note("partial", {"value": value, "in": sorted(found), "of": destinations})
        if value in failed:
            note("failed-but-visible", {"value": value, "in": sorted(found)})
    for value, routed in acked.items():
        found = places.get(value, {})
        for topic in destinations:
            if topic not in found:
                note("lost", {"value": value, "topic": topic})
        if sorted({str(t) for t, _, _ in routed}) != destinations:
            note("misrouted", {"value": value, "routed": routed, "bindings": destinations})
        for topic, partition, offset in routed:
            if topic in found and (int(partition), int(offset)) not in found[topic]:
                note("wrong-offset", {"value": value, "said": [topic, partition, offset]})
    stats = {
        "published": len(sent),
        "acknowledged": len(acked),
        "failed": len(failed),
        "destinations": len(destinations),
        "values_read": len(places),
    }
    return Result(not anomalies, dict(anomalies), stats)


def verdict(ops: list[Op]) -> dict[str, Any]:
    """`check` as report.py shows it: valid, anomaly types and counts, examples, stats."""
    result = check(ops)
    return {
        "valid": result.valid,
        "anomaly_types": sorted(result.anomalies),
        "anomaly_counts": {k: len(v) for k, v in result.anomalies.items()},
        "anomalies": result.anomalies,
        "stats": result.stats,
    }
