"""Many partitions on one cluster: creation time, memory per replica, idle CPU, request latency.

Owns the scale run of issue #21 item 6: N `raftline serve` processes on loopback, P partitions of
RF r created in batches of topics through POST /v1/topics, then (1) the time until every
partition has a leader, (2) RSS per node divided by the replicas it holds, (3) each node's CPU
over an idle window from /proc/PID/stat, (4) produce and fetch latency to random partitions,
with `--stalls-s` (5) what nodes that stall now and then cost (peers counted gone, groups woken,
leaderships won), and with `--restart` (6) the time the killed nodes take to reopen every replica
and lead again.

A guard samples the nodes' total RSS every second and stops the run (all nodes killed) past
`--rss-limit-gib`; the whole run is bounded by `--time-limit`. Data dirs are removed at the end.

    .venv/bin/python -m bench.many_partitions --partitions 10000 --per-topic 1000 --pace --restart
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.node_procs import NodeCluster, NodeProcess, http_json

PORT_BASE = 27300  # HTTP 27301.., Raft 27351..
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# result key -> the node metric it lists per node, read once every partition is led
WATCHED_METRICS = {
    "raft_messages_sent_per_node": "raftline_raft_messages_sent_total",
    "woken_by_link_per_node": "raftline_raft_woken_by_link_total",
    "woken_by_message_per_node": "raftline_raft_woken_by_message_total",
    "woken_by_notice_per_node": "raftline_raft_woken_by_notice_total",
    "quiet_again_after_link_per_node": "raftline_raft_quiet_again_after_link_total",
    "gc_full_collections_per_node": "raftline_gc_full_collections_total",
    "gc_full_cpu_s_per_node": "raftline_gc_full_cpu_seconds_total",
    "gc_young_cpu_s_per_node": "raftline_gc_young_cpu_seconds_total",
    "gc_longest_pause_s_per_node": "raftline_gc_longest_pause_seconds",
    "link_dead_after_s_per_node": "raftline_link_dead_after_seconds",
}


class Aborted(Exception):
    """The run passed its memory or time bound."""


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metrics(node: NodeProcess) -> dict[str, float]:
    """The node's /metrics gauges and counters by name (labels dropped)."""
    connection = http.client.HTTPConnection(node.http.split(":")[0], int(node.http.split(":")[1]))
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name.split("{")[0]] = float(value)
    return values


class Guard:
    """Samples the nodes' RSS every second; past the limit or the deadline it kills them."""

    def __init__(self, cluster: NodeCluster, limit_bytes: int, deadline: float) -> None:
        self.cluster = cluster
        self.limit_bytes = limit_bytes
        self.deadline = deadline
        self.peak = 0
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        if self.reason is not None:
            raise Aborted(self.reason)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                total = sum(rss_bytes(n.pid) for n in self.cluster.live())
            except OSError:
                continue
            self.peak = max(self.peak, total)
            if total > self.limit_bytes:
                self.reason = f"total RSS {total / 2**30:.2f} GiB passed the limit"
            elif time.monotonic() > self.deadline:
                self.reason = "time limit reached"
            if self.reason is not None:
                self.cluster.kill_all()
                return


def create_topics(
    cluster: NodeCluster,
    guard: Guard,
    total: int,
    per_topic: int,
    rf: int,
    pace: bool,
    log: Any,
) -> list[tuple[str, int]]:
    """Create topics of `per_topic` partitions until `total`; returns (topic, partitions).
    `pace`: wait until every partition created so far has a leader before the next topic."""
    topics: list[tuple[str, int]] = []
    created = 0
    while created < total:
        count = min(per_topic, total - created)
        name = f"mp-{len(topics):05d}"
        started = time.monotonic()
        while True:
            guard.check()
            node = random.choice(cluster.live())
            try:
                status, body = http_json(
                    f"{node.url}/v1/topics",
                    "POST",
                    {"name": name, "partitions": count, "replication_factor": rf},
                    timeout=120,
                )
            except OSError as error:
                status, body = 0, {"error": repr(error)}
            code = body.get("error", {}).get("code") if isinstance(body, dict) else None
            if status == 201 or (status == 409 and code == "topic_exists"):
                break
            log(f"  create {name}: {status} {str(body)[:200]}; retrying")
            time.sleep(1.0)
        topics.append((name, count))
        created += count
        answered = time.monotonic() - started
        if pace:  # the next batch once every partition so far has a leader

            def led(values: list[dict[str, float]], created: int = created) -> bool:
                return sum(v["raftline_raft_groups_leading"] for v in values) - 1 >= created

            wait_until(cluster, guard, f"{name} led", led, 300)
        log(
            f"  {name}: {count} partitions, answered in {answered:.2f} s, "
            f"all led after {time.monotonic() - started:.2f} s ({created}), "
            f"RSS {sum(rss_bytes(n.pid) for n in cluster.live()) / 2**20:.0f} MiB in all"
        )
    return topics


