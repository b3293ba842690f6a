"""Seconds from SIGKILL of a partition (or metadata) leader to the next acks=all HTTP ack.

Owns the 5-second resume target of issue 4, measured on real `raftline serve` processes.
Usage: .venv/bin/python bench/http_failover.py [rounds] [partition|metadata]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster_harness import ContinuousProducer, running_cluster

TARGET_S = 5.0


def one_round(root: Path, victim_kind: str) -> float:
    with running_cluster(root) as cluster:
        cluster.create_topic("f")
        leader = cluster.wait_for_leader("f", 0)
        victim = leader if victim_kind == "partition" else cluster.controller()
        producer = ContinuousProducer(cluster, "f").start()
        try:
            producer.wait_for_acks(50)
            time.sleep(1.0)
            killed_at = time.monotonic()
            cluster.node(victim).kill()
            return producer.first_ack_after(killed_at, timeout=30)
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
