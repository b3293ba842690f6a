"""Request/reply through the HTTP API of one in-process node: a request published to a topic,
or through an exchange to a queue, gets the reply carrying its correlation id (other replies
on the reply topic are passed over); no reply in time answers 504; a request's own reply topic
is deleted after the answer, a client's is kept while used and deleted by the controller once
it expires; and bad requests get a clear 4xx."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import call, ok, serving, wait_for

from raftline.node.broker import Broker
from raftline.node.replies import REPLY_TTL_MS

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[TestClient, Broker]]:
    async with serving(tmp_path / "data") as served:
        yield served


async def responder(api: TestClient, topic: str, decoy: bool = False) -> None:
    """Answer every request on `topic` (partition 0): a decoy reply with another correlation
    id first when asked, then the upper-cased value with the request's correlation id."""
    offset: int | str = "earliest"
    while True:
        path = f"/v1/topics/{topic}/partitions/0/messages?offset={offset}&wait_ms=500"
        answer = await ok(api, "GET", path)
        for message in answer["messages"]:
            headers = message["headers"]
            replies = []
            if decoy:
                replies.append({"value": "decoy", "headers": {"correlation-id": "other"}})
            reply_headers = {"correlation-id": headers["correlation-id"]}
            replies.append({"value": message["value"].upper(), "headers": reply_headers})
            await ok(
                api, "POST", f"/v1/topics/{headers['reply-to']}/messages", {"messages": replies}
            )
        offset = answer["next_offset"]


@contextlib.asynccontextmanager
async def responding(api: TestClient, topic: str, decoy: bool = False) -> AsyncIterator[None]:
    task = asyncio.ensure_future(responder(api, topic, decoy))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def user_topics(api: TestClient) -> list[str]:
    return [t["name"] for t in (await ok(api, "GET", "/v1/topics"))["topics"]]


async def test_a_request_to_a_topic_gets_its_correlated_reply(
    node: tuple[TestClient, Broker],
) -> None:
    api, _ = node
    await ok(api, "POST", "/v1/topics", {"name": "rpc"})
    async with responding(api, "rpc", decoy=True):
        body = {"topic": "rpc", "message": {"value": "ping"}, "correlation_id": "c-1"}
        answer = await ok(api, "POST", "/v1/request", body)
    assert answer["correlation_id"] == "c-1"
    assert answer["reply"]["value"] == "PING"
    assert answer["reply"]["headers"] == {"correlation-id": "c-1"}
    assert answer["request"][0]["topic"] == "rpc"
    # the request's own reply topic goes once the answer is given
    await wait_for_async(lambda: user_topics(api), lambda names: names == ["rpc"])