def wait_until(cluster: NodeCluster, guard: Guard, what: str, done: Any, timeout: float) -> float:
    """Poll every node's metrics until `done(list of metrics)`; returns the seconds it took."""
    started = time.monotonic()
    while True:
        guard.check()
        try:
            values = [metrics(n) for n in cluster.nodes]
        except OSError:
            values = None
        if values is not None and done(values):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise Aborted(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(1.0)


def idle_cpu(cluster: NodeCluster, seconds: float) -> list[float]:
    """Each node's CPU over `seconds`, as a fraction of one core."""
    before = [cpu_seconds(n.pid) for n in cluster.nodes]
    time.sleep(seconds)
    after = [cpu_seconds(n.pid) for n in cluster.nodes]
    return [(b - a) / seconds for a, b in zip(before, after, strict=True)]


@contextmanager
def connections(cluster: NodeCluster) -> Iterator[list[http.client.HTTPConnection]]:
    conns = []
    for node in cluster.nodes:
        host, port = node.http.split(":")
        conns.append(http.client.HTTPConnection(host, int(port), timeout=10))
    try:
        yield conns
    finally:
        for conn in conns:
            conn.close()


def request(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> int:
    data = None if body is None else json.dumps(body)
    headers = {"Content-Type": "application/json"} if data else {}
    conn.request(method, path, data, headers)
    response = conn.getresponse()
    response.read()
    return response.status


def latencies(cluster: NodeCluster, topics: list[tuple[str, int]], count: int) -> dict[str, Any]:
    """`count` produce (acks=all, 100 B) then fetch requests, each to a random partition
    through a random node, one at a time; latencies in ms of the 2xx answers."""
    rng = random.Random(7)
    produce: list[float] = []
    fetch: list[float] = []
    errors = 0
    value = "x" * 100
    with connections(cluster) as conns:
        for _ in range(count):
            topic, partitions = rng.choice(topics)
            partition = rng.randrange(partitions)
            conn = rng.choice(conns)
            body = {"messages": [{"value": value, "partition": partition}]}
            started = time.perf_counter()
            status = request(conn, "POST", f"/v1/topics/{topic}/messages", body)
            elapsed = (time.perf_counter() - started) * 1000
            if status == 200:
                produce.append(elapsed)
            else:
                errors += 1
            path = f"/v1/topics/{topic}/partitions/{partition}/messages?offset=0&max_messages=1"
            started = time.perf_counter()
            status = request(rng.choice(conns), "GET", path)
            elapsed = (time.perf_counter() - started) * 1000
            if status == 200:
                fetch.append(elapsed)
            else:
                errors += 1
    return {"produce_ms": summary(produce), "fetch_ms": summary(fetch), "errors": errors}


def summary(samples: list[float]) -> dict[str, float] | None:
    if not samples:
        return None
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 2)

    return {
        "n": len(ordered),
        "p50": pct(50),
        "p99": pct(99),
        "max": round(ordered[-1], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


# metric counted over the stall phase -> its name in the result
STALL_COUNTS = {
    "peers_gone": "raftline_peers_gone_total",
    "woken_by_link": "raftline_raft_woken_by_link_total",
    "quiet_again_after_link": "raftline_raft_quiet_again_after_link_total",
    "leaderships_won": "raftline_raft_leaderships_won_total",
}
STALL_S = (0.6, 1.6)  # a paused node's silence: the p100k run's collector pauses were 0.8-1.35 s
STALL_GAP_S = 1.0


def stalls(
    cluster: NodeCluster, guard: Guard, seconds: float, partitions: int, log: Any
) -> dict[str, Any]:
    """For `seconds`, pause a random node (SIGSTOP) for 0.6-1.6 s, then let all run for 1 s:
    nodes that stall as starved ones do. Returns what that cost per node (peers counted gone,
    quiet groups woken by it, leaderships won: each one churn) and the seconds after the
    phase until every partition is led again."""
    rng = random.Random(11)
    before = [metrics(n) for n in cluster.nodes]
    end = time.monotonic() + seconds
    pauses = []
    while time.monotonic() < end:
        guard.check()
        node = rng.choice(cluster.nodes)
        pauses.append(round(rng.uniform(*STALL_S), 2))
        node.pause()
        try:
            time.sleep(pauses[-1])
        finally:
            node.resume()
        time.sleep(STALL_GAP_S)

    def all_led(values: list[dict[str, float]]) -> bool:
        return sum(v["raftline_raft_groups_leading"] for v in values) - 1 >= partitions

    result: dict[str, Any] = {"pauses": len(pauses), "longest_pause_s": max(pauses, default=0)}
    result["all_led_after_s"] = round(wait_until(cluster, guard, "led again", all_led, 300), 2)
    after = [metrics(n) for n in cluster.nodes]
    for key, metric in STALL_COUNTS.items():
        result[f"{key}_per_node"] = [
            int(a.get(metric, 0) - b.get(metric, 0)) for a, b in zip(after, before, strict=True)
        ]
    log(f"stalls: {result}")
    return result


def restart(
    cluster: NodeCluster, guard: Guard, fsync: str, replicas: int, partitions: int, log: Any
) -> dict[str, Any]:
    """Kill every node (SIGKILL) and start them again on their data: the seconds until they
    answer /readyz, hold every replica again, lead every partition and are quiet, and the CPU
    each node took for it."""
    cluster.kill_all()
    started = time.monotonic()
    cluster.start(fsync)
    result: dict[str, Any] = {"ready_s": round(time.monotonic() - started, 2)}
    base_cpu = [cpu_seconds(n.pid) for n in cluster.nodes]
    log(f"restarted: ready after {result['ready_s']} s; reopening {replicas} replicas")

    def reopened(values: list[dict[str, float]]) -> bool:
        return sum(v["raftline_raft_groups"] - 1 for v in values) >= replicas

    def all_led(values: list[dict[str, float]]) -> bool:
        return sum(v["raftline_raft_groups_leading"] for v in values) - 1 >= partitions

    def all_quiet(values: list[dict[str, float]]) -> bool:
        groups = sum(v["raftline_raft_groups"] for v in values)
        return sum(v["raftline_raft_groups_quiet"] for v in values) >= groups - len(values)

    limit = guard.deadline - time.monotonic()
    for key, done in (("reopened_s", reopened), ("all_led_s", all_led), ("quiet_s", all_quiet)):
        wait_until(cluster, guard, f"restart: {key}", done, limit)
        result[key] = round(time.monotonic() - started, 2)
        log(f"restart: {key} {result[key]}")
    result["cpu_s_per_node"] = [
        round(cpu_seconds(n.pid) - b, 1) for n, b in zip(cluster.nodes, base_cpu, strict=True)
    ]
    return result


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "partitions": args.partitions,
        "per_topic": args.per_topic,
        "replication_factor": args.rf,
        "fsync": args.fsync,
        "paced": args.pace,
        "load_average_start": os.getloadavg(),
    }
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f} s] {text}", flush=True)

    cluster = NodeCluster(root, args.nodes, args.port_base)
    guard = Guard(cluster, int(args.rss_limit_gib * 2**30), started + args.time_limit)
    try:
        cluster.start(args.fsync)
        guard.start()
        base_rss = [rss_bytes(n.pid) for n in cluster.nodes]
        base_cpu = [cpu_seconds(n.pid) for n in cluster.nodes]
        log(f"{args.nodes} nodes up; RSS {[round(r / 2**20) for r in base_rss]} MiB")
        t0 = time.monotonic()
        topics = create_topics(
            cluster, guard, args.partitions, args.per_topic, args.rf, args.pace, log
        )
        result["create_requests_s"] = round(time.monotonic() - t0, 2)
        expected = args.partitions * args.rf
        log(f"created; waiting for {expected} replicas and {args.partitions} leaders")

        def all_led(values: list[dict[str, float]]) -> bool:
            replicas = sum(v["raftline_raft_groups"] - 1 for v in values)  # less __meta
            leading = sum(v["raftline_raft_groups_leading"] for v in values) - 1
            return replicas >= expected and leading >= args.partitions

        wait_until(cluster, guard, "every partition led", all_led, args.time_limit)
        result["create_to_all_led_s"] = round(time.monotonic() - t0, 2)
        # CPU the creation took (a load-independent figure on a shared machine)
        result["create_cpu_s_per_node"] = [
            round(cpu_seconds(n.pid) - b, 1) for n, b in zip(cluster.nodes, base_cpu, strict=True)
        ]
        log(f"creation took {result['create_cpu_s_per_node']} CPU s per node")
        log(f"all led after {result['create_to_all_led_s']} s")

        def all_quiet(values: list[dict[str, float]]) -> bool:
            groups = sum(v["raftline_raft_groups"] for v in values)
            quiet = sum(v["raftline_raft_groups_quiet"] for v in values)
            return quiet >= groups - args.nodes  # __meta may keep ticking

        try:
            result["quiet_after_s"] = round(
                wait_until(cluster, guard, "quiet", all_quiet, args.quiet_timeout), 2
            )
        except Aborted as error:
            guard.check()
            result["quiet_after_s"] = None
            log(str(error))
        values = [metrics(n) for n in cluster.nodes]
        rss = [rss_bytes(n.pid) for n in cluster.nodes]
        held = [int(v["raftline_raft_groups"]) for v in values]
        result["replicas_per_node"] = held
        result["quiet_per_node"] = [int(v["raftline_raft_groups_quiet"]) for v in values]
        result["rss_mib_per_node"] = [round(r / 2**20) for r in rss]
        result["fds_per_node"] = [open_fds(n.pid) for n in cluster.nodes]
        result["rss_kib_per_replica"] = [
            round((r - b) / max(h, 1) / 1024, 1)
            for r, b, h in zip(rss, base_rss, held, strict=True)
        ]
        log(f"RSS {result['rss_mib_per_node']} MiB, replicas {held}")
        # what kept groups awake, and what the collector cost (see node/collector.py)
        for key, metric in WATCHED_METRICS.items():
            result[key] = [round(v.get(metric, 0), 3) for v in values]
        log(", ".join(f"{key} {result[key]}" for key in WATCHED_METRICS))
        log(f"idle CPU over {args.idle_s} s")
        frames = [v["raftline_frames_sent_total"] for v in values]
        result["idle_cpu_per_node"] = [round(c, 4) for c in idle_cpu(cluster, args.idle_s)]
        after = [metrics(n)["raftline_frames_sent_total"] for n in cluster.nodes]
        result["idle_frames_per_s_per_node"] = [
            round((a - b) / args.idle_s, 1) for a, b in zip(after, frames, strict=True)
        ]
        result["load_average_idle"] = os.getloadavg()
        log(f"idle CPU {result['idle_cpu_per_node']}")
        guard.check()
        result["latency"] = latencies(cluster, topics, args.requests)
        log(f"latency {result['latency']}")
        result["load_average_end"] = os.getloadavg()
        if args.stalls_s > 0:
            result["stalls"] = stalls(cluster, guard, args.stalls_s, args.partitions, log)
        if args.restart:
            result["restart"] = restart(cluster, guard, args.fsync, expected, args.partitions, log)
            result["load_average_restart_end"] = os.getloadavg()
    except Aborted as error:
        result["aborted"] = str(error)
    finally:
        guard.stop()
        result["peak_total_rss_mib"] = round(guard.peak / 2**20)
        result["aborted"] = result.get("aborted") or guard.reason
        cluster.kill_all()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--per-topic", type=int, default=1000, help="partitions per topic")
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument(
        "--pace", action="store_true", help="create the next topic once all so far are led"
    )
    parser.add_argument("--fsync", default="always")
    parser.add_argument("--idle-s", type=float, default=60.0, help="idle CPU window")
    parser.add_argument("--quiet-timeout", type=float, default=120.0)
    parser.add_argument("--requests", type=int, default=500, help="produce and fetch each")
    parser.add_argument(
        "--stalls-s", type=float, default=0.0, help="then pause random nodes for this long"
    )
    parser.add_argument(
        "--restart", action="store_true", help="then kill every node and time the reopening"
    )
    parser.add_argument("--rss-limit-gib", type=float, default=8.0)
    parser.add_argument("--time-limit", type=float, default=1800.0, help="whole run, seconds")
    parser.add_argument("--port-base", type=int, default=PORT_BASE)
    parser.add_argument("--dir", default=None, help="parent of the data dirs")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs")
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = parser.parse_args()
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C: the nodes are killed, the data removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="raftline-many-", dir=args.dir))
    try:
        result = run(args, root)
        text = json.dumps(result, indent=1)
        print(text, flush=True)
        if args.out is not None:
            args.out.write_text(text + "\n")
    finally:
        if not args.keep:  # minutes for tens of thousands of partitions: after the result
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
