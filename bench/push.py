"""Server-side filters and push delivery through the Python client, on one real `raftline serve`
process: what a filter saves, and what a stream costs or gains against long-polling.

Owns issue 19's consumer-side figures, each taken against a baseline in the same run:
- drain: a 1-partition topic preloaded with N 100-byte messages (stored batches of 2,000),
  one in ten with header region=eu, read from the start by Consumers that: long-poll with
  the batch wire (the node sends stored batches); long-poll with JSON answers (the node
  decodes); stream (stream=True: binary frames of stored batches) with prefetch 2,000 (one
  batch: the node waits for the client's credit) and 4,000 (it reads ahead while the client
  decodes); long-poll with filter region == "eu" (the node skips nine in ten). msgs/s over
  N (messages delivered, for the filtered one; and messages scanned per second).
- latency: one message produced every 20 ms (acks=all), seconds from its produce call to the
  moment the consumer has it, for a long-polling and a streaming consumer (p50, p99).
Prints one JSON object. Usage: .venv/bin/python -m bench.push [messages] [samples]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import positionals
from bench.node_procs import running_nodes
from bench.positionals import Positional, positive_int
from raftline.clients.client import Client

PORT_BASE = 19500
VALUE = b"x" * 100
CHUNK = 2000
EU = 'headers.region == "eu"'


def preload(client: Client, topic: str, count: int) -> None:
    for start in range(0, count, CHUNK):
        n = min(CHUNK, count - start)
        messages = [
            {"value": "x" * 100, "headers": {"region": "eu" if (start + i) % 10 == 0 else "us"}}
            for i in range(n)
        ]
        client.produce(topic, messages)


def drain(client: Client, topic: str, expected: int, **options: Any) -> dict[str, Any]:
    consumer = client.consumer(topic, wait_ms=200, max_messages=2000, **options)
    started = time.monotonic()
    got = 0
    while got < expected:
        got += len(consumer.poll())
    seconds = time.monotonic() - started
    consumer.close()
    return {"messages": got, "seconds": round(seconds, 3), "msgs_per_s": round(got / seconds)}


def latency(url: str, topic: str, samples: int, stream: bool) -> dict[str, Any]:
    """Seconds from the produce call to receipt, of `samples` messages, one every 20 ms."""
    with Client(url) as reader, Client(url) as writer:
        consumer = reader.consumer(topic, offset="latest", wait_ms=1000, stream=stream)
        consumer.poll()  # positioned (and connected) before the first message
        acked: dict[int, float] = {}
        seen: dict[int, float] = {}

        def produce() -> None:
            for _ in range(samples):
                sent = time.monotonic()
                offset = writer.produce(topic, [{"value": "ping"}])[0].offset
                acked[offset] = sent
                time.sleep(0.02)

        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + 60
        while len(seen) < samples and time.monotonic() < deadline:
            for message in consumer.poll():
                seen[message.offset] = time.monotonic()
        producer.join()
        consumer.close()
    delays = sorted(max(0.0, seen[o] - acked[o]) for o in seen if o in acked)
    return {
        "samples": len(delays),
        "p50_ms": round(1000 * statistics.median(delays), 2),
        "p99_ms": round(1000 * delays[int(0.99 * (len(delays) - 1))], 2),
    }


def main(argv: list[str] | None = None) -> int:
    args = positionals.parse(
        "bench.push",
        __doc__,
        [Positional("messages", positive_int, 100_000), Positional("samples", positive_int, 200)],
        argv,
    )
    messages, samples = args.messages, args.samples
    report: dict[str, Any] = {"messages": messages, "value_bytes": len(VALUE)}
    with tempfile.TemporaryDirectory() as root, running_nodes(Path(root), 1, PORT_BASE) as nodes:
        url = nodes.nodes[0].url
        nodes.create_topic("drain", 1, replication_factor=1)
        with Client(url) as client, Client(url, wire="json") as json_client:
            preload(client, "drain", messages)
            matching = len(range(0, messages, 10))
            report["drain"] = {
                "long_poll": drain(client, "drain", messages),
                "long_poll_json": drain(json_client, "drain", messages),
                "stream": drain(client, "drain", messages, stream=True, prefetch=2000),
                "stream_prefetch_2x": drain(client, "drain", messages, stream=True, prefetch=4000),
                "long_poll_filtered": drain(client, "drain", matching, filter=EU),
            }
            filtered = report["drain"]["long_poll_filtered"]
            filtered["scanned_per_s"] = round(messages / filtered["seconds"])
        nodes.create_topic("pings", 1, replication_factor=1)
        report["latency"] = {
            "long_poll": latency(url, "pings", samples, stream=False),
            "stream": latency(url, "pings", samples, stream=True),
        }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
