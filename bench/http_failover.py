"""Seconds from SIGKILL of a partition (or metadata) leader to the next acks=all HTTP ack.

Owns the 5-second resume target of issue 4, measured on real `raftline serve` processes.
Usage: .venv/bin/python -m bench.http_failover [rounds] [partition|metadata]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.node_procs import NodeCluster, http_json, running_nodes

TARGET_S = 5.0
PORT_BASE = 19100


class Producer:
    """One acks=all message per request from a thread, to each live node in turn."""

    def __init__(self, cluster: NodeCluster, topic: str) -> None:
        self.cluster = cluster
        self.url_path = f"/v1/topics/{topic}/messages"
        self.acked: list[tuple[float, float]] = []  # (sent at, acknowledged at), monotonic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        turn = 0
        body = {"acks": "all", "messages": [{"value": "m", "partition": 0}]}
        while not self._stop.is_set():
            live = self.cluster.live()
            node = live[turn % len(live)]
            sent = time.monotonic()
            try:
                status, _ = http_json(f"{node.url}{self.url_path}", "POST", body, timeout=10.0)
            except OSError:
                status = 0
            if status == 200:
                self.acked.append((sent, time.monotonic()))
            else:
                turn += 1
                time.sleep(0.02)

    def wait_for_acks(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.acked)} acks")
            time.sleep(0.02)

    def first_ack_after(self, moment: float, timeout: float = 30.0) -> float:
        """Seconds from `moment` to the first ack of a message sent after it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [acked for sent, acked in self.acked if sent > moment]
            if later:
                return min(later) - moment
            time.sleep(0.01)
        raise TimeoutError("no ack after the kill")


def one_round(root: Path, victim_kind: str) -> float:
    with running_nodes(root, 3, PORT_BASE) as cluster:
        cluster.create_topic("f")
        leader = cluster.leader("f")
        victim = leader if victim_kind == "partition" else cluster.controller()
        producer = Producer(cluster, "f").start()
        try:
            producer.wait_for_acks(50)
            time.sleep(1.0)
            killed_at = time.monotonic()
            victim.kill()
            return producer.first_ack_after(killed_at)
        finally:
            producer.stop()


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    kind = sys.argv[2] if len(sys.argv) > 2 else "partition"
    times = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory() as root:
            times.append(one_round(Path(root), kind))
        print(f"round {i}: resumed {times[-1]:.3f} s after SIGKILL of the {kind} leader")
    summary = {
        "victim": kind,
        "rounds": rounds,
        "median_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "target_s": TARGET_S,
        "met": max(times) < TARGET_S,
    }
    print(json.dumps(summary))
    return 0 if summary["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
