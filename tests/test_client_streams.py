"""Streamed and filtered consumers of the Python client (sync and asyncio) against a real
single-node `raftline serve` process, and the core's fall back to long-polling when the upgrade
is refused (driven without a server)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from cluster_harness import Cluster

from raftline.clients.client import AsyncClient, Client
from raftline.clients.consuming import ConsumerCore
from raftline.clients.core import Call, ClientCore, Step
from raftline.clients.queueing import QueueCore
from raftline.clients.streaming import STREAM_UNSUPPORTED, Open, Receive
from raftline.clients.websocket import receive_frame
from raftline.clients.wire import Answer, RaftlineError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


def poll_until(consumer: Any, count: int, timeout: float = 20.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll()
    return got


def test_a_streamed_consumer_receives_records_produced_after_it_connected(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    consumer = client.consumer(topic, offset="latest", stream=True, wait_ms=300)
    assert consumer.poll() == []  # connected, nothing yet
    assert consumer.stream.handle is not None
    later = threading.Timer(0.3, lambda: client.produce(topic, [{"value": "late", "key": "k"}]))
    later.start()
    got = poll_until(consumer, 1)
    later.join()
    assert [m.value for m in got] == [b"late"]
    consumer.close()


def test_a_streamed_poll_on_a_quiet_topic_ends_at_its_wait_though_pings_keep_coming(
    client: Client, new_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pong every 0.05 s: aiohttp's own receive timeout would start again at each of them.
    monkeypatch.setattr("raftline.clients.websocket.PING_S", 0.05)
    consumer = client.consumer(new_topic(1), offset="latest", stream=True, wait_ms=800)
    polled: list[Any] = []
    poll = threading.Thread(target=lambda: polled.append(consumer.poll()), daemon=True)
    poll.start()
    poll.join(timeout=10)
    assert polled == [[]], "the poll went on past its wait"
    consumer.close()


def test_a_streamed_consumer_gets_its_window_back_as_it_polls(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    client.produce(topic, [{"value": f"v{i}"} for i in range(25)])
    consumer = client.consumer(topic, stream=True, prefetch=4, max_messages=4, wait_ms=300)
    sizes = []
    got: list[Any] = []
    while len(got) < 25:
        batch = consumer.poll()
        sizes.append(len(batch))
        got += batch
    assert [m.value for m in got] == [f"v{i}".encode() for i in range(25)]
    assert max(sizes) <= 4
    consumer.close()


def test_a_filtered_consumer_reads_only_matching_records(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    client.produce(
        topic,
        [{"value": f"v{i}", "headers": {"region": "eu" if i % 2 else "us"}} for i in range(10)],
    )
    for stream in (False, True):
        consumer = client.consumer(
            topic, filter='headers.region == "eu"', stream=stream, wait_ms=200
        )
        got = poll_until(consumer, 5)
        assert [m.value for m in got] == [f"v{i}".encode() for i in (1, 3, 5, 7, 9)]
        assert consumer.poll() == []
        consumer.close()
    fetched = client.fetch(topic, 0, filter='headers.region == "us"')
    assert [m.value for m in fetched.messages] == [f"v{i}".encode() for i in (0, 2, 4, 6, 8)]
    assert fetched.next_offset == fetched.high_watermark


def test_a_streamed_group_consumer_reads_everything_once_and_commits(
    client: Client, new_topic: Callable[..., str], node: Cluster
) -> None:
    topic = new_topic(2)
    client.produce(topic, [{"value": f"v{i}", "key": f"k{i}"} for i in range(30)])
    with client.consumer(
        topic, group=f"{topic}-g", auto_offset_reset="earliest", stream=True, prefetch=7
    ) as consumer:
        got = poll_until(consumer, 30)
        assert consumer.stream.handle is not None  # pushed, not long-polled
        consumer.commit()
    assert sorted(m.value for m in got) == sorted(f"v{i}".encode() for i in range(30))
    lag = sum(o["lag"] for o in client.group_offsets(f"{topic}-g"))
    assert lag == 0


def test_a_streamed_queue_receiver_has_at_most_its_prefetch_unsettled(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    client.produce(topic, [{"value": f"j{i}"} for i in range(6)])
    queue = client.queue(f"{topic}-q", stream=True, prefetch=2, wait_ms=500)
    queue.create(topic)
    first = queue.receive()
    assert len(first) == 2 and queue.stream.handle is not None
    assert queue.receive() == []  # nothing settled: the window is spent
    queue.ack(first)
    done = list(first)
    deadline = time.monotonic() + 20
    while len(done) < 6 and time.monotonic() < deadline:
        batch = queue.receive()
        assert len(batch) <= 2
        queue.ack(batch)
        done += batch
    assert sorted(m.value for m in done) == sorted(f"j{i}".encode() for i in range(6))
    queue.close()


def test_an_ack_beside_a_waiting_streamed_receive_gives_its_credit_back_at_once(
    node: Cluster, topic_name: str
) -> None:
    async def main() -> list[Any]:
        async with AsyncClient(node.urls) as client:
            await client.create_topic(topic_name, 1)
            await client.produce(topic_name, [{"value": "q1"}, {"value": "q2"}])
            queue = client.queue(f"{topic_name}-q", stream=True, prefetch=1, wait_ms=20_000)
            await queue.create(topic_name)
            first = await queue.receive()
            waiting = asyncio.ensure_future(queue.receive())  # no credit left: it waits
            await asyncio.sleep(0.2)
            await queue.ack(first)
            # Without the grant sent with the ack, the credit went out with the next receive
            # only: this one would wait its 20 s out.
            second = await asyncio.wait_for(waiting, 10)
            await queue.ack(second)
            await queue.close()
            return first + second

    assert [m.value for m in asyncio.run(main())] == [b"q1", b"q2"]


def test_the_async_client_streams_too(node: Cluster, topic_name: str) -> None:
    async def main() -> list[Any]:
        async with AsyncClient(node.urls) as client:
            await client.create_topic(topic_name, 1)
            consumer = client.consumer(topic_name, offset="latest", stream=True, wait_ms=300)
            assert await consumer.poll() == []

            async def later() -> None:
                await asyncio.sleep(0.3)
                await client.produce(topic_name, [{"value": "a1"}, {"value": "a2"}])

            producing = asyncio.ensure_future(later())
            got: list[Any] = []
            while len(got) < 2:
                got += await consumer.poll()
            await producing
            await consumer.close()
            return got

    assert [m.value for m in asyncio.run(main())] == [b"a1", b"a2"]


def test_a_refused_upgrade_falls_back_to_long_polling() -> None:
    core = ClientCore("http://127.0.0.1:1")
    core.metadata.partitions["t"] = 1  # no lookups: the consumer reads partition 0
    core.metadata.fresh = lambda topic: True  # type: ignore[method-assign]
    core.metadata.leader_url = lambda topic, partition: None  # type: ignore[method-assign]
    consumer = ConsumerCore(core, "t", partitions=[0], stream=True)
    step = Step(consumer.polled(values=False))
    assert isinstance(step.call, Open)
    step.throw(RaftlineError(STREAM_UNSUPPORTED, "HTTP 426", retryable=False))
    assert isinstance(step.call, Call) and step.call.path.endswith("/partitions/0/messages")
    body = b'{"messages": [], "next_offset": 3, "log_start_offset": 0, "high_watermark": 3}'
    step.send(Answer({"content-type": "application/json"}, body))
    assert step.call is None and step.result == []
    again = Step(consumer.polled(values=False))  # the next polls long-poll too, for a while
    assert isinstance(again.call, Call)


def test_a_stream_grants_back_what_the_application_consumed() -> None:
    core = ClientCore("http://127.0.0.1:1")
    consumer = ConsumerCore(core, "t", partitions=[0], stream=True, prefetch=5)
    step = Step(consumer.polled(values=False))
    assert isinstance(step.call, Open) and step.call.params["credit"] == "5"
    step.send("handle")
    assert isinstance(step.call, Receive) and step.call.credit == 0
    frame = {
        "messages": [{"topic": "t", "partition": 0, "offset": o, "value": "x"} for o in (3, 4)],
        "positions": [{"topic": "t", "partition": 0, "offset": 5}],
    }
    step.send(frame)  # type: ignore[arg-type]
    assert [m.offset for m in step.result] == [3, 4]  # type: ignore[union-attr]
    nxt = Step(consumer.polled(values=False))
    assert isinstance(nxt.call, Receive) and nxt.call.credit == 2
    assert consumer.positions is not None and consumer.positions.next[0] == 5


def test_a_streamed_queue_asks_for_msgpack_frames_and_takes_json_ones_too() -> None:
    core = ClientCore("http://127.0.0.1:1")
    queue = QueueCore(core, "jobs", stream=True, prefetch=5)
    step = Step(queue.received(10, 500))
    assert isinstance(step.call, Call)  # where the shard leader is: the queue's description
    step.send(Answer({"raftline-queue-leader": "127.0.0.1:2"}, b"{}"))
    assert isinstance(step.call, Open) and step.call.params["format"] == "msgpack"
    step.send("handle")
    assert isinstance(step.call, Receive)
    message = {"topic": "t", "partition": 0, "offset": 3, "timestamp": 1, "key": None}
    packed = {**message, "value": b"\xff", "headers": {"h": b"\xfe"}}
    frame = msgpack.packb({"messages": [{**packed, "receipt": "r1", "delivery_count": 1}]})
    step.send(frame)  # type: ignore[arg-type]
    assert [(m.value, m.headers) for m in step.result or []] == [(b"\xff", {"h": b"\xfe"})]
    # a server that does not know the parameter sends JSON text frames
    old = {**message, "value_b64": "/w==", "headers": {}, "headers_b64": {"h": "/g=="}}
    again = Step(queue.received(10, 500))
    again.send({"messages": [{**old, "receipt": "r2", "delivery_count": 1}]})  # type: ignore[arg-type]
    assert [(m.value, m.headers) for m in again.result or []] == [(b"\xff", {"h": b"\xfe"})]


class RecordingSocket:
    """The two calls receive_frame makes of a client WebSocket: the texts sent, no frame."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_str(self, text: str) -> None:
        self.sent.append(text)

    async def receive(self) -> Any:
        await asyncio.sleep(3600)  # no frame comes: the receive's wait ends it


