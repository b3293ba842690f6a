"""The Python client (sync and asyncio) against a real single-node `raftline serve` process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from cluster_harness import Cluster

from raftline.api.partitioner import partition_for_key
from raftline.clients.client import (
    Acked,
    AsyncClient,
    Client,
    RaftlineError,
    RetryPolicy,
    encode_message,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def test_admin_calls_create_list_describe_and_delete(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic(2)
    assert name in [t["name"] for t in client.list_topics()]
    assert len(client.describe_topic(name)["partitions"]) == 2
    client.delete_topic(name)
    assert name not in [t["name"] for t in client.list_topics()]


def test_errors_carry_the_contract_code(client: Client) -> None:
    with pytest.raises(RaftlineError) as info:
        client.describe_topic("no-such-topic")
    assert (info.value.code, info.value.status, info.value.retryable) == (
        "unknown_topic",
        404,
        False,
    )


def test_unreachable_broker_is_a_retryable_connection_error() -> None:
    client = Client("http://127.0.0.1:1", retry=RetryPolicy(retries=1, backoff_ms=1))
    with client, pytest.raises(RaftlineError) as info:
        client.list_topics()
    assert info.value.code == "connection_failed"
    assert info.value.retryable


def test_sync_producer_batches_and_consumer_reads_back_in_order(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    with client.producer(name, linger_ms=20) as producer:
        futures = [producer.send(f"m{i}") for i in range(200)]
    acked = [f.result() for f in futures]
    assert [a.offset for a in acked] == list(range(acked[0].offset, acked[0].offset + 200))
    consumer = client.consumer(name, wait_ms=0)
    values = [m.text for m in consumer.poll()]
    assert values == [f"m{i}" for i in range(200)]


def test_producer_sends_keys_to_the_kafka_partition(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic(3)
    with client.producer(name) as producer:
        future = producer.send("v", key="user-7")
    assert future.result().partition == partition_for_key(b"user-7", 3)


def test_binary_values_and_headers_round_trip(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    [acked] = client.produce(name, [encode_message(b"\x00\xff", key=b"k", headers={"h": "1"})])
    [message] = client.fetch(name, 0, acked.offset).messages
    assert (message.value, message.key, message.headers) == (b"\x00\xff", b"k", {"h": "1"})


def test_consumer_long_poll_sees_a_later_message(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    consumer = client.consumer(name, offset="latest", wait_ms=5000)
    later = threading.Timer(0.3, client.produce, (name, [encode_message("late")]))
    later.start()
    try:
        assert [m.text for m in consumer.poll()] == ["late"]
    finally:
        later.join()


def test_async_producer_and_consumer_round_trip(node: Cluster, topic_name: str) -> None:
    async def scenario() -> tuple[list[Acked], list[str | None]]:
        async with AsyncClient(node.urls) as client:
            name = topic_name
            await client.create_topic(name, 2)
            async with client.producer(name, linger_ms=10) as producer:
                futures = [await producer.send(f"a{i}", partition=i % 2) for i in range(50)]
            acked = list(await asyncio.gather(*futures))
            consumer = client.consumer(name, wait_ms=0)
            values = [m.text for m in await consumer.poll()]
            return acked, values

    acked, values = asyncio.run(scenario())
    assert [a.partition for a in acked] == [i % 2 for i in range(50)]
    assert sorted(values, key=lambda v: int(v[1:])) == [f"a{i}" for i in range(50)]
