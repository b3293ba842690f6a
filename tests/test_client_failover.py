"""The client's shells against failing endpoints: order kept under retries, other nodes tried.

A fake broker behind `_once` fails produce requests at random with a retryable error and
answers out of order (idempotent producers, the default, get the broker's sequence checks:
duplicates answered with the original offset, gaps refused); small HTTP servers play a node
that answers 503 and one that is paused.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftline.clients.client import AsyncClient, Client, RaftlineError, RetryPolicy
from raftline.clients.wire import Answer, Request
from raftline.raftlog.batch import parse_header
from raftline.raftlog.records import decode_batch

pytestmark = pytest.mark.timeout(60)

TOPIC = "orders"
PARTITIONS = 3


class FakeBroker:
    """One topic's partition logs; a produce fails (before writing) with probability `fail`."""

    def __init__(self, fail: float, seed: int) -> None:
        self.logs: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        self.rng = random.Random(seed)
        self.fail = fail
        self.failures = 0
        # partition -> (epoch, next sequence, first sequence -> base offset) of producer 1
        self.sequences: dict[int, tuple[int, int, dict[int, int]]] = {}

    def answer(self, method: str, path: str, request: Request, node: str) -> Answer:
        if path == "/v1/cluster":
            return _json({"nodes": [{"id": 1, "http": "leader:1"}]})
        if method == "GET" and path == f"/v1/topics/{TOPIC}":
            parts = [{"partition": p, "leader": 1} for p in range(PARTITIONS)]
            return _json({"name": TOPIC, "partitions": parts})
        if method == "POST" and path == "/v1/producers":
            return _json({"producer_id": 1, "producer_epoch": 0})
        assert method == "POST" and request.params is not None and request.payload is not None
        if self.rng.random() < self.fail:
            self.failures += 1
            raise RaftlineError("not_enough_replicas", "x", retryable=True, status=503, node=node)
        partition = int(request.params["partition"])
        values = [r.value or b"" for r in decode_batch(bytes(request.payload)).records]
        log = self.logs[partition]
        header = parse_header(bytes(request.payload))
        if header.producer_id >= 0:
            epoch, expected, written = self.sequences.get(partition, (-1, 0, {}))
            if header.producer_epoch != epoch:
                epoch, expected, written = header.producer_epoch, 0, {}
            if header.base_sequence in written:
                base = written[header.base_sequence]
                return _json({"partition": partition, "base_offset": base, "count": len(values)})
            if header.base_sequence != expected:
                raise RaftlineError(
                    "out_of_order_sequence", "gap", retryable=False, status=409, node=node
                )
            written[expected] = len(log)
            self.sequences[partition] = (epoch, expected + len(values), written)
        log += values
        return _json(
            {"partition": partition, "base_offset": len(log) - len(values), "count": len(values)}
        )


def _json(body: Any) -> Answer:
    return Answer({"content-type": "application/json"}, json.dumps(body).encode())


class FakeAsyncClient(AsyncClient):
    broker: FakeBroker

    async def _once(self, method: str, path: str, request: Request, url: str | None) -> Answer:
        # Answers come back after random delays: requests in flight together finish out of order.
        await asyncio.sleep(self.broker.rng.random() * 0.004)
        return self.broker.answer(method, path, request, self._base_url(url))


class FakeClient(Client):
    broker: FakeBroker

    def _once(self, method: str, path: str, request: Request, url: str | None) -> Answer:
        return self.broker.answer(method, path, request, self._base_url(url))


def _sent(n: int) -> dict[int, list[bytes]]:
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for i in range(n):
        expected[i % PARTITIONS].append(b"m%d" % i)
    return expected


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("seed", range(5))
async def test_async_producer_keeps_each_partitions_order_under_retried_failures(
    seed: int, idempotent: bool
) -> None:
    broker = FakeBroker(fail=0.3, seed=seed)
    client = FakeAsyncClient("http://leader:1", retry=RetryPolicy(retries=50, backoff_ms=1))
    client.broker = broker
    producer_of = client.producer(TOPIC, linger_ms=1, batch_messages=4, idempotent=idempotent)
    async with client, producer_of as producer:
        futures = []
        for i in range(300):
            futures.append(await producer.send(b"m%d" % i, partition=i % PARTITIONS))
            if i % 7 == 0:
                await asyncio.sleep(0.001)  # let batches leave while more are queued
            if i % 50 == 0:
                await producer.send_batch([b"m%d" % i], partition=i % PARTITIONS)
        await asyncio.gather(*futures)
    assert broker.failures > 10
    expected = _sent(300)
    for i in range(0, 300, 50):  # each whole batch right after the message sent before it
        position = expected[i % PARTITIONS].index(b"m%d" % i)
        expected[i % PARTITIONS].insert(position + 1, b"m%d" % i)
    assert broker.logs == expected


@pytest.mark.parametrize("idempotent", [True, False])
def test_sync_producer_keeps_each_partitions_order_under_retried_failures(
    idempotent: bool,
) -> None:
    broker = FakeBroker(fail=0.3, seed=1)
    client = FakeClient("http://leader:1", retry=RetryPolicy(retries=50, backoff_ms=1))
    client.broker = broker
    producer_of = client.producer(TOPIC, linger_ms=1, batch_messages=4, idempotent=idempotent)
    with client, producer_of as producer:
        futures = [producer.send(b"m%d" % i, partition=i % PARTITIONS) for i in range(120)]
    assert all(f.result() for f in futures)
    assert broker.failures > 0
    assert broker.logs == _sent(120)


# ---- another node after a retryable failure -------------------------------------------------


class _Node(http.server.BaseHTTPRequestHandler):
    mode = "healthy"  # "unavailable": 503 leader_unavailable; "paused": answers after 5 s
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.mode)
        if self.mode == "paused":
            time.sleep(5)
        status, body = 200, {"topics": [{"name": "t", "partitions": 1, "replication_factor": 1}]}
        if self.mode == "unavailable":
            error = {"code": "leader_unavailable", "message": "paused", "retryable": True}
            status, body = 503, {"error": error}
        raw = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        except OSError:  # the client gave up on a paused node
            pass

    def log_message(self, *args: Any) -> None:
        pass


def _serve(mode: str, seen: list[str]) -> http.server.ThreadingHTTPServer:
    handler = type(f"{mode}Node", (_Node,), {"mode": mode, "seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(params=["unavailable", "paused"])
def nodes(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    """A failing node listed first, a healthy one second: their bootstrap list and what each
    was asked."""
    seen: list[str] = []
    servers = [_serve(request.param, seen), _serve("healthy", seen)]
    yield ",".join(f"http://127.0.0.1:{s.server_address[1]}" for s in servers), seen
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_retryable_failure_sends_the_next_try_to_another_node(
    nodes: tuple[str, list[str]],
) -> None:
    urls, seen = nodes
    with Client(urls, timeout=0.5, retry=RetryPolicy(retries=1, backoff_ms=1)) as client:
        assert [t["name"] for t in client.list_topics()] == ["t"]
        assert [t["name"] for t in client.list_topics()] == ["t"]  # stays with the good one
    assert seen[0] != "healthy" and seen[1:] == ["healthy", "healthy"]


async def test_an_async_retryable_failure_sends_the_next_try_to_another_node(
    nodes: tuple[str, list[str]],
) -> None:
    urls, seen = nodes
    async with AsyncClient(urls, timeout=0.5, retry=RetryPolicy(retries=1)) as client:
        assert [t["name"] for t in await client.list_topics()] == ["t"]
    assert seen[0] != "healthy" and seen[1:] == ["healthy"]
