"""RF 3 latency against the disk's own fsync tail, measured in the same session, sides alternated.

Owns the RF 3 fixed-rate run (three `raftline serve --fsync always` nodes, end-to-end p99, each
write-path stage's p50/p99 from the nodes' /metrics, CPU and run-queue wait per process), the
per-node write pattern read from /metrics and the data directories, and the plain fsync probe
that replays that pattern (same writers, sizes and rate) on the same disk; then the machine's
wake-up tail (bench.wakeup_ring) right after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.drivers.base import Endpoint
from bench.drivers.raftline import RaftlineDriver
from bench.histogram import Histogram
from bench.host_samples import _cpu_and_rss
from bench.native import StampedRun, ensure_built
from bench.node_procs import NodeCluster, running_nodes
from bench.runner import WorkloadRun
from bench.wakeup_ring import HOPS, ring_tail
from bench.workload import WORKLOAD_DIR, load_workload
from raftline.node.rounds import FSYNC_THREADS
from raftline.node.stages import BUCKETS_S, METRIC, STAGES

NODES = 3
PORT_BASE = 19400
DRAIN_S = 5.0
TARGET_P99_MS = 20.0
RING_LAPS_PER_S = 200  # the producer's batches at half max: one per 5 ms linger
FSYNCS = "raftline_raft_fsyncs_total"
# requests a node passed on to the partition's leader: the client's leader was stale
FORWARDED = "raftline_forwarded_requests_total"
STAGE_LINE = re.compile(
    rf'^{METRIC}_bucket\{{node="\d+",stage="(\w+)",le="([^"]+)"\}} (\d+)$', re.M
)


@dataclass(frozen=True)
class WritePattern:
    """What one node did to its disk per second: log fsyncs and bytes appended."""

    fsyncs_per_s: float
    bytes_per_s: float

    @property
    def bytes_per_fsync(self) -> int:
        return max(1, int(self.bytes_per_s / max(self.fsyncs_per_s, 1e-9)))


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _counters(cluster: NodeCluster, names: tuple[str, ...]) -> dict[str, list[int]]:
    """Each named counter of every node (0 where a node has none yet)."""
    counts: dict[str, list[int]] = {name: [] for name in names}
    for node in cluster.nodes:
        text = _metrics(node.url)
        for name in names:
            found = re.search(rf'^{name}\{{node="\d+"\}} (\d+)$', text, re.M)
            counts[name].append(int(found.group(1)) if found else 0)
    return counts


def _stage_buckets(cluster: NodeCluster) -> dict[str, list[int]]:
    """Cumulative bucket counts per write-path stage, summed over the nodes."""
    totals = {stage: [0] * (len(BUCKETS_S) + 1) for stage in STAGES}
    for node in cluster.nodes:
        bounds: dict[str, int] = defaultdict(int)
        for stage, _, count in STAGE_LINE.findall(_metrics(node.url)):
            totals[stage][bounds[stage]] += int(count)
            bounds[stage] += 1
    return totals


def stage_summary(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, Any]:
    """Per stage, the count in the window and the bucket bounds (ms) holding its p50 and p99."""
    out: dict[str, Any] = {}
    for stage in STAGES:
        cumulative = [a - b for a, b in zip(after[stage], before[stage], strict=True)]
        total = cumulative[-1]
        if not total:
            continue
        summary: dict[str, Any] = {"count": total}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            at = next(i for i, c in enumerate(cumulative) if c >= q * total)
            summary[name] = BUCKETS_S[at] * 1000 if at < len(BUCKETS_S) else float("inf")
        out[stage] = summary
    return out


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return response.read().decode()


def _run_delay_s(pid: int) -> float:
    """Seconds the process's main thread (its event loop) has waited on a run queue, ready to
    run but without a CPU (schedstat's second field); 0 where the kernel keeps none."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuWatch:
    """Per watched process, averaged over the time between `start()` and `stop()`: CPU %, and
    the % of that time its main thread was runnable but waiting for a CPU (scheduling)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def start(self) -> CpuWatch:
        self.began = time.monotonic()
        self.before, _ = _cpu_and_rss(list(self.pids.values()))
        self.delays = {pid: _run_delay_s(pid) for pid in self.pids.values()}
        return self

    def stop(self) -> tuple[dict[str, float], dict[str, float]]:
        after, _ = _cpu_and_rss(list(self.pids.values()))
        seconds = time.monotonic() - self.began
        cpu = {
            name: round(100 * (after.get(pid, 0.0) - self.before.get(pid, 0.0)) / seconds, 1)
            for name, pid in self.pids.items()
        }
        waits = {
            name: round(100 * (_run_delay_s(pid) - self.delays[pid]) / seconds, 1)
            for name, pid in self.pids.items()
        }
        return cpu, waits


def raftline_side(
    rate: float,
    seconds: float,
    root: Path,
    fsync: str = "always",
    flags: dict[str, str] | None = None,
    producer: str = "native",
    consumer: str = "native",
) -> dict[str, Any]:
    """One fixed-rate RF 3 run of the 16-partition 1 KB half-max workload at `rate` msgs/s
    (0: as fast as acks allow) on fresh nodes started with further serve `flags`; e2e latency
    plus each node's write pattern. A native consumer needs the native producer."""
    workload = load_workload(WORKLOAD_DIR / "1-topic-16-partitions-1kb-half-max.yaml")
    workload = replace(workload, duration_seconds=seconds, warmup_seconds=5.0)
    native = producer == "native"
    consumer = consumer if native else "python"
    with running_nodes(root, NODES, PORT_BASE, fsync, flags) as cluster:
        pids = {f"node-{n.node_id}": n.pid for n in cluster.nodes}
        pids["bench (Python)" if native else "bench (producer)"] = os.getpid()
        ports = {n.node_id: int(n.http.rsplit(":", 1)[1]) for n in cluster.nodes}
        port = ports[cluster.nodes[0].node_id]
        driver = RaftlineDriver(Endpoint("127.0.0.1", {"http": port}, NODES, {"fsync": fsync}))
        run_id = uuid.uuid4().hex[:6]
        run = (
            StampedRun(driver, workload, run_id, rate, ports, consumer)
            if native
            else WorkloadRun(driver, workload, run_id, rate)
        )
        marks: dict[str, Any] = {}

        def mark_at_window() -> None:
            # The measurement window opens after warm-up: sample the disk pattern inside it.
            time.sleep(workload.warmup_seconds + 0.5)
            marks["t0"] = time.monotonic()
            marks["counts0"] = _counters(cluster, (FSYNCS, FORWARDED))
            marks["stages0"] = _stage_buckets(cluster)
            marks["bytes0"] = [_dir_bytes(n.data_dir) for n in cluster.nodes]
            if isinstance(run, StampedRun) and run.producer_pid is not None:
                pids["native producer"] = run.producer_pid
            if run.consumer_pid is not None:
                pids[f"{consumer} consumer"] = run.consumer_pid
            marks["cpu"] = CpuWatch(pids).start()
            time.sleep(max(1.0, seconds - 1.0))
            marks["counts1"] = _counters(cluster, (FSYNCS, FORWARDED))
            marks["stages1"] = _stage_buckets(cluster)
            marks["bytes1"] = [_dir_bytes(n.data_dir) for n in cluster.nodes]
            marks["cpu_pct"], marks["runq_wait_pct"] = marks["cpu"].stop()
            marks["load"] = os.getloadavg()[0]
            marks["t1"] = time.monotonic()

        async def go() -> dict[str, Any]:
            await driver.connect()
            try:
                return await run.run(DRAIN_S)
            finally:
                await driver.close()

        sampler = threading.Thread(target=mark_at_window, daemon=True)
        sampler.start()
        result = asyncio.run(go())
        sampler.join(timeout=seconds + 30)
    span = marks["t1"] - marks["t0"]
    before, after = marks["counts0"], marks["counts1"]
    patterns = [
        WritePattern((f1 - f0) / span, (b1 - b0) / span)
        for f0, f1, b0, b1 in zip(
            before[FSYNCS], after[FSYNCS], marks["bytes0"], marks["bytes1"], strict=True
        )
    ]
    return {
        "side": "raftline",
        "fsync": fsync,
        "flags": flags or {},
        "producer": "native" if native else "python",
        "consumer": consumer,
        "target_rate": rate,
        "publish_msgs_per_s": result["publish_msgs_per_s"],
        "consume_msgs_per_s": result["consume_msgs_per_s"],
        "e2e_ms": result["e2e_latency_ms"],
        "ack_ms": result["publish_latency_ms"],
        "errors": result["errors"],
        "forwarded_requests": sum(after[FORWARDED]) - sum(before[FORWARDED]),
        "nodes": [
            {
                "fsyncs_per_s": round(p.fsyncs_per_s),
                "bytes_per_fsync": p.bytes_per_fsync,
                "mb_per_s": round(p.bytes_per_s / 1e6, 1),
            }
            for p in patterns
        ],
        "cpu_pct": marks["cpu_pct"],
        "runq_wait_pct": marks["runq_wait_pct"],
        "load_1m": marks["load"],
        "stages_ms": stage_summary(marks["stages0"], marks["stages1"]),
    }


def _probe_writer(directory: str, writers: int, fsyncs_per_s: float, size: int, seconds: float):
    """One process standing for one node: `writers` threads (the node's fsync pool), each with
    its own file, together appending `size` bytes + fdatasync `fsyncs_per_s` times a second.
    Returns (fdatasync latencies us, write+fdatasync latencies from the intended start us)."""
    block = os.urandom(size)
    per_thread_interval = writers / fsyncs_per_s
    began = time.monotonic() + 0.2
    sync_us: list[int] = []
    late_us: list[int] = []
    lock = threading.Lock()

    def loop(index: int) -> None:
        path = os.path.join(directory, f"w{os.getpid()}-{index}.log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        mine_sync, mine_late = [], []
        due = began + index * per_thread_interval / writers
        try:
            while due < began + seconds:
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                os.write(fd, block)
                t0 = time.monotonic()
                os.fdatasync(fd)
                t1 = time.monotonic()
                mine_sync.append(int((t1 - t0) * 1e6))
                mine_late.append(int((t1 - due) * 1e6))
                due += per_thread_interval
        finally:
            os.close(fd)
            os.unlink(path)
        with lock:
            sync_us.extend(mine_sync)
            late_us.extend(mine_late)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sync_us, late_us


def disk_side(nodes: list[dict[str, Any]], seconds: float, threads: int) -> dict[str, Any]:
    """Replay the nodes' write pattern with plain files: one process per node."""
    directory = tempfile.mkdtemp(prefix="fsync-tail-", dir=os.environ.get("BENCH_DIR"))
    sync, late = Histogram(), Histogram()
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    try:
        with ProcessPoolExecutor(len(nodes)) as pool:
            futures = [
                pool.submit(
                    _probe_writer,
                    directory,
                    threads,
                    max(1.0, n["fsyncs_per_s"]),
                    n["bytes_per_fsync"],
                    seconds,
                )
                for n in nodes
            ]
            for future in futures:
                sync_us, late_us = future.result(timeout=seconds + 60)
                for value in sync_us:
                    sync.record(value, 1)
                for value in late_us:
                    late.record(value, 1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "side": "disk",
        "writers": f"{len(nodes)} processes x {threads} threads",
        "fsyncs_per_s": round(sync.total / (time.monotonic() - began)),
        "fdatasync_ms": sync.summary_ms(),
        "write_fdatasync_from_due_ms": late.summary_ms(),
        "load_1m_before": load_before,
        "load_1m": os.getloadavg()[0],
    }


def _ms(summary: dict[str, float] | None) -> str:
    if not summary:
        return "-"
    return " / ".join(f"{summary[k]:.1f}" for k in ("p50", "p99", "p99.9", "max"))


def _stages(stages: dict[str, Any]) -> str:
    """One line: each stage's p50 / p99 bucket bounds in ms, over all nodes."""
    parts = [f"{name} {s['p50']:g}/{s['p99']:g}" for name, s in stages.items()]
    return "stage ms p50/p99 (bucket bounds): " + ", ".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fsync_tail", description=__doc__)
    parser.add_argument(
        "--rate", type=float, default=0, help="msgs/s of 1 KB; 0: half the max measured first"
    )
    parser.add_argument("--max-seconds", type=float, default=30.0, help="window of the max run")
    parser.add_argument("--seconds", type=float, default=30.0, help="window of each side")
    parser.add_argument("--rounds", type=int, default=2, help="raftline then disk, repeated")
    parser.add_argument("--threads", type=int, default=FSYNC_THREADS, help="writers per node")
    parser.add_argument("--fsync", default="always", help="the nodes' --fsync (never: a contrast)")
    parser.add_argument(
        "--switch-interval-us", type=int, default=None, help="the nodes' --switch-interval-us"
    )
    parser.add_argument(
        "--producer",
        choices=("native", "python"),
        default="native",
        help="fixed-rate producer: bench/native (stamping, as the Python one) or Python",
    )
    parser.add_argument(
        "--consumer",
        choices=("native", "python"),
        default=None,
        help="consumer: bench/native's consume mode or the Python consumer process "
        "(default: the producer's kind; native needs the native producer)",
    )
    parser.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = parser.parse_args(argv)
    args.consumer = args.consumer or args.producer
    if args.consumer == "native" and args.producer != "native":
        parser.error("--consumer native needs --producer native")
    if args.producer == "native":
        ensure_built()
    flags = {}
    if args.switch_interval_us is not None:
        flags["switch-interval-us"] = str(args.switch_interval_us)
    if args.rate <= 0:
        root = Path(tempfile.mkdtemp(prefix="rf3-max-", dir=os.environ.get("BENCH_DIR")))
        try:
            top = raftline_side(
                0, args.max_seconds, root, args.fsync, flags, "native", args.consumer
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
        args.rate = round(top["publish_msgs_per_s"] / 2)
        print(
            f"max rate over {args.max_seconds:.0f} s (after 5 s warm-up): "
            f"{top['publish_msgs_per_s']:.0f} msg/s, load {top['load_1m']:.1f}; "
            f"fixed rate {args.rate} msg/s",
            flush=True,
        )
    for round_no in range(args.rounds):
        root = Path(tempfile.mkdtemp(prefix="rf3-", dir=os.environ.get("BENCH_DIR")))
        try:
            ours = raftline_side(
                args.rate, args.seconds, root, args.fsync, flags, args.producer, args.consumer
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
        disk = disk_side(ours["nodes"], args.seconds, args.threads)
        ring = ring_tail(RING_LAPS_PER_S, args.seconds)
        ring["load_1m"] = os.getloadavg()[0]
        stamp = time.strftime("%H:%M", time.gmtime())
        print(
            f"[{stamp}] round {round_no + 1}: raftline --fsync {args.fsync} {flags or ''} "
            f"({ours['producer']} producer, {ours['consumer']} consumer) "
            f"{ours['publish_msgs_per_s']:.0f} msg/s, "
            f"e2e ms p50/p99/p99.9/max {_ms(ours['e2e_ms'])}, ack {_ms(ours['ack_ms'])}, "
            f"load {ours['load_1m']:.1f}, cpu% {ours['cpu_pct']}, "
            f"main thread waiting for a CPU % {ours['runq_wait_pct']}, "
            f"forwarded requests {ours['forwarded_requests']}, nodes {ours['nodes']}",
            flush=True,
        )
        print(f"[{stamp}] round {round_no + 1}: {_stages(ours['stages_ms'])}", flush=True)
        print(
            f"[{stamp}] round {round_no + 1}: disk {disk['writers']} at {disk['fsyncs_per_s']} "
            f"fsync/s, fdatasync ms {_ms(disk['fdatasync_ms'])}, write+fdatasync from due "
            f"{_ms(disk['write_fdatasync_from_due_ms'])}, load {disk['load_1m']:.1f}",
            flush=True,
        )
        print(
            f"[{stamp}] round {round_no + 1}: wake-up ring of {HOPS} idle processes at "
            f"{RING_LAPS_PER_S} laps/s, lap ms {_ms(ring['lap_ms'])}, load {ring['load_1m']:.1f}",
            flush=True,
        )
        if args.out:
            with args.out.open("a") as out:
                record = {"round": round_no + 1, "raftline": ours, "disk": disk, "ring": ring}
                out.write(json.dumps(record))
                out.write("\n")


if __name__ == "__main__":
    main()
