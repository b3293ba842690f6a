"""The side-by-side comparison: starts each peer, runs every workload through its driver, stops it.

Owns the run order, the half-of-max rate derivation, time bounds per workload, and skips.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bench import native
from bench.consumers import collect_garbage_rarely
from bench.drivers import driver_class
from bench.drivers.base import Endpoint
from bench.peers import PEERS, PeerError, ensure_installed
from bench.report import PEER_ORDER
from bench.runner import WorkloadRun
from bench.workload import Workload

SYSTEMS = PEER_ORDER  # every system a comparison knows, in the order reports list them
# System -> the peer (bench.peers.PEERS) that serves it; systems sharing a peer share its servers.
PEER_OF = {
    "raftline": "raftline",
    "raftline-idempotent": "raftline",
    "raftline-post": "raftline",
    "raftline-nofsync": "raftline-nofsync",
    "nats": "nats",
    "rabbitmq-quorum": "rabbitmq",
    "rabbitmq-stream": "rabbitmq",
    "redis": "redis",
}
# Peers this script cannot run with three replicas on one host, and why.
NO_REPLICATION: dict[str, str] = {}
SETUP_TIMEOUT_S = 60.0


@dataclass
class CompareOptions:
    """What to run: systems, workloads, replication factors, and how long each phase may take."""

    workloads: list[Workload]
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    replicas: list[int] = field(default_factory=lambda: [1])
    quick: bool = True
    install: bool = True
    log: Any = print
    # "python": the drivers in bench/drivers; "native": the generator in bench/native.
    clients: list[str] = field(default_factory=lambda: ["python", "native"])

    @property
    def drain_seconds(self) -> float:
        return 5.0 if self.quick else 30.0


def compare(options: CompareOptions) -> dict[str, Any]:
    """Run the whole matrix; returns {"runs": [...], "skipped": [...], "peers": {...}}."""
    results: dict[str, Any] = {
        "runs": [],
        "native_runs": [],
        "skipped": [],
        "peers": {},
        "durability": {},
    }
    run_id = uuid.uuid4().hex[:6]
    if "native" in options.clients:
        try:
            native.ensure_built()
        except (native.NativeError, OSError, subprocess.SubprocessError) as error:
            options.log(f"native load generator skipped: {error}")
            results["skipped"].append({"system": "native", "replicas": 0, "reason": str(error)})
            options.clients = [c for c in options.clients if c != "native"]
    for replicas in options.replicas:
        for peer_name in dict.fromkeys(PEER_OF[s] for s in options.systems):
            systems = [s for s in options.systems if PEER_OF[s] == peer_name]
            _run_peer(peer_name, systems, replicas, run_id, options, results)
    return results


def _run_peer(
    peer_name: str,
    systems: list[str],
    replicas: int,
    run_id: str,
    options: CompareOptions,
    results: dict[str, Any],
) -> None:
    def skip(reason: str) -> None:
        for system in systems:
            options.log(f"[{system} r{replicas}] skipped: {reason}")
            results["skipped"].append({"system": system, "replicas": replicas, "reason": reason})

    if replicas > 1 and peer_name in NO_REPLICATION:
        skip(NO_REPLICATION[peer_name])
        return
    peer = PEERS[peer_name](replicas)
    try:
        if options.install:
            ensure_installed(peer.system)
        started = time.monotonic()
        endpoint = peer.start()
        options.log(f"[{peer_name} r{replicas}] ready in {time.monotonic() - started:.1f} s")
        results["peers"][peer.system] = peer.version
        for system in systems:
            key = f"{system} r{replicas}"
            if "native" in options.clients:
                try:
                    native_runs = _run(_run_native(system, endpoint, options, f"{key} native"))
                except Exception as error:  # the Python-client runs still go ahead
                    options.log(f"[{key} native] failed: {type(error).__name__}: {error}")
                    native_runs = []
                results["native_runs"].extend(native_runs)
                if native_runs:
                    results["durability"].setdefault(key, native_runs[0]["durability"])
            if "python" not in options.clients:
                continue
            try:
                runs = _run(_run_system(system, endpoint, run_id, options, key))
            except Exception as error:  # one broken driver must not end the whole comparison
                options.log(f"[{key}] failed: {type(error).__name__}: {error}")
                results["skipped"].append(
                    {"system": system, "replicas": replicas, "reason": f"driver failed: {error}"}
                )
                continue
            results["runs"].extend(runs)
            if runs:
                results["durability"][key] = runs[0]["durability"]
    except (PeerError, OSError) as error:
        skip(f"{type(error).__name__}: {error}")
        tail = peer.log_tail()
        if tail:
            options.log(tail)
    finally:
        peer.stop()


def _run(coroutine: Coroutine[Any, Any, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    collect_garbage_rarely()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


async def _run_system(
    system: str,
    endpoint: Endpoint,
    run_id: str,
    options: CompareOptions,
    key: str,
) -> list[dict[str, Any]]:
    """Every workload on one system."""
    driver = driver_class(system)(endpoint)
    await asyncio.wait_for(driver.connect(), SETUP_TIMEOUT_S)

    async def run_one(workload: Workload, rate: float | None) -> dict[str, Any] | None:
        if workload.kind == "queue-ack" and not driver.queues:
            options.log(f"[{key}] {workload.name}: no queue driver for {system}")
            return None
        if rate is None:
            options.log(f"[{key}] {workload.name}: no max rate from {workload.rate_of_workload}")
            return None
        result = await _run_workload(driver, workload, run_id, rate, options)
        if workload.kind == "queue-ack":
            result.update(durability=driver.queue_durability)  # type: ignore[attr-defined]
        return result

    try:
        return await _run_workloads(driver, system, endpoint, options, key, run_one)
    finally:
        try:
            await asyncio.wait_for(driver.close(), 10)
        except Exception as error:  # a failing close must not lose the results
            options.log(f"[{key}] close failed: {error}")


async def _run_native(
    system: str, endpoint: Endpoint, options: CompareOptions, key: str
) -> list[dict[str, Any]]:
    """Every log workload through the native generator (topics made by the Python driver)."""
    driver = driver_class(system)(endpoint)
    await asyncio.wait_for(driver.connect(), SETUP_TIMEOUT_S)

    async def run_one(workload: Workload, rate: float | None) -> dict[str, Any] | None:
        if workload.kind != "log" or workload.topics != 1 or rate is None:
            return None
        await asyncio.to_thread(os.sync)
        try:
            return await native.run_workload(system, driver, workload, rate)
        except Exception as error:  # one failing workload is reported, the rest still run
            options.log(f"[{key}] {workload.name} failed: {error}")
            return None

    try:
        return await _run_workloads(driver, system, endpoint, options, key, run_one)
    finally:
        await asyncio.wait_for(driver.close(), 10)


async def _run_workloads(
    driver: Any,
    system: str,
    endpoint: Endpoint,
    options: CompareOptions,
    key: str,
    run_one: Callable[[Workload, float | None], Awaitable[dict[str, Any] | None]],
) -> list[dict[str, Any]]:
    """Each workload through `run_one` (None: skipped) at its target rate; a max-rate workload's
    clean result sets the rate of the workloads paced from it."""
    runs: list[dict[str, Any]] = []
    max_rates: dict[str, float] = {}
    for workload in options.workloads:
        if options.quick:
            workload = workload.for_quick_run()
        result = await run_one(workload, _target_rate(workload, max_rates))
        if result is None:
            continue
        result.setdefault("durability", driver.durability)
        result.update(system=system, replicas=endpoint.replicas)
        runs.append(result)
        if workload.max_rate and not result["errors"]:
            max_rates[workload.name] = result["publish_msgs_per_s"]
        options.log(f"[{key}] {_one_line(result)}")
    return runs


def _target_rate(workload: Workload, max_rates: dict[str, float]) -> float | None:
    """Messages per second to pace at: 0 for max rate, None if the reference max is missing."""
    if workload.producer_rate:
        return float(workload.producer_rate)
    if not workload.rate_of_workload:
        return 0.0
    measured = max_rates.get(workload.rate_of_workload, 0.0)
    return measured * workload.rate_fraction if measured > 0 else None


async def _run_workload(
    driver: Any, workload: Workload, run_id: str, rate: float, options: CompareOptions
) -> dict[str, Any]:
    # Dirty pages a previous workload left (systems that do not fsync leave gigabytes) would
    # be written back during this one's window: flush them first, for every system alike.
    await asyncio.to_thread(os.sync)
    run = WorkloadRun(driver, workload, run_id, rate)
    budget = workload.warmup_seconds + workload.duration_seconds + 3 * options.drain_seconds + 60
    try:
        return await asyncio.wait_for(run.run(options.drain_seconds), budget)
    except Exception as error:  # one failing workload is reported, the rest still run
        run.tally.on_error(error)
        return run.result()


def _one_line(result: dict[str, Any]) -> str:
    ack_p99 = (result["publish_latency_ms"] or {}).get("p99", float("nan"))
    e2e_p99 = (result["e2e_latency_ms"] or {}).get("p99", float("nan"))
    text = (
        f"{result['workload']}: pub {result['publish_msgs_per_s']:.0f} msg/s "
        f"({result['publish_mb_per_s']:.1f} MB/s), cons {result['consume_msgs_per_s']:.0f} msg/s, "
        f"ack p99 {ack_p99:.1f} ms, e2e p99 {e2e_p99:.1f} ms"
    )
    if result["errors"]:
        text += f", {result['errors']} errors ({result['first_error']})"
    return text
