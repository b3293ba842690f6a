"""What routing costs: publishes through an exchange against plain produce, on a 3-node cluster.

Owns one run: a cluster of `raftline serve` processes (fsync always), then, from one client
thread (each case a closed loop of one request at a time, so the figures are latencies):
plain produce of one message to one topic; an exchange publish of one message to one topic
(the plain produce path plus routing); a fanout publish to 3 topics (one transaction); and a
request/reply round trip through a direct exchange to a queue and a responder thread. Prints
a table of requests/s and latency percentiles.

    .venv/bin/python -m bench.exchange_publish [--seconds 10] [--port-base 27100]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.node_procs import running_nodes
from raftline.clients.client import Client


def timed(seconds: float, one: Callable[[int], Any]) -> list[float]:
    latencies = []
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        started = time.perf_counter()
        one(i)
        latencies.append(time.perf_counter() - started)
        i += 1
    return latencies


def row(name: str, latencies: list[float], seconds: float) -> str:
    ordered = sorted(latencies)

    def ms(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    rate = len(ordered) / seconds
    return f"| {name:<34} | {rate:8.0f} | {ms(0.5):7.1f} | {ms(0.99):7.1f} |"


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__)
    options.add_argument("--seconds", type=float, default=10.0)
    options.add_argument("--port-base", type=int, default=27100)
    args = options.parse_args()
    with (
        tempfile.TemporaryDirectory() as root,
        running_nodes(Path(root), 3, args.port_base) as cluster,
    ):
        for topic in ("plain", "a", "b", "c", "rpc"):
            cluster.create_topic(topic)
        url = ",".join(n.url for n in cluster.nodes)
        with Client(url) as client:
            client.create_exchange("one", "direct")
            client.bind("one", "k", topic="plain")
            client.create_exchange("all", "fanout")
            for topic in ("a", "b", "c"):
                client.bind("all", topic=topic)
            client.queue("rpc-q").create("rpc")
            client.create_exchange("svc", "direct")
            client.bind("svc", "echo", queue="rpc-q")
            stop = threading.Event()

            def respond() -> None:
                with Client(url) as own:
                    responder = own.responder("rpc-q", lambda m: m.value, wait_ms=200)
                    while not stop.is_set():
                        responder.serve(1)

            server = threading.Thread(target=respond, daemon=True)
            server.start()
            value = b"x" * 100
            cases: list[tuple[str, Callable[[int], Any]]] = [
                ("produce, 1 topic", lambda i: client.produce("plain", [{"value": "x" * 100}])),
                ("exchange publish, 1 topic", lambda i: client.publish("one", "k", value)),
                ("fanout publish, 3 topics (txn)", lambda i: client.publish("all", "", value)),
                (
                    "request/reply via exchange + queue",
                    lambda i: client.request(value, exchange="svc", routing_key="echo"),
                ),
            ]
            print("| case                               |  req/s   | p50 ms  | p99 ms  |")
            print("|------------------------------------|----------|---------|---------|")
            for name, one in cases:
                one(0)  # warm up: producers, reply topic, routing table
                print(row(name, timed(args.seconds, one), args.seconds), flush=True)
            stop.set()
            server.join(timeout=5)


if __name__ == "__main__":
    main()