def test_a_receive_sends_a_credit_frame_only_when_it_grants_credit_or_names_a_frame_seen() -> None:
    async def sent_by(credit: int, seen: int | None) -> list[Any]:
        socket = RecordingSocket()
        assert await receive_frame(Receive(socket, credit, 0.01, seen)) is None
        return [json.loads(text) for text in socket.sent]

    async def main() -> None:
        assert await sent_by(0, None) == []  # a queue stream's credit goes back with its acks
        assert await sent_by(3, None) == [{"credit": 3}]
        assert await sent_by(0, 7) == [{"credit": 0, "seen": 7}]  # a group member is back

    asyncio.run(main())


def test_the_async_group_consumer_and_queue_stream_too(node: Cluster, topic_name: str) -> None:
    async def main() -> tuple[list[Any], list[Any]]:
        async with AsyncClient(node.urls) as client:
            await client.create_topic(topic_name, 2)
            await client.produce(topic_name, [{"value": f"g{i}", "key": f"k{i}"} for i in range(8)])
            member = client.consumer(
                topic_name, group=f"{topic_name}-g", auto_offset_reset="earliest", stream=True
            )
            got: list[Any] = []
            while len(got) < 8:
                got += await member.poll()
            assert member.stream.handle is not None
            await member.close()
            queue = client.queue(f"{topic_name}-q", stream=True, filter='key == "k3"')
            await queue.create(topic_name)
            received: list[Any] = []
            while not received:
                received = await queue.receive()
            await queue.ack(received)
            await queue.close()
            return got, received

    got, received = asyncio.run(main())
    assert sorted(m.value for m in got) == sorted(f"g{i}".encode() for i in range(8))
    assert [m.value for m in received] == [b"g3"]


