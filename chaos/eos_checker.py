"""Safety checkers for exactly-once histories: idempotent producers, and transactions.

Owns the anomalies of both workloads (chaos/eos_workload.py) and how to find them, including
write-write cycles (G0) between committed transactions.

Idempotent history (values are JSON):
- producer-init: ok {"producer_id", "producer_epoch"}.
- send: one op per attempt, invoke {"key": "topic/partition", "values": [...], "producer_id",
  "producer_epoch", "sequence", "attempt"}; ok adds "offsets" (one per value); fail: refused
  (a 4xx: certainly not written); info: unknown.
- poll with "final": true: ok {"key", "messages": [[offset, value], ...]}: the whole partition
  read after the faults healed (read_uncommitted).

Transactions history:
- txn-init: ok {"producer_id", "producer_epoch"} for a process's transactional id.
- txn-send: invoke {"txn", "key", "values", ...producer fields}; ok adds "offsets".
- txn-end: invoke {"txn", "commit": bool}; ok: decided as asked; fail: refused (a 4xx).
- txn-poll: ok {"key", "messages": [[offset, value]], "final": bool}: read_committed reads,
  followers during the run and the final whole-partition reads.

A transaction's fate: committed if a commit was answered ok; aborted if an abort was answered
ok or no commit was ever asked for (open at the end, fenced, timed out); unknown if a commit
was asked for but never answered ok (then it must be all or nothing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from raftline.chaos.history import Completed, Op, client_ops, pair

IDEMPOTENT_ANOMALIES: tuple[str, ...] = (
    "duplicate",  # one sent value stored at two offsets (a retry written twice)
    "lost",  # an acknowledged value missing from the final read
    "wrong-offset",  # stored elsewhere than its acknowledgement (or a retry's) said
    "order",  # a producer's values on a partition stored out of their send order
    "garbage",  # a stored value no producer sent
)
TXN_ANOMALIES: tuple[str, ...] = (
    "aborted-read",  # G1a: a value of an aborted (or never committed) transaction read
    "uncommitted-read",  # G1b-like: read before its transaction's commit was asked for
    "duplicate",  # a value stored (read) at two offsets
    "lost",  # a value of a committed transaction missing from the final read
    "fractured",  # part of a transaction visible at the end, part not
    "garbage",  # a read value no transaction sent
)
MAX_EXAMPLES = 50
IDEMPOTENT_FS = ("producer-init",)
TXN_FS = ("txn-init", "txn-send", "txn-end", "txn-poll")


def has_idempotent_ops(ops: Iterable[Op]) -> bool:
    return any(op.f in IDEMPOTENT_FS for op in ops)


def has_txn_ops(ops: Iterable[Op]) -> bool:
    return any(op.f in TXN_FS for op in ops)


class _Found:
    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds
        self.examples: dict[str, list[Any]] = defaultdict(list)
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, kind: str, example: Any) -> None:
        assert kind in self.kinds, kind
        self.counts[kind] += 1
        if len(self.examples[kind]) < MAX_EXAMPLES:
            self.examples[kind].append(example)

    def verdict(self, stats: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "valid": not self.counts,
            "anomaly_types": sorted(self.counts),
            "anomaly_counts": dict(sorted(self.counts.items())),
            "anomalies": dict(self.examples),
            "stats": stats,
            **extra,
        }


def _final_log(done: list[Completed], f: str) -> dict[str, dict[int, Any]]:
    """partition key -> offset -> value, from the ok final reads of `f`."""
    log: dict[str, dict[int, Any]] = defaultdict(dict)
    for op in done:
        if op.invoke.f == f and op.type == "ok" and op.value.get("final"):
            for offset, value in op.value["messages"]:
                log[op.value["key"]][int(offset)] = value
    return log


def _placed(log: dict[str, dict[int, Any]]) -> dict[Any, list[tuple[str, int]]]:
    where: dict[Any, list[tuple[str, int]]] = defaultdict(list)
    for key, messages in log.items():
        for offset, value in messages.items():
            where[value].append((key, offset))
    return where


# ---------------------------------------------------------------------- idempotent producers


def check_idempotent(ops: list[Op]) -> dict[str, Any]:
    done = pair(client_ops(ops))
    found = _Found(IDEMPOTENT_ANOMALIES)
    sends = [op for op in done if op.invoke.f == "send"]
    sent: dict[Any, tuple[int, int, str]] = {}  # value -> (producer id, its n, partition key)
    acked: dict[Any, set[int]] = defaultdict(set)  # value -> offsets its acks named
    attempts: dict[Any, int] = defaultdict(int)
    for op in sends:
        request = op.invoke.value
        for i, value in enumerate(request["values"]):
            sent[value] = (request["producer_id"], _n_of(value), request["key"])
            attempts[value] += 1
            if op.type == "ok":
                acked[value].add(int(op.value["offsets"][i]["offset"]))
    where = _placed(_final_log(done, "poll"))
    for value, places in where.items():
        if value not in sent:
            found.add("garbage", {"value": value, "at": places})
        elif len(places) > 1:
            found.add("duplicate", {"value": value, "at": places})
    for value, offsets in acked.items():
        places = where.get(value, [])
        if not places:
            found.add("lost", {"value": value, "acknowledged_at": sorted(offsets)})
        elif len(offsets) > 1 or {o for _, o in places} != offsets:
            found.add("wrong-offset", {"value": value, "acked": sorted(offsets), "at": places})
    stored: dict[tuple[Any, str], list[tuple[int, int]]] = defaultdict(list)
    for value, places in where.items():
        if value in sent:
            producer, n, _ = sent[value]
            for key, offset in places:
                stored[(producer, key)].append((offset, n))
    for (producer, key), entries in stored.items():
        ns = [n for _, n in sorted(entries)]
        if ns != sorted(ns):
            found.add("order", {"producer_id": producer, "key": key, "order": ns[:40]})
    stats = {
        "values_sent": len(sent),
        "acknowledged": len(acked),
        "attempts": len(sends),
        "retried_values": sum(1 for n in attempts.values() if n > 1),
        "acked_after_retry": sum(1 for v in acked if attempts[v] > 1),
        "duplicate_answers": sum(
            1 for op in sends if op.type == "ok" and op.value.get("duplicate")
        ),
        "refused": sum(1 for op in sends if op.type == "fail"),
        "unknown": sum(1 for op in sends if op.type == "info"),
        "producers": sum(1 for op in done if op.invoke.f == "producer-init" and op.type == "ok"),
        "values_stored": sum(len(p) for p in where.values()),
    }
    return found.verdict(stats)


def _n_of(value: str) -> int:
    """The send order of a workload value "<prefix><process>-<n>"."""
    return int(str(value).rsplit("-", 1)[1])


# ---------------------------------------------------------------------- transactions


def transaction_fates(done: list[Completed]) -> dict[str, str]:
    """txn -> committed | aborted | unknown (see the module header)."""
    fates: dict[str, str] = {}
    for op in done:
        if op.invoke.f == "txn-send":
            fates.setdefault(op.invoke.value["txn"], "aborted")
        if op.invoke.f != "txn-end":
            continue
        txn, commit = op.invoke.value["txn"], op.invoke.value["commit"]
        if commit:  # refused outright (fail) leaves it aborted
            if op.type == "ok":
                fates[txn] = "committed"
            elif fates.get(txn) != "committed" and op.type == "info":
                fates[txn] = "unknown"
    return fates


def check_transactions(ops: list[Op]) -> dict[str, Any]:
    done = pair(client_ops(ops))
    found = _Found(TXN_ANOMALIES)
    fates = transaction_fates(done)
    txn_of: dict[Any, str] = {}
    members: dict[str, set[Any]] = defaultdict(set)
    for op in done:
        if op.invoke.f == "txn-send":
            txn = op.invoke.value["txn"]
            for value in op.invoke.value["values"]:
                txn_of[value] = txn
                members[txn].add(value)
    first_commit: dict[str, int] = {}
    for op in done:
        if op.invoke.f == "txn-end" and op.invoke.value["commit"]:
            first_commit.setdefault(op.invoke.value["txn"], op.invoke.time)
    reads = 0
    for op in done:
        if op.invoke.f != "txn-poll" or op.type != "ok":
            continue
        for _, value in op.value["messages"]:
            reads += 1
            txn = txn_of.get(value)
            if txn is None:
                found.add("garbage", {"value": value, "key": op.value["key"]})
            elif fates[txn] == "aborted":
                found.add("aborted-read", {"value": value, "txn": txn, "poll": op.invoke.index})
            elif txn not in first_commit or op.end < first_commit[txn]:
                found.add("uncommitted-read", {"value": value, "txn": txn, "poll": op.invoke.index})
    log = _final_log(done, "txn-poll")
    where = _placed(log)
    for value, places in where.items():
        if len(places) > 1:
            found.add("duplicate", {"value": value, "at": places})
    for txn, values in members.items():
        visible = {v for v in values if v in where}
        if fates[txn] == "committed" and len(visible) < len(values):
            found.add("lost", {"txn": txn, "missing": sorted(values - visible)})
        elif fates[txn] == "unknown" and visible and len(visible) < len(values):
            found.add("fractured", {"txn": txn, "missing": sorted(values - visible)})
    cycles = write_cycles(log, txn_of, {t for t, f in fates.items() if f != "aborted"})
    stats = {
        "transactions": len(members),
        "committed": sum(1 for f in fates.values() if f == "committed"),
        "aborted": sum(1 for f in fates.values() if f == "aborted"),
        "unknown": sum(1 for f in fates.values() if f == "unknown"),
        "values_sent": len(txn_of),
        "values_read": reads,
        "values_stored": len(where),
        "multi_partition_committed": sum(
            1
            for t, f in fates.items()
            if f == "committed" and len({k for v in members[t] for k, _ in where.get(v, [])}) > 1
        ),
        "g0_cycles": len(cycles),
    }
    # G0 is allowed (Kafka's transactions are not serializable; README "isolation"): reported.
    return found.verdict(stats, g0_examples=cycles[:5])


def write_cycles(
    log: dict[str, dict[int, Any]], txn_of: dict[Any, str], visible: set[str]
) -> list[list[str]]:
    """G0: cycles of write-write dependencies between visible transactions, T1 -> T2 when T1's
    write precedes T2's on some partition. One cycle per strongly connected component."""
    edges: dict[str, set[str]] = defaultdict(set)
    for messages in log.values():
        order: list[str] = []
        for offset in sorted(messages):
            txn = txn_of.get(messages[offset])
            if txn in visible and (not order or order[-1] != txn):
                order.append(txn)
        for before, after in pairwise(order):
            if before != after:
                edges[before].add(after)
    return [_cycle_in(component, edges) for component in _components(edges) if len(component) > 1]


def _components(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    nodes = set(edges) | {n for targets in edges.values() for n in targets}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                out.append(component)
    return out


def _cycle_in(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """One cycle through the component's smallest member (a shortest path back to it)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child in component and child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    return [start]
