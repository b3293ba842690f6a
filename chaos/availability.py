"""Availability under faults: fault windows from the nemesis ops, success shares, recovery times.

Owns the fault-window model and the per-second throughput/latency timeline used by the plot.
"""

from __future__ import annotations

import bisect
import itertools
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
    ratios = throughput_ratios(ops)
    judged = [r["ratio"] for r in ratios if r["meets_target"] is not None]
    controls = sorted(r["ratio"] for r in ratios if r["control"] and r["ratio"] is not None)
    return {
        "not_injected": dict(not_injected),
        "throughput_ratios": ratios,
        "throughput_ratio_min": min(judged, default=None),
        "throughput_target_met": all(r["meets_target"] is not False for r in ratios),
        "control_ratio_min": controls[0] if controls else None,
        "control_ratio_median": controls[len(controls) // 2] if controls else None,
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


# The acknowledged write of each workload: a send (log, queue, group, idempotent and share
# workloads), a transactional produce (transactions) and a routed publish (route).
ACKED_WRITES = frozenset({"send", "txn-send", "publish"})

# Issue 21: from an election timeout (1 s) + 1 s after a fault until its heal, acknowledged writes
# per second stay at least 70% of the rate before it, wherever a majority stayed connected.
GRACE_S = 2.0
TARGET_RATIO = 0.7
BASELINE_SKIP_S = 2.0  # the first seconds after a heal are recovery, not the baseline
# "The rate before it": over the quiet time of this many seconds before the fault (outside every
# fault window and the BASELINE_SKIP_S after its heal), about 10-14 s with the nemesis' 5-10 s
# quiet periods. The quiet gap since the previous heal alone (3-8 s) took the rate of a burst
# or a lull on a shared machine, where the rate swings 2-5x within seconds with no fault.
BASELINE_S = 30.0


CONTROL = "none"  # the placebo nemesis: measured like a fault, never judged (nemesis.Placebo)


def majority_connected(window: FaultWindow) -> bool:
    """Whether more than half the nodes could all reach one another during the fault. Only a
    partition can break that; a ring partition leaves every node a majority of its own but
    no majority whose members all see each other."""
    if window.fault != "partition" or not isinstance(window.detail, dict):
        return True
    sees = {int(k): set(v) for k, v in (window.detail.get("sees") or {}).items()}
    if not sees:  # the shape was not recorded: judge the window like any other fault
        return True
    nodes = sorted(sees)
    need = len(nodes) // 2 + 1
    return any(
        all(b in sees[a] for a in group for b in group)
        for group in itertools.combinations(nodes, need)
    )


def throughput_ratios(ops: list[Op]) -> list[dict[str, Any]]:
    """Per fault window: acknowledged writes (ACKED_WRITES) per second from GRACE_S after the
    fault until the heal, against the quiet time of the BASELINE_S before it."""
    writes = [op for op in pair(client_ops(ops)) if op.invoke.f in ACKED_WRITES and op.type == "ok"]
    acked = sorted(op.end for op in writes)
    acked_by_key: dict[Any, list[int]] = defaultdict(list)
    for op in writes:
        if _key(op) is not None:
            acked_by_key[_key(op)].append(op.end)
    for times in acked_by_key.values():
        times.sort()
    windows = sorted(fault_windows(ops), key=lambda w: w.start)
    first = acked[0] if acked else 0
    last = acked[-1] if acked else 0
    rows = []
    for w in windows:
        # The run's first seconds count as recovery too: the clients are starting.
        look_from = max(first + BASELINE_SKIP_S * NS, w.start - BASELINE_S * NS)
        quiet = _quiet_spans(windows, look_from, w.start, BASELINE_SKIP_S * NS, last)
        if sum(b - a for a, b in quiet) < NS:  # hardly any quiet time: the recovery too
            quiet = _quiet_spans(windows, max(first, w.start - BASELINE_S * NS), w.start, 0, last)
        during_from = w.start + GRACE_S * NS
        end = w.end if w.end is not None else (acked[-1] if acked else w.start)
        before = _spans_rate(acked, quiet)
        during = _rate(acked, during_from, end)
        ratio = None if before is None or during is None or before == 0 else during / before
        connected = majority_connected(w)
        # Each partition's own rates: one slow partition or all of them alike.
        by_key = {
            str(key): [
                _rounded(_spans_rate(times, quiet)),
                _rounded(_rate(times, during_from, end)),
            ]
            for key, times in sorted(acked_by_key.items(), key=lambda item: str(item[0]))
        }
        rows.append(
            {
                "fault": w.fault,
                "start_s": round(w.start / NS, 3),
                "end_s": None if w.end is None else round(w.end / NS, 3),
                "majority_connected": connected,
                "before_per_s": _rounded(before),
                "during_per_s": _rounded(during),
                "ratio": None if ratio is None else round(ratio, 3),
                "baseline_s": round(sum(b - a for a, b in quiet) / NS, 1),
                "judged_s": round(max(0, end - during_from) / NS, 1),
                "by_partition_per_s": by_key,
                "control": w.fault == CONTROL,
                "meets_target": (
                    None
                    if ratio is None or not connected or w.fault == CONTROL
                    else ratio >= TARGET_RATIO
                ),
            }
        )
    return rows


def _quiet_spans(
    windows: list[FaultWindow], start: float, end: float, skip: float, last: float
) -> list[tuple[float, float]]:
    """The parts of [start, end) outside every fault window and the `skip` after its heal (a
    window never healed runs until `last`)."""
    busy = sorted((w.start, (w.end if w.end is not None else last) + skip) for w in windows)
    spans, t = [], start
    for busy_from, busy_to in busy:
        if busy_from > t:
            spans.append((t, min(busy_from, end)))
        t = max(t, busy_to)
        if t >= end:
            break
    if t < end:
        spans.append((t, end))
    return [(a, b) for a, b in spans if b > a]


def _spans_rate(sorted_times: list[int], spans: list[tuple[float, float]]) -> float | None:
    """Events per second over `spans`; None when they add up to under half a second."""
    seconds = sum(b - a for a, b in spans) / NS
    if seconds < 0.5:
        return None
    count = sum(
        bisect.bisect_left(sorted_times, b) - bisect.bisect_left(sorted_times, a) for a, b in spans
    )
    return count / seconds


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 1)


def _rate(sorted_times: list[int], start: float, end: float) -> float | None:
    """Events per second in [start, end); None for a span under half a second."""
    if end - start < NS / 2:
        return None
    count = bisect.bisect_left(sorted_times, end) - bisect.bisect_left(sorted_times, start)
    return count / ((end - start) / NS)


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


def timeline(ops: list[Op], bucket_s: float = 1.0) -> list[dict[str, Any]]:
    """Per time bucket (by completion time): outcomes per type, acknowledged writes and ok
    latency p50/p99 in ms."""
    buckets: dict[int, dict[str, Any]] = {}
    for op in pair(client_ops(ops)):
        if op.complete is None:
            continue
        b = int(op.complete.time / NS / bucket_s)
        entry = buckets.setdefault(
            b, {"ok": 0, "fail": 0, "info": 0, "writes_ok": 0, "latencies": []}
        )
        entry[op.type] += 1
        if op.type == "ok" and op.invoke.f in ACKED_WRITES:
            entry["writes_ok"] += 1
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
