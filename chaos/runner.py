"""One chaos run end to end: cluster up, workload under a fault schedule, heal, final reads, check.

Owns the phases of a run and their time bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftline.chaos import report
from raftline.chaos.cluster import Cluster, ClusterError, ComposeCluster, StaticCluster
from raftline.chaos.eos_workload import EosWorkload
from raftline.chaos.group_workload import GroupWorkload
from raftline.chaos.history import Recorder
from raftline.chaos.nemesis import Schedule, make_faults
from raftline.chaos.route_workload import RouteWorkload
from raftline.chaos.share_workload import ShareWorkload
from raftline.chaos.stream_workload import StreamConsumer
from raftline.chaos.watchdog import Watchdog
from raftline.chaos.workload import Workload, session

# --tiered: small segments uploaded as they seal, local disk keeping almost nothing, so that reads
# from early offsets (the rereaders', the final reads) come from the bucket.
TIERED_TOPIC_CONFIG = {
    "remote.storage.enable": "true",
    "segment.bytes": "16384",
    "local.retention.bytes": "1",
}


@dataclass
class RunConfig:
    nodes: int = 5
    time_limit_s: float = 120.0  # workload under faults
    recovery_s: float = 20.0  # workload after the last heal, no faults
    nemesis: list[str] = field(default_factory=lambda: ["partition", "kill", "pause"])
    out_dir: Path = Path("chaos-results")
    compose_file: Path = Path("docker-compose.yml")
    urls: list[str] = field(default_factory=list)  # nodes run elsewhere: no compose, no faults
    project: str = "raftline-chaos"
    topic: str = "chaos"
    partitions: int = 4
    producers: int = 8
    consumers: int = 4
    seed: int = 0
    bring_up: bool = True
    tear_down: bool = True
    ready_timeout_s: float = 120.0
    final_read_s: float = 180.0
    # "queue": producers, consumers, metadata; "group": a consumer group; "share": a queue's
    # receivers (share group) with a dead-letter topic; "route": publishers through a fanout
    # exchange to several topics (each publish one transaction); "idempotent": idempotent
    # producers retrying every ambiguous failure; "transactions": transactions and
    # read_committed readers
    workload: str = "queue"
    members: int = 4  # group members (workload "group")
    group: str = "chaos-group"
    session_timeout_ms: int = 6000
    receivers: int = 4  # queue receivers (workload "share")
    lock_ms: int = 1_000  # the queue's lock (workload "share")
    max_deliveries: int = 3  # the queue's (workload "share")
    tiered: bool = False  # the topic in object storage, read back from offset 0 by rereaders
    rereaders: int = 2  # (tiered) clients reading a partition from offset 0 over and over
    streamers: int = 2  # push consumers following partitions over topic streams (workload "queue")
    destinations: int = 3  # topics bound to the exchange (workload "route")

    @property
    def bound_s(self) -> float:
        """The whole run's time bound: the phases' own bounds (faults, recovery, two waits for
        readiness, final reads) and 15 minutes for compose, the nemesis' last fault, checking."""
        phases = self.time_limit_s + self.recovery_s + self.final_read_s
        return phases + 2 * self.ready_timeout_s + 900