async def wait_for_async(read: Any, done: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not done(await read()):
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_a_request_through_an_exchange_reaches_a_queue_and_is_answered(
    node: tuple[TestClient, Broker],
) -> None:
    api, _ = node
    await ok(api, "POST", "/v1/topics", {"name": "rpc"})
    await ok(api, "POST", "/v1/queues", {"name": "adders", "topic": "rpc"})
    await ok(api, "POST", "/v1/exchanges", {"name": "services", "kind": "direct"})
    await ok(api, "POST", "/v1/exchanges/services/bindings", {"key": "add", "queue": "adders"})

    async def serve_once() -> None:
        received: list[dict[str, Any]] = []
        while not received:
            body = {"max_messages": 1, "wait_ms": 500}
            received = (await ok(api, "POST", "/v1/queues/adders/receive", body))["messages"]
        request = received[0]
        a, b = (int(x) for x in request["value"].split("+"))
        reply = {
            "value": str(a + b),
            "headers": {"correlation-id": request["headers"]["correlation-id"]},
        }
        await ok(
            api,
            "POST",
            f"/v1/topics/{request['headers']['reply-to']}/messages",
            {"messages": [reply]},
        )
        await ok(api, "POST", "/v1/queues/adders/ack", {"receipts": [request["receipt"]]})

    server = asyncio.ensure_future(serve_once())
    body = {"exchange": "services", "routing_key": "add", "message": {"value": "2+3"}}
    answer = await ok(api, "POST", "/v1/request", {**body, "client_id": "calc"})
    await server
    assert answer["reply"]["value"] == "5"
    status, unroutable = await call(api, "POST", "/v1/request", {**body, "routing_key": "mul"})
    assert (status, unroutable["error"]["code"]) == (404, "unroutable")


async def test_no_reply_in_time_answers_504_and_is_counted(
    node: tuple[TestClient, Broker],
) -> None:
    api, _ = node
    await ok(api, "POST", "/v1/topics", {"name": "rpc"})
    body = {"topic": "rpc", "message": {"value": "ping"}, "timeout_ms": 300}
    status, answer = await call(api, "POST", "/v1/request", body)
    assert status == 504 and answer["error"]["code"] == "timeout"
    assert answer["error"]["retryable"] is True
    metrics = await (await api.get("/metrics")).text()
    assert 'raftline_request_timeouts_total{node="1"} 1' in metrics
    await wait_for_async(lambda: user_topics(api), lambda names: names == ["rpc"])


async def test_a_clients_reply_topic_serves_its_requests_until_it_expires(
    node: tuple[TestClient, Broker],
) -> None:
    api, broker = node
    await ok(api, "POST", "/v1/topics", {"name": "rpc"})
    async with responding(api, "rpc"):
        for value in ("a", "b"):
            body = {"topic": "rpc", "message": {"value": value}, "client_id": "me"}
            assert (await ok(api, "POST", "/v1/request", body))["reply"]["value"] == value.upper()
    assert sorted(await user_topics(api)) == ["_reply.me", "rpc"]
    broker.clock.set_offset_ms(REPLY_TTL_MS + 1_000)  # the client vanished that long ago
    await wait_for(lambda: "_reply.me" not in broker.meta.state.topics)
    assert broker.meta.state.expiring == {}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"message": {"value": "v"}}, "invalid_request"),
        ({"topic": "rpc", "exchange": "x", "message": {"value": "v"}}, "invalid_request"),
        ({"topic": "rpc", "routing_key": "k", "message": {"value": "v"}}, "invalid_request"),
        ({"topic": "rpc", "message": "v"}, "invalid_request"),
        ({"topic": "rpc", "message": {"value": "v", "partition": 0}}, "invalid_request"),
        (
            {"topic": "rpc", "message": {"value": "v", "headers": {"reply-to": "elsewhere"}}},
            "invalid_request",
        ),
        ({"topic": "rpc", "message": {"value": "v"}, "timeout_ms": 0}, "invalid_request"),
        ({"topic": "rpc", "message": {"value": "v"}, "timeout_ms": 60_001}, "invalid_request"),
        ({"topic": "rpc", "message": {"value": "v"}, "client_id": "a b"}, "invalid_request"),
        ({"topic": "rpc", "message": {"value": "v"}, "client_id": "own"}, "invalid_request"),
        ({"topic": "rpc", "message": {"value": "v"}, "correlation_id": ""}, "invalid_request"),
        ({"topic": "nope", "message": {"value": "v"}}, "unknown_topic"),
        ({"exchange": "nope", "message": {"value": "v"}}, "unknown_exchange"),
    ],
)
async def test_bad_requests_get_a_clear_error(
    node: tuple[TestClient, Broker], body: dict[str, Any], code: str
) -> None:
    api, _ = node
    await ok(api, "POST", "/v1/topics", {"name": "rpc"})
    await ok(api, "POST", "/v1/topics", {"name": "_reply.own"})  # a user's topic of that name
    status, answer = await call(api, "POST", "/v1/request", body)
    assert 400 <= status < 500 and answer["error"]["code"] == code, (status, answer)
