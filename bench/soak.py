"""Sustained runs: a soak at max rate, then fixed-rate runs at fractions of its sustained max.

Owns the per-second timeline of a run (throughput, publish p50/p99), the sustained-max rule,
the plan per system (yardstick, soak, fixed rates) and the soak report (Markdown, JSON, PNG).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import native
from bench.compare import PEER_OF, SETUP_TIMEOUT_S, _run
from bench.drivers import driver_class
from bench.drivers.base import Driver
from bench.histogram import Histogram
from bench.host_samples import HostSampler, YardstickPlan, plain_file_writer
from bench.pacing import NS_PER_S, StampGroup, Window, latency_us
from bench.peers import PEERS, ensure_installed
from bench.runner import WorkloadRun
from bench.tally import Tally
from bench.workload import WORKLOAD_DIR, Workload, load_workload
from raftline.raftlog.log import LogConfig

SOAK_WORKLOAD_DIR = WORKLOAD_DIR / "soak"
MB = 1_000_000
GB = 1000 * MB
# Disk a system without retention may fill in one soak (the machine is shared).
UNRETAINED_MAX_BYTES = 25 * GB


@dataclass
class TimelineTally(Tally):
    """A Tally that also keeps acknowledged messages and publish latency per second of the run;
    reaching `cap_messages` acknowledged ends the window, which stops the producers."""

    cap_messages: int = 0
    acked_per_second: list[int] = field(default_factory=list)
    latency_per_second: list[Histogram] = field(default_factory=list)

    def on_acked(self, groups: list[StampGroup], ack_ns: int) -> None:
        super().on_acked(groups, ack_ns)
        second = max(0, (ack_ns - self.window.start_ns) // NS_PER_S)
        while len(self.acked_per_second) <= second:
            self.acked_per_second.append(0)
            self.latency_per_second.append(Histogram())
        histogram = self.latency_per_second[second]
        for intended_ns, count in groups:
            self.acked_per_second[second] += count
            histogram.record(latency_us(intended_ns, ack_ns), count)
        if self.cap_messages and self.acked >= self.cap_messages and ack_ns < self.window.end_ns:
            self.window = Window(self.window.start_ns, ack_ns)

    def timeline(self, message_size: int) -> list[dict[str, float]]:
        """One point per whole second: MB/s, msgs/s and publish p50/p99 in ms."""
        points = []
        whole = int(self.window.seconds)
        for second, (count, histogram) in enumerate(
            zip(self.acked_per_second[:whole], self.latency_per_second, strict=False)
        ):
            point = {"t": second, "msgs_per_s": count, "mb_per_s": count * message_size / MB}
            if histogram.total:
                point["p50_ms"] = histogram.percentile(50) / 1000
                point["p99_ms"] = histogram.percentile(99) / 1000
            points.append(point)
        return points


def sustained_rate(timeline: list[dict[str, float]]) -> float:
    """msgs/s a system keeps up: the mean over the second half of the run (the first half
    holds whatever a fresh node does faster, e.g. before its page cache fills)."""
    rates = [p["msgs_per_s"] for p in timeline]
    half = rates[len(rates) // 2 :]
    return statistics.fmean(half) if half else 0.0


def quick_rate(timeline: list[dict[str, float]]) -> float:
    """msgs/s in seconds 1-3 of a fresh node: what a quick run (1 s warm-up + 3 s) reports."""
    rates = [p["msgs_per_s"] for p in timeline[1:4]]
    return statistics.fmean(rates) if rates else 0.0


@dataclass
class SoakOptions:
    """What a sustained run does per system; see `python -m bench soak --help`."""

    systems: list[str]
    workload: Workload
    seconds: float = 300.0
    max_bytes: int = 100 * GB
    retention_bytes: int = 4 * (1 << 30)
    fractions: list[float] = field(default_factory=lambda: [0.5, 0.8])
    fixed_seconds: float = 120.0
    replicas: int = 1
    yardstick: YardstickPlan | None = field(default_factory=YardstickPlan)
    client: str = "native"  # or "python": the driver in bench/drivers
    install: bool = True
    log: Any = print


def soak(options: SoakOptions) -> dict[str, Any]:
    """Every system in turn: start it, yardstick, soak at max rate, fixed-rate runs, stop it."""
    results: dict[str, Any] = {"systems": {}, "skipped": []}
    for system in options.systems:
        try:
            results["systems"][system] = _soak_system(system, options)
        except Exception as error:  # one failing system must not lose the others' results
            options.log(f"[{system}] failed: {type(error).__name__}: {error}")
            results["skipped"].append({"system": system, "reason": str(error)})
    return results


def _soak_system(system: str, options: SoakOptions) -> dict[str, Any]:
    peer = PEERS[PEER_OF[system]](options.replicas)
    if options.install:
        ensure_installed(peer.system)
    out: dict[str, Any] = {"runs": []}
    try:
        endpoint = peer.start()
        out["version"] = peer.version
        origin = time.monotonic()
        sampler = HostSampler({p.pid for p in peer.processes}, origin=origin).start()
        try:
            for name, plan in _yardsticks(options.yardstick):
                out[name] = _yardstick(peer.workdir.parent, plan, origin)
                options.log(f"[{system}] {name}: {_series_line(out[name]['mb_per_s'])}")
            runs = _run(_soak_runs(system, endpoint, options, origin))
        finally:
            out["host"] = sampler.stop()
        out["runs"] = runs
    finally:
        peer.stop()
    return out


def _yardsticks(plan: YardstickPlan | None) -> list[tuple[str, YardstickPlan]]:
    """The plain file as a naive writer keeps it (every page cached), then dropping its pages
    behind the same tail as Raftline's log: the machine's fall-off, and the file's best."""
    if plan is None:
        return []
    return [
        ("yardstick", replace(plan, cache_tail_bytes=-1)),
        ("yardstick_drop", replace(plan, cache_tail_bytes=LogConfig().cache_tail_bytes)),
    ]