def _say(text: str) -> None:
    """A progress line on stderr, so a log shows which phase a run reached."""
    print(f"chaos {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _heal(cluster: Cluster) -> None:
    """Lifts whatever a fault left behind and brings dead nodes back."""
    cluster.heal_all()
    for node in cluster.nodes:
        if not cluster.is_running(node):
            cluster.start(node)


async def _faults(cluster: Cluster, schedule: Schedule, until: float) -> None:
    nemesis = threading.Thread(target=schedule.run, name="nemesis", daemon=True)
    nemesis.start()
    await asyncio.sleep(max(0.0, until - time.monotonic()))
    schedule.stopping.set()
    await asyncio.to_thread(nemesis.join, 120)
    await asyncio.to_thread(_heal, cluster)
    _say("faults over, cluster healed; clients go on through the recovery period")


async def _drive(
    config: RunConfig,
    cluster: Cluster,
    work: Workload,
    http: Any,
    schedule: Schedule,
    faults_until: float,
    clients: list[Any],
) -> bool:
    """Runs the faults, `clients` and the leader watchers through the recovery period; whether
    the cluster was ready after the last heal."""
    until = faults_until + config.recovery_s
    helpers = [work.nodes.probe(http, until), work.watch_leaders(http, until)]
    _say(f"workload and faults for {config.time_limit_s:.0f} s")
    await asyncio.gather(_faults(cluster, schedule, faults_until), *clients, *helpers)
    ready = await asyncio.to_thread(cluster.wait_ready, config.ready_timeout_s)
    _say(f"clients done; cluster ready: {ready}; final reads")
    return ready


async def _workload(
    config: RunConfig, cluster: Cluster, recorder: Recorder, schedule: Schedule
) -> dict[str, Any]:
    rng = random.Random(config.seed)
    urls = [n.http_url for n in cluster.nodes]
    work = Workload(recorder, urls, config.topic, config.partitions, rng, min(3, len(urls)))
    if config.tiered:
        work.topic_config = dict(TIERED_TOPIC_CONFIG)
    async with session() as http:
        if not await work.create_topic(http, time.monotonic() + 60):
            raise ClusterError(f"could not create topic {config.topic!r} within 60 s")
        faults_until = time.monotonic() + config.time_limit_s
        # The clients go on through a quiet recovery period after the last heal.
        until = faults_until + config.recovery_s
        if config.workload in ("idempotent", "transactions"):
            return await _eos_clients(config, cluster, work, http, schedule, faults_until)
        if config.workload == "route":
            return await _route_clients(config, cluster, work, http, schedule, faults_until)
        clients = work.producers(http, config.producers, until)
        if config.workload == "group":
            group = _group_clients(config, cluster, work, http, schedule, clients, faults_until)
            return await group
        if config.workload == "share":
            share = _share_clients(config, cluster, work, http, schedule, clients, faults_until)
            return await share
        clients += [
            work.consume(http, config.producers + c, c % config.partitions, until)
            for c in range(config.consumers)
        ]
        clients.append(work.metadata(http, config.producers + config.consumers, until))
        first = config.producers + config.consumers + 2  # after metadata and final reads
        if config.tiered:
            clients += [
                work.reread(http, first + r, r % config.partitions, until)
                for r in range(config.rereaders)
            ]
        first += config.rereaders
        clients += [
            StreamConsumer(work, first + s, s % config.partitions).follow(http, until)
            for s in range(config.streamers)
        ]
        ready = await _drive(config, cluster, work, http, schedule, faults_until, clients)
        complete = await work.final_reads(
            http, config.producers + config.consumers + 1, time.monotonic() + config.final_read_s
        )
    return {"ready_after_heal": ready, "final_reads_complete": complete}


async def _group_clients(
    config: RunConfig,
    cluster: Cluster,
    work: Workload,
    http: Any,
    schedule: Schedule,
    producers: list[Any],
    faults_until: float,
) -> dict[str, Any]:
    """The group workload's members next to the producers, then its final phase."""
    until = faults_until + config.recovery_s
    group = GroupWorkload(work, config.group, session_timeout_ms=config.session_timeout_ms)
    members = [group.member(http, config.producers + m, m, until) for m in range(config.members)]
    observer = group.observe(http, config.producers + config.members, until)
    clients = [*producers, *members, observer]
    ready = await _drive(config, cluster, work, http, schedule, faults_until, clients)
    final = await group.final_phase(
        http, config.producers + config.members + 1, time.monotonic() + config.final_read_s
    )
    done = final["consumed_to_end"] and final["offsets_read"]
    return {"ready_after_heal": ready, "final_reads_complete": {"group": done}, "group": final}


async def _share_clients(
    config: RunConfig,
    cluster: Cluster,
    work: Workload,
    http: Any,
    schedule: Schedule,
    producers: list[Any],
    faults_until: float,
) -> dict[str, Any]:
    """The queue workload's receivers next to the producers, then its drain and final read."""
    until = faults_until + config.recovery_s
    share = ShareWorkload(work, lock_ms=config.lock_ms, max_deliveries=config.max_deliveries)
    first = config.producers
    if not await share.setup(http, first + config.receivers + 2, time.monotonic() + 60):
        raise ClusterError(f"could not create queue {share.queue!r} within 60 s")
    receivers = [share.receiver(http, first + r, until) for r in range(config.receivers)]
    clients = [*producers, *receivers]
    ready = await _drive(config, cluster, work, http, schedule, faults_until, clients)
    final = await share.final_phase(
        http, first + config.receivers, time.monotonic() + config.final_read_s
    )
    done = final["drained"] and final["dead_letters_read"]
    return {"ready_after_heal": ready, "final_reads_complete": {"share": done}, "share": final}


async def _eos_clients(
    config: RunConfig,
    cluster: Cluster,
    work: Workload,
    http: Any,
    schedule: Schedule,
    faults_until: float,
) -> dict[str, Any]:
    """The exactly-once workloads (chaos/eos_workload.py), then their final reads."""
    until = faults_until + config.recovery_s
    eos = EosWorkload(work, readers=config.consumers)
    if config.workload == "idempotent":
        clients = [eos.idempotent_producer(http, p, until) for p in range(config.producers)]
    else:
        clients = [eos.txn_producer(http, p, until) for p in range(config.producers)]
        first = config.producers
        clients += [eos.reader(http, first + r, until) for r in range(config.consumers)]
    ready = await _drive(config, cluster, work, http, schedule, faults_until, clients)
    process = config.producers + config.consumers
    deadline = time.monotonic() + config.final_read_s
    if config.workload == "idempotent":
        complete = await work.final_reads(http, process, deadline)
    else:
        complete = await eos.final_committed_reads(http, process, deadline)
    return {"ready_after_heal": ready, "final_reads_complete": complete}


async def _route_clients(
    config: RunConfig,
    cluster: Cluster,
    work: Workload,
    http: Any,
    schedule: Schedule,
    faults_until: float,
) -> dict[str, Any]:
    """The routing workload's publishers (in place of the producers), then its final read."""
    until = faults_until + config.recovery_s
    route = RouteWorkload(work, destinations=config.destinations)
    if not await route.setup(http, time.monotonic() + 60):
        raise ClusterError(f"could not set up exchange {route.exchange!r} within 60 s")
    publishers = [route.publisher(http, p, until) for p in range(config.producers)]
    ready = await _drive(config, cluster, work, http, schedule, faults_until, publishers)
    final = await route.final_phase(http, config.producers, time.monotonic() + config.final_read_s)
    done = final["destinations_read"]
    return {"ready_after_heal": ready, "final_reads_complete": {"route": done}, "route": final}


def run(config: RunConfig) -> dict[str, Any]:
    """Performs a run and writes its files; the returned result has `valid` and `files`."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    cluster: Cluster = (
        StaticCluster(config.urls)
        if config.urls
        else ComposeCluster(config.nodes, config.project, config.compose_file)
    )
    watchdog = Watchdog(config.bound_s, lambda: _leave(cluster, config.tear_down))
    watchdog.start()
    try:
        return _run(config, cluster, watchdog)
    finally:
        watchdog.stop()


def _run(config: RunConfig, cluster: Cluster, watchdog: Watchdog) -> dict[str, Any]:
    recorder = Recorder(config.out_dir / "history.jsonl")
    try:
        if config.bring_up:
            _say(f"starting {config.nodes} nodes")
            cluster.up()
        else:
            cluster.refresh()
        if not cluster.wait_ready(config.ready_timeout_s):
            raise ClusterError(f"cluster not ready within {config.ready_timeout_s:.0f} s")
        faults = make_faults(cluster, config.nemesis, config.topic)
        schedule = Schedule(faults, recorder, random.Random(config.seed + 1))
        with asyncio.Runner() as runner:
            watchdog.watch_loop(runner.get_loop())
            phases = runner.run(_workload(config, cluster, recorder, schedule))
    finally:
        recorder.close()
        with contextlib.suppress(ClusterError, OSError):  # logs help; a run never fails on them
            cluster.save_logs(config.out_dir / "node-logs")
        _leave(cluster, config.tear_down)
    ops = recorder.ops
    _say(f"checking {len(ops)} operations")
    result = report.analyse(ops)
    # Unfinished final reads make lost-write and unseen analysis meaningless: never a pass.
    finished = phases["ready_after_heal"] and all(phases["final_reads_complete"].values())
    result = {
        **result,
        "valid": result["valid"] and finished,
        "run": phases,
        "config": {k: str(v) for k, v in vars(config).items()},
    }
    result["files"] = report.write_outputs(config.out_dir, ops, result)
    return result


def _leave(cluster: Cluster, tear_down: bool) -> None:
    """Lifts the faults and, unless the cluster is to be kept, takes it down."""
    with contextlib.suppress(ClusterError):  # nodes already gone: nothing left to heal
        cluster.heal_all()
    if tear_down:
        cluster.down()
