"""The exchange and request/reply client (sync and asyncio) against a real single-node
`raftline serve` process: exchange admin, bind and publish; `request()` answered by a
`responder()` on a queue behind an exchange (a blocking one in a thread, an async one with a
coroutine handler); a request nobody answers raises `timeout` once, without retries; a handler
that raises releases its message."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from cluster_harness import Cluster

from raftline.clients.client import (
    AsyncClient,
    Client,
    QueueMessage,
    RaftlineError,
    encode_message,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def test_exchange_admin_bind_and_publish(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    client.create_topic(f"{topic}.other", 1)
    name = f"{topic}-x"
    created = client.create_exchange(name, "topic", alternate_topic=f"{topic}.other")
    assert created["alternate"] == {"topic": f"{topic}.other"}
    assert client.bind(name, "eu.*", topic=topic) == {"key": "eu.*", "topic": topic}
    assert client.publish(name, "eu.de", "hello")["routed"][0]["topic"] == topic
    assert client.publish(name, "us.ny", "elsewhere")["alternate"] is True
    assert [m.value for m in client.fetch(topic, 0).messages] == [b"hello"]
    assert {"name": name, "kind": "topic", "bindings": 1} in client.list_exchanges()
    client.unbind(name, "eu.*", topic=topic)
    assert client.describe_exchange(name)["bindings"] == []
    client.delete_exchange(name)
    with pytest.raises(RaftlineError) as info:
        client.describe_exchange(name)
    assert info.value.code == "unknown_exchange" and info.value.status == 404
    with pytest.raises(ValueError):
        client.bind(name, "k")  # neither topic nor queue


def serve_in_thread(node: Cluster, queue: str, requests: int) -> threading.Thread:
    def run() -> None:
        with Client(node.urls) as own:
            own.responder(queue, lambda m: (m.text or "").upper(), wait_ms=200).serve(requests)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_request_is_answered_by_a_responder_behind_an_exchange(
    node: Cluster, client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    client.queue(f"{topic}-q").create(topic)
    client.create_exchange(f"{topic}-svc", "direct")
    client.bind(f"{topic}-svc", "shout", queue=f"{topic}-q")
    server = serve_in_thread(node, f"{topic}-q", 2)
    for word in ("hi", "there"):
        reply = client.request(word, exchange=f"{topic}-svc", routing_key="shout")
        assert reply.text == word.upper()
        assert reply.message.headers["correlation-id"] == reply.correlation_id
    server.join(timeout=30)
    assert not server.is_alive()
    # one reply topic served both requests of this client
    assert client.describe_topic(f"_reply.{client.client_id}")["partitions"][0]["high_watermark"]


def test_a_request_nobody_answers_times_out_once(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    started = time.monotonic()
    with pytest.raises(RaftlineError) as info:
        client.request("ping", topic=topic, timeout_ms=500)
    assert info.value.code == "timeout" and info.value.status == 504
    assert time.monotonic() - started < 5.0  # not retried: the wait was spent


def test_a_handler_that_raises_releases_its_message(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    client.queue(f"{topic}-q").create(topic)
    client.produce(topic, [{"value": "job"}])

    def fail(message: QueueMessage) -> str:
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        client.responder(f"{topic}-q", fail, wait_ms=500).serve(1)
    again = client.queue(f"{topic}-q").receive(wait_ms=500)
    assert [m.text for m in again] == ["job"] and again[0].delivery_count == 2


def test_async_request_and_responder(
    node: Cluster, client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    client.queue(f"{topic}-q").create(topic)

    async def main() -> str:
        async with AsyncClient(node.urls) as serving, AsyncClient(node.urls) as asking:

            async def handle(message: QueueMessage) -> str:
                await asyncio.sleep(0)
                return f"echo {message.text}"

            server = asyncio.ensure_future(serving.responder(f"{topic}-q", handle).serve(1))
            reply = await asking.request("x", topic=topic)
            assert await server == 1
            return reply.text or ""

    assert asyncio.run(main()) == "echo x"


def test_a_request_whose_requester_is_gone_is_acknowledged_without_a_reply(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    client.queue(f"{topic}-q").create(topic)
    headers: dict[str, str | bytes] = {"reply-to": "_reply.gone", "correlation-id": "c"}
    client.produce(topic, [encode_message("late", headers=headers)])
    assert client.responder(f"{topic}-q", lambda m: "answer", wait_ms=500).serve(1) == 1
    assert client.queue(f"{topic}-q").describe()["acknowledged"] == 1