def _yardstick(parent: Path, plan: YardstickPlan, origin: float) -> dict[str, Any]:
    began = time.monotonic() - origin
    directory = Path(tempfile.mkdtemp(prefix="raftline-yardstick-", dir=parent))
    directory.rmdir()
    series = plain_file_writer(directory, plan)
    return {
        "started_s": round(began, 1),
        "mb_per_s": [round(v, 1) for v in series],
        "plan": {
            "write_bytes": plan.write_bytes,
            "sync_bytes": plan.sync_bytes,
            "file_bytes": plan.file_bytes,
            "keep_files": plan.keep_files,
            "cache_tail_bytes": plan.cache_tail_bytes,
        },
    }


async def _soak_runs(
    system: str, endpoint: Any, options: SoakOptions, origin: float
) -> list[dict[str, Any]]:
    driver = driver_class(system)(endpoint)
    driver.retention_bytes = options.retention_bytes
    await asyncio.wait_for(driver.connect(), SETUP_TIMEOUT_S)
    w = options.workload
    max_bytes = options.max_bytes if driver.honours_retention else UNRETAINED_MAX_BYTES
    max_bytes = min(options.max_bytes, max_bytes)
    runs: list[dict[str, Any]] = []
    try:
        soak_workload = replace(w, producer_rate=0, duration_seconds=options.seconds)
        timed = _native_run if options.client == "native" else _timed_run
        first = await timed(system, driver, soak_workload, 0.0, max_bytes, origin, "max rate")
        runs.append(first)
        options.log(f"[{system}] {_run_line(first)}")
        sustained = first["sustained_msgs_per_s"]
        for fraction in options.fractions if sustained > 0 else []:
            rate = sustained * fraction
            fixed = replace(w, duration_seconds=options.fixed_seconds)
            label = f"{fraction:.0%} of sustained max"
            run = await timed(system, driver, fixed, rate, max_bytes, origin, label)
            runs.append(run)
            options.log(f"[{system}] {_run_line(run)}")
    finally:
        await asyncio.wait_for(driver.close(), 10)
    return runs


