"""Seconds from a fault on a leader to the next acks=all HTTP ack, as clients with a 3 s timeout
see it: SIGKILL, SIGSTOP (a leader that falls silent, connections open), or a network cut.

Owns issue 21's failover target (election timeout + 1 s in every round). kill and pause run on
real `raftline serve` processes (3 nodes, a fresh cluster each round); cut needs nodes with
addresses of their own: the 5-node compose cluster (docker-compose.yml, image $RAFTLINE_IMAGE,
project raftline-failover; hold /tmp/raftline-compose.lock), where nftables drops every packet
between the leader and the other nodes while the leader still answers its own clients; one
cluster for every round, healed between them. One client per node writes through that node
and, after a timeout or a retryable error, moves on to the next node, as the Python client does.
Usage: .venv/bin/python -m bench.http_failover [rounds] [kill|pause|cut|freeze|cut+freeze]
       [partition|metadata]   (freeze: `docker pause` of the leader on the compose cluster;
       cut+freeze alternates the two in one run)
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import positionals
from bench.node_procs import NodeProcess, http_json, running_nodes
from bench.positionals import Positional, positive_int
from raftline.chaos.cluster import ClusterError, ComposeCluster
from raftline.chaos.cluster import Node as ComposeNode

ELECTION_TIMEOUT_S = 2 * 10 * 0.05  # the longest election timeout of the default NodeConfig
TARGET_S = ELECTION_TIMEOUT_S + 1.0
CLIENT_TIMEOUT_S = 3.0
PORT_BASE = 19100


class Client:
    """acks=all messages from a thread, starting at one node, moving on when it fails."""

    def __init__(self, urls: list[str], topic: str, first: int) -> None:
        self.urls = urls
        self.url_path = f"/v1/topics/{topic}/messages"
        self.turn = first
        self.acked: list[tuple[float, float]] = []  # (sent at, acknowledged at), monotonic
        # every try: (sent at, answered at, node index, HTTP status or 0: no answer, error code)
        self.tries: list[tuple[float, float, int, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Client:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        body = {"acks": "all", "messages": [{"value": "m", "partition": 0}]}
        while not self._stop.is_set():
            node = self.turn % len(self.urls)
            sent = time.monotonic()
            try:
                status, answer = http_json(
                    f"{self.urls[node]}{self.url_path}", "POST", body, timeout=CLIENT_TIMEOUT_S
                )
                code = "" if status == 200 else str(answer.get("error", {}).get("code", ""))
            except OSError as error:
                status, code = 0, type(error).__name__
            self.tries.append((sent, time.monotonic(), node, status, code))
            if status == 200:
                self.acked.append((sent, time.monotonic()))
            else:
                self.turn += 1
                time.sleep(0.02)


def first_ack_after(clients: list[Client], moment: float, timeout: float = 30.0) -> float:
    """Seconds from `moment` to the first ack, by any client, of a message sent after it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [acked for c in clients for sent, acked in c.acked if sent > moment]
        if later:
            return min(later) - moment
        time.sleep(0.01)
    raise TimeoutError("no ack after the fault")


def tries_between(clients: list[Client], start: float, end: float) -> str:
    """What each client tried from `start` (the fault) to `end`, for a round over the target:
    `node+status@sent..answered` in seconds from `start`."""
    lines = []
    for i, client in enumerate(clients):
        shown = [
            f"n{node + 1}:{status}{'/' + code if code else ''}"
            f"@{sent - start:.2f}..{done - start:.2f}"
            for sent, done, node, status, code in client.tries
            if done > start and sent < end
        ]
        lines.append(f"  client {i}: {', '.join(shown)}")
    return "\n".join(lines)


def ack_latency_before(clients: list[Client], moment: float, span: float = 5.0) -> float:
    """Median seconds from send to ack over the `span` seconds before `moment`: the commit
    latency of the machine at the time, which bounds the first ack after a fault from below
    (on a loaded 2-core machine it alone can be a second or more)."""
    took = [a - s for c in clients for s, a in c.acked if moment - span <= a < moment]
    return statistics.median(took) if took else float("nan")


def wait_for_acks(clients: list[Client], count: int, since: float = 0.0) -> None:
    """Until `count` messages sent after `since` are acknowledged (at most 60 s)."""
    deadline = time.monotonic() + 60.0
    while sum(sent > since for c in clients for sent, _ in c.acked) < count:
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster does not acknowledge writes")
        time.sleep(0.02)


def inject(victim: NodeProcess, fault: str) -> None:
    if fault == "kill":
        victim.kill()
    else:
        victim.pause()


def one_round(root: Path, fault: str, victim_kind: str) -> float:
    with running_nodes(root, 3, PORT_BASE) as cluster:
        cluster.create_topic("f")
        leader = cluster.leader("f")
        victim = leader if victim_kind == "partition" else cluster.controller()
        urls = [node.url for node in cluster.nodes]
        clients = [Client(urls, "f", i).start() for i in range(len(urls))]
        try:
            wait_for_acks(clients, 50)
            time.sleep(1.0)
            fault_at = time.monotonic()
            inject(victim, fault)
            return first_ack_after(clients, fault_at)
        finally:
            victim.resume()
            for client in clients:
                client.stop()


