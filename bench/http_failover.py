"""Seconds from a fault on a leader (SIGKILL, or SIGSTOP: a leader that falls silent as when it is
cut off) to the next acks=all HTTP ack, as clients with a 3 s timeout see it.

Owns issue 21's failover target (election timeout + 1 s in every round), measured on real
`raftline serve` processes. One client per node writes through that node and, after a timeout
or a retryable error, moves on to the next node, as the Python client does.
Usage: .venv/bin/python -m bench.http_failover [rounds] [kill|pause] [partition|metadata]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.node_procs import NodeCluster, NodeProcess, http_json, running_nodes

ELECTION_TIMEOUT_S = 2 * 10 * 0.05  # the longest election timeout of the default NodeConfig
TARGET_S = ELECTION_TIMEOUT_S + 1.0
CLIENT_TIMEOUT_S = 3.0
PORT_BASE = 19100


class Client:
    """acks=all messages from a thread, starting at one node, moving on when it fails."""

    def __init__(self, cluster: NodeCluster, topic: str, first: int) -> None:
        self.cluster = cluster
        self.url_path = f"/v1/topics/{topic}/messages"
        self.turn = first
        self.acked: list[tuple[float, float]] = []  # (sent at, acknowledged at), monotonic
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
        nodes = self.cluster.nodes
        while not self._stop.is_set():
            node = nodes[self.turn % len(nodes)]
            sent = time.monotonic()
            try:
                status, _ = http_json(
                    f"{node.url}{self.url_path}", "POST", body, timeout=CLIENT_TIMEOUT_S
                )
            except OSError:
                status = 0
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


def wait_for_acks(clients: list[Client], count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(len(c.acked) for c in clients) < count:
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
        clients = [Client(cluster, "f", i).start() for i in range(len(cluster.nodes))]
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


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    fault = sys.argv[2] if len(sys.argv) > 2 else "kill"
    kind = sys.argv[3] if len(sys.argv) > 3 else "partition"
    if fault not in ("kill", "pause") or kind not in ("partition", "metadata"):
        print(__doc__)
        return 2
    times = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory() as root:
            times.append(one_round(Path(root), fault, kind))
        print(f"round {i}: first ack {times[-1]:.3f} s after {fault} of the {kind} leader")
    ordered = sorted(times)
    summary = {
        "fault": fault,
        "victim": kind,
        "rounds": rounds,
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "min_s": round(ordered[0], 3),
        "median_s": round(statistics.median(times), 3),
        "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "max_s": round(ordered[-1], 3),
        "target_s": TARGET_S,
        "met": ordered[-1] <= TARGET_S,
    }
    print(json.dumps(summary))
    return 0 if summary["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