async def _timed_run(
    system: str,
    driver: Driver,
    workload: Workload,
    rate: float,
    max_bytes: int,
    origin: float,
    label: str,
) -> dict[str, Any]:
    await asyncio.to_thread(os.sync)  # no earlier run's dirty pages in this one's window
    run_id = uuid.uuid4().hex[:6]
    run = WorkloadRun(driver, replace(workload, warmup_seconds=0.0), run_id, rate)
    run.tally = tally = TimelineTally(Window(0, 0), cap_messages=max_bytes // workload.message_size)
    began = time.monotonic() - origin
    budget = workload.duration_seconds + 120
    try:
        result = await asyncio.wait_for(run.run(drain_seconds=10.0), budget)
    except Exception as error:  # reported with what was measured up to the failure
        tally.on_error(error)
        result = run.result()
    return _with_timeline(result, tally.timeline(workload.message_size), began, label)


async def _native_run(
    system: str,
    driver: Driver,
    workload: Workload,
    rate: float,
    max_bytes: int,
    origin: float,
    label: str,
) -> dict[str, Any]:
    await asyncio.to_thread(os.sync)
    began = time.monotonic() - origin
    cap = max_bytes // workload.message_size
    result = await native.run_workload(system, driver, workload, rate, warmup=0.0, max_messages=cap)
    timeline = result.pop("timeline")[:-1]  # the last second is partial
    for point in timeline:
        point["mb_per_s"] = point["msgs_per_s"] * workload.message_size / MB
    return _with_timeline(result, timeline, began, label)


def _with_timeline(
    result: dict[str, Any], timeline: list[dict[str, float]], began: float, label: str
) -> dict[str, Any]:
    size = result["message_size"]
    result.update(
        label=label,
        started_s=round(began, 1),
        timeline=timeline,
        sustained_msgs_per_s=round(sustained_rate(timeline), 1),
        quick_msgs_per_s=round(quick_rate(timeline), 1),
        acked_gb=round(result["acked"] * size / GB, 2),
    )
    return result


def _series_line(mb_per_s: list[float]) -> str:
    if not mb_per_s:
        return "no data"
    half = mb_per_s[len(mb_per_s) // 2 :]
    return (
        f"{sum(mb_per_s) / 1000:.1f} GB in {len(mb_per_s)} s, first 3 s "
        f"{statistics.fmean(mb_per_s[:3]):.0f} MB/s, second half {statistics.fmean(half):.0f} MB/s"
    )


def _run_line(run: dict[str, Any]) -> str:
    size = run["message_size"]
    p99 = (run["publish_latency_ms"] or {}).get("p99", float("nan"))
    text = (
        f"{run['label']}: {run['acked_gb']} GB in {run['duration_s']:.0f} s, quick "
        f"{run['quick_msgs_per_s'] * size / MB:.0f} MB/s, sustained "
        f"{run['sustained_msgs_per_s'] * size / MB:.0f} MB/s "
        f"({run['sustained_msgs_per_s']:.0f} msg/s), ack p99 {p99:.1f} ms"
    )
    if run["errors"]:
        text += f", {run['errors']} errors ({run['first_error']})"
    return text


def default_workload() -> Workload:
    return load_workload(SOAK_WORKLOAD_DIR / "soak-1-partition-1kb.yaml")


def write(results: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json, results.md and one soak-<system>.png per system into `out`."""
    from bench.soak_report import charts, markdown

    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "soak.json", "markdown": out / "soak.md"}
    paths["json"].write_text(json.dumps(results, indent=2) + "\n")
    paths["markdown"].write_text(markdown(results))
    for chart in charts(results, out):
        paths[chart.stem] = chart
    return paths
