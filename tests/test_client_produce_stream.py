"""A producer with transport="stream" (clients/produce_streams.py) writes what the same producer
writes by POST, in both shells, and sends its batches as frames; a batch its stream answers
with a retryable error goes by POST instead, one refused for good is not sent again."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from inproc_harness import http_cluster
from test_node_cluster import leader_of, led_topic

from raftline.clients.aio import AsyncClient
from raftline.clients.blocking import Client
from raftline.clients.wire import Message, RaftlineError

pytestmark = pytest.mark.timeout(120)

SENT: list[tuple[bytes, bytes | None, dict[str, Any]]] = [
    (b"v%d" % i, None if i % 3 else b"k%d" % i, {"h": "x"} if i % 2 else {}) for i in range(40)
]


def written(messages: list[Message]) -> list[tuple[bytes | None, bytes | None, dict[str, Any]]]:
    return [(m.value, m.key, m.headers) for m in messages]


async def stream_messages(base: str) -> int:
    """Records the node took in on produce streams (its /metrics)."""
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as answer:
        text = await answer.text()
    name = 'raftline_stream_messages_total{kind="produce"} '
    return int(next(x for x in text.splitlines() if x.startswith(name)).removeprefix(name))


async def test_an_async_producer_on_a_stream_writes_what_it_writes_by_post(
    tmp_path: Path,
) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        written_by: dict[str, list[Any]] = {}
        for transport in ("http", "stream"):
            topic = f"by-{transport}"
            await led_topic(cluster.brokers, topic)
            async with AsyncClient(",".join(cluster.urls)) as client:
                start = (await client.fetch(topic, 0, "latest")).next_offset
                async with client.producer(topic, transport=transport, linger_ms=1) as producer:
                    for value, key, headers in SENT:
                        await producer.send(value, key, partition=0, headers=headers)
                fetched = await client.fetch(topic, 0, start, max_messages=100)
            written_by[transport] = written(fetched.messages)
        leader = leader_of(cluster.brokers, "by-stream")
        assert await stream_messages(cluster.url_of(leader)) == len(SENT)
    assert written_by["stream"] == written_by["http"]
    assert written_by["stream"] == [(v, k, h) for v, k, h in SENT]


def test_a_blocking_producer_on_a_stream_writes_what_it_writes_by_post(
    client: Client, new_topic: Any
) -> None:
    topic = new_topic(1)
    values = [b"a", b"bb", b"ccc"]
    for transport in ("http", "stream"):
        with client.producer(topic, transport=transport) as producer:
            acked = [producer.send(v, partition=0) for v in values]
            producer.flush()
            assert [f.result().partition for f in acked] == [0, 0, 0]
    fetched = client.fetch(topic, 0, 0)
    assert [m.value for m in fetched.messages] == values + values
    with urllib.request.urlopen(client.urls[0] + "/metrics") as answer:
        metrics = answer.read().decode()
    assert 'raftline_stream_messages_total{kind="produce"} 3' in metrics.splitlines()


async def test_a_batch_the_stream_refuses_goes_by_post(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        leader = await led_topic(cluster.brokers, "refused")
        follower = next(b for b in cluster.brokers if b is not leader)
        async with AsyncClient(",".join(cluster.urls)) as client:
            await client._run(client.refreshed("refused"))
            client.metadata.leaders[("refused", 0)] = follower.node_id  # a stale leader
            async with client.producer("refused", transport="stream") as producer:
                acked = await (await producer.send(b"one", partition=0))
        assert acked.partition == 0
        assert follower.counters["forwarded_requests"] == 1  # the POST, after leader_unavailable
        assert client.metadata.leaders[("refused", 0)] == leader.node_id


async def test_a_batch_the_node_refuses_for_good_is_not_sent_again_by_post(
    tmp_path: Path,
) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        leader = await led_topic(cluster.brokers, "one-partition")
        base = cluster.url_of(leader)
        async with AsyncClient(base) as client:
            with pytest.raises(RaftlineError) as refused:
                await client.produce_batch("one-partition", 7, [b"x"], transport="stream")
        assert refused.value.code == "unknown_partition"
        async with (
            aiohttp.ClientSession() as http,
            http.get(base + "/metrics") as answer,
        ):
            metrics = await answer.text()
        assert 'method="POST",route="/v1/topics/{topic}/messages"' not in metrics


async def test_a_stream_that_never_answers_gives_the_batch_to_a_post_after_the_timeout() -> None:
    # A node whose loop answers pings but not batches (paused, stuck): the POST answers.
    posted: list[bytes] = []

    async def stream(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for _ in socket:
            pass  # frames read, never answered
        return socket

    async def post(request: web.Request) -> web.Response:
        posted.append(await request.read())
        return web.json_response({"partition": 0, "base_offset": 41, "count": 1})

    app = web.Application()
    app.router.add_get("/v1/topics/{topic}/produce-stream", stream)
    app.router.add_post("/v1/topics/{topic}/messages", post)
    async with TestServer(app) as server:
        base = str(server.make_url("")).rstrip("/")
        async with AsyncClient(base, timeout=1.0) as client:
            started = time.monotonic()
            acked = await client.produce_batch("t", 0, [b"x"], url=base, transport="stream")
    assert time.monotonic() - started < 5
    assert acked.base_offset == 41 and len(posted) == 1
