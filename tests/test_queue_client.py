"""The queue client (sync and asyncio) against a real single-node `raftline serve` process:
create, receive, ack/release/reject on the message and in bulk, the context manager that acks
on success and releases on an exception, extend, describe and delete."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from cluster_harness import Cluster

from raftline.clients.client import AsyncClient, Client, QueueMessage, RaftlineError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


def test_sync_queue_settles_on_the_message_and_with_a_context_manager(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    client.create_topic(f"{topic}.dlq", 1)
    client.produce(topic, [{"value": f"m{i}", "partition": i % 2} for i in range(6)])
    jobs = client.queue(f"{topic}-jobs", max_messages=2, wait_ms=0)
    created = jobs.create(topic, lock_ms=5_000, max_deliveries=2, dead_letter_topic=f"{topic}.dlq")
    assert created["topic"] == topic

    first = jobs.receive()
    assert len(first) == 2 and all(isinstance(m, QueueMessage) for m in first)
    assert all(m.delivery_count == 1 and m.topic == topic for m in first)
    assert first[0].ack() is True
    assert first[0].ack() is True and first[0].error is None  # the same accept again: ok
    assert first[1].reject() is True

    with pytest.raises(RuntimeError):
        for message in jobs.receive(max_messages=1):
            with message:
                raise RuntimeError("work failed")  # released: it comes back
    for message in jobs.receive(max_messages=10):
        assert message.extend(10_000) is True
        with message:
            pass  # acknowledged
    again = jobs.receive(max_messages=10, wait_ms=1_000)
    assert again == []
    described = jobs.describe()
    assert described["acknowledged"] == 5 and described["dead_lettered"] == 1
    dead = client.fetch(f"{topic}.dlq", 0, offset="earliest")
    assert [m.headers["x-raftline-death-reason"] for m in dead.messages] == ["rejected"]
    jobs.delete()
    with pytest.raises(RaftlineError) as info:
        jobs.describe()
    assert info.value.code == "unknown_queue" and info.value.status == 404


def test_async_queue_iterates_and_acks(
    node: Cluster, client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    client.produce(topic, [{"value": f"a{i}"} for i in range(3)])

    async def main() -> list[str]:
        async with AsyncClient(node.urls) as aclient:
            queue = aclient.queue(f"{topic}-aio", max_messages=2, wait_ms=500)
            await queue.create(topic)
            seen: list[str] = []
            async for message in queue:
                async with message:
                    seen.append(message.text or "")
                if len(seen) == 3:
                    break
            released = await queue.receive(wait_ms=0)
            assert released == []
            return seen

    assert asyncio.run(main()) == ["a0", "a1", "a2"]
    assert client.queue(f"{topic}-aio").describe()["acknowledged"] == 3
