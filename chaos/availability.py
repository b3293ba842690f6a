"""Availability under faults: fault windows from the nemesis ops, success shares, recovery times.

Owns the fault-window model and the per-second throughput/latency timeline used by the plot.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raftline.chaos.history import NEMESIS, Completed, Op, client_ops, pair

NS = 1_000_000_000


@dataclass(frozen=True)
class FaultWindow:
    """A fault in force from `start` (its injection completed) until `end` (its heal completed)."""

    fault: str
    start: int
    end: int | None
    detail: Any = None

    def covers(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


def fault_windows(ops: Iterable[Op]) -> list[FaultWindow]:
    """Nemesis history: f "start"/"stop" with value {"fault": name, ...}; stops close FIFO."""
    windows: list[FaultWindow] = []
    open_by_fault: dict[str, list[int]] = defaultdict(list)
    for op in ops:
        if op.process != NEMESIS or op.type != "ok" or not isinstance(op.value, dict):
            continue
        fault = str(op.value.get("fault"))
        if op.f == "start":
            open_by_fault[fault].append(len(windows))
            windows.append(FaultWindow(fault, op.time, None, op.value))
        elif op.f == "stop" and open_by_fault[fault]:
            i = open_by_fault[fault].pop(0)
            w = windows[i]
            windows[i] = FaultWindow(w.fault, w.start, op.time, w.detail)
    return windows


def _share(ops: list[Completed]) -> dict[str, Any]:
    ok = sum(op.type == "ok" for op in ops)
    return {"ops": len(ops), "ok": ok, "ok_share": round(ok / len(ops), 4) if ops else None}


def _key(op: Completed) -> Any:
    return op.invoke.value.get("key") if isinstance(op.invoke.value, dict) else None


def _recovery_s(window: FaultWindow, ops: list[Completed], fs: frozenset[str]) -> float | None:
    """Seconds from the heal until every key (partition) that had traffic had a success again,
    counting only operations invoked after the heal; None if some key never recovered."""
    if window.end is None:
        return None
    relevant = [op for op in ops if op.invoke.f in fs]
    first_ok: dict[Any, float] = {}
    for op in relevant:
        if op.type == "ok" and op.start >= window.end:
            first_ok[_key(op)] = min(first_ok.get(_key(op), math.inf), op.end)
    keys = {_key(op) for op in relevant}
    if not keys or keys - set(first_ok):
        return None
    return round((max(first_ok.values()) - window.end) / NS, 3)


def availability(
    ops: list[Op], fs: Iterable[str] = ("send", "poll"), recovery_fs: Iterable[str] = ("send",)
) -> dict[str, Any]:
    """Share of successful data ops (`fs`) during, outside and after faults, and recovery per
    fault. Metadata ops are left out: their definite failures (topic_exists) are right answers."""
    windows = fault_windows(ops)
    counted = frozenset(fs)
    done = [op for op in pair(client_ops(ops)) if op.invoke.f in counted]
    during = [op for op in done if any(w.covers(op.start) for w in windows)]
    outside = [op for op in done if not any(w.covers(op.start) for w in windows)]
    last_heal = max((w.end for w in windows if w.end is not None), default=None)
    after = [op for op in done if last_heal is not None and op.start >= last_heal]
    recovering = frozenset(recovery_fs)
    # Faults the nemesis could not inject (e.g. a node without the clock hook) open no window.
    not_injected: dict[str, int] = defaultdict(int)
    for op in ops:
        if op.process == NEMESIS and op.f == "start" and op.type == "fail":
            not_injected[str((op.value or {}).get("fault"))] += 1
    return {
        "not_injected": dict(not_injected),
        "overall": _share(done),
        "during_faults": _share(during),
        "outside_faults": _share(outside),
        "after_faults": _share(after),
        "faults": [
            {
                "fault": w.fault,
                "start_s": round(w.start / NS, 3),
                "end_s": None if w.end is None else round(w.end / NS, 3),
                "recovery_s": _recovery_s(w, done, recovering),
            }
            for w in windows
        ],
    }


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


def timeline(ops: list[Op], bucket_s: float = 1.0) -> list[dict[str, Any]]:
    """Per time bucket (by completion time): outcomes per type and ok latency p50/p99 in ms."""
    buckets: dict[int, dict[str, Any]] = {}
    for op in pair(client_ops(ops)):
        if op.complete is None:
            continue
        b = int(op.complete.time / NS / bucket_s)
        entry = buckets.setdefault(b, {"ok": 0, "fail": 0, "info": 0, "latencies": []})
        entry[op.type] += 1
        if op.type == "ok":
            entry["latencies"].append((op.complete.time - op.start) / 1e6)
    rows = []
    for b in sorted(buckets):
        entry = buckets[b]
        lat = sorted(entry.pop("latencies"))
        rows.append(
            {
                "t": b * bucket_s,
                **entry,
                "p50_ms": _percentile(lat, 0.5) if lat else None,
                "p99_ms": _percentile(lat, 0.99) if lat else None,
            }
        )
    return rows