def process_rounds(rounds: int, fault: str, victim_kind: str) -> list[float]:
    times = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory() as root:
            times.append(one_round(Path(root), fault, victim_kind))
        print(f"round {i}: first ack {times[-1]:.3f} s after {fault} of the {victim_kind} leader")
    return times


def leader_id(url: str, victim_kind: str) -> int | None:
    """The partition's leader or the controller as the node at `url` sees it."""
    try:
        if victim_kind == "partition":
            status, body = http_json(f"{url}/v1/topics/f", timeout=5)
            found = body["partitions"][0].get("leader") if status == 200 else None
        else:
            status, body = http_json(f"{url}/v1/cluster", timeout=5)
            found = body.get("controller") if status == 200 else None
    except OSError:
        return None
    return None if found is None else int(found)


def all_alive(urls: list[str]) -> bool:
    """Whether every node sees every other node alive (a healed cut has been noticed)."""
    for url in urls:
        try:
            status, body = http_json(f"{url}/v1/cluster", timeout=5)
        except OSError:
            return False
        if status != 200 or not all(n["alive"] for n in body["nodes"]):
            return False
    return True


def inject_compose(cluster: ComposeCluster, victim: ComposeNode, fault: str) -> None:
    """Cut or freeze `victim`. Freezing a container can fail while one of its threads waits in
    the kernel (an fsync: "unable to freeze"); it is tried again a few times."""
    if fault == "cut":
        cluster.isolate(victim)
        return
    for attempt in range(5):
        try:
            cluster.pause(victim)
            return
        except ClusterError:
            if attempt == 4:
                raise
            time.sleep(0.05)


def compose_rounds(rounds: int, victim_kind: str, faults: list[str]) -> dict[str, list[float]]:
    """Rounds on the compose cluster, taking `faults` in turn (cut, or freeze: `docker pause`
    of the leader's container, the compose twin of SIGSTOP): alternated in one run, they
    compare under the same load."""
    cluster = ComposeCluster(5, project="raftline-failover")
    cluster.up()
    try:
        if not cluster.wait_ready(180):
            raise RuntimeError("the compose cluster did not become ready")
        urls = [node.http_url for node in cluster.nodes]
        create = {"name": "f", "partitions": 1, "replication_factor": 3}
        status, body = http_json(f"{urls[0]}/v1/topics", "POST", create, timeout=30)
        if status != 201:
            raise RuntimeError(f"creating topic f failed: {status} {body}")
        clients = [Client(urls, "f", i).start() for i in range(len(urls))]
        times: dict[str, list[float]] = {fault: [] for fault in faults}
        latencies: list[float] = []
        try:
            for i in range(rounds):
                healed = time.monotonic()
                while not all_alive(urls) or leader_id(urls[0], victim_kind) is None:
                    if time.monotonic() - healed > 60:
                        raise TimeoutError("the cluster did not heal")
                    time.sleep(0.2)
                wait_for_acks(clients, 50, since=time.monotonic())
                time.sleep(1.0)
                victim = cluster.node(leader_id(urls[0], victim_kind) or 1)
                fault = faults[i % len(faults)]
                cutting = time.monotonic()
                latencies.append(ack_latency_before(clients, cutting))
                inject_compose(cluster, victim, fault)
                # From the moment the fault is in force: a message sent while it was being
                # injected may still be committed by the old leader.
                fault_at = time.monotonic()
                try:
                    took = first_ack_after(clients, fault_at)
                finally:
                    cluster.heal_all()
                times[fault].append(took)
                print(f"round {i}: first ack {took:.3f} s after {fault} of the {victim_kind}"
                      f" leader (node {victim.node_id}; injecting took {fault_at - cutting:.3f} s;"
                      f" acks took {latencies[-1]:.3f} s before it)", flush=True)  # fmt: skip
                if took > TARGET_S:
                    print(tries_between(clients, fault_at, fault_at + took), flush=True)
        finally:
            for client in clients:
                client.stop()
    finally:
        cluster.down()
    return times


def summary(fault: str, victim_kind: str, times: list[float]) -> dict[str, object]:
    ordered = sorted(times)
    return {
        "fault": fault,
        "victim": victim_kind,
        "rounds": len(times),
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "min_s": round(ordered[0], 3),
        "median_s": round(statistics.median(times), 3),
        "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "max_s": round(ordered[-1], 3),
        "target_s": TARGET_S,
        "within_target": sum(t <= TARGET_S for t in times),
        "met": ordered[-1] <= TARGET_S,
        "load1": round(os.getloadavg()[0], 1),
    }


FAULTS = ("kill", "pause", "cut", "freeze", "cut+freeze")


def main(argv: list[str] | None = None) -> int:
    args = positionals.parse(
        "bench.http_failover",
        __doc__,
        [
            Positional("rounds", positive_int, 3),
            Positional("fault", str, "kill", FAULTS),
            Positional("kind", str, "partition", ("partition", "metadata")),
        ],
        argv,
    )
    rounds, fault, kind = args.rounds, args.fault, args.kind
    compose = fault.split("+")
    if fault in ("kill", "pause"):
        by_fault = {fault: process_rounds(rounds, fault, kind)}
    else:
        by_fault = compose_rounds(rounds, kind, compose)
    summaries = [summary(f, kind, times) for f, times in by_fault.items() if times]
    for line in summaries:
        print(json.dumps(line))
    return 0 if all(line["met"] for line in summaries) else 1


if __name__ == "__main__":
    raise SystemExit(main())