class RefusingProxy:
    """A plain HTTP proxy to the node that refuses WebSocket upgrades (as some load balancers
    do), on a loop of its own in a thread."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.upgrades_refused = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> str:
        from aiohttp import ClientSession, web

        self.session = ClientSession()

        async def forward(request: web.Request) -> web.Response:
            if request.headers.get("Upgrade", "").lower() == "websocket":
                self.upgrades_refused += 1
                return web.Response(status=400, text="no upgrades here")
            async with self.session.request(
                request.method,
                self.target + request.path_qs,
                data=await request.read(),
                headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
            ) as answer:
                body = await answer.read()
                headers = {
                    k: v
                    for k, v in answer.headers.items()
                    if k.lower() == "content-type" or k.lower().startswith("raftline-")
                }
                return web.Response(status=answer.status, body=body, headers=headers)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    def close(self) -> None:
        async def stop() -> None:
            await self.session.close()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_behind_a_proxy_that_refuses_upgrades_a_streamed_consumer_long_polls(
    node: Cluster, topic_name: str
) -> None:
    proxy = RefusingProxy(node.urls.split(",")[0])
    try:
        with Client(proxy.url) as client:
            client.create_topic(topic_name, 1)
            client.produce(topic_name, [{"value": f"p{i}"} for i in range(5)])
            consumer = client.consumer(topic_name, stream=True, wait_ms=200)
            got = poll_until(consumer, 5)
            assert [m.value for m in got] == [f"p{i}".encode() for i in range(5)]
            assert proxy.upgrades_refused == 1 and consumer.stream.handle is None
            consumer.close()
    finally:
        proxy.close()
