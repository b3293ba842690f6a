"""The client's bulk paths against a real node: whole batches behind one future, values only."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest
from cluster_harness import Cluster

from raftline.api.partitioner import partition_for_key
from raftline.clients.client import AsyncClient, BatchAcked, Client, RaftlineError, RetryPolicy

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def _values(n: int, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


async def test_async_batch_is_acked_with_consecutive_offsets_and_read_back_in_order(
    node: Cluster, topic_name: str
) -> None:
    async with AsyncClient(node.urls) as client:
        name = topic_name
        await client.create_topic(name, 2)
        async with client.producer(name) as producer:
            first = await (await producer.send_batch(_values(300, "a"), partition=1))
            second = await (await producer.send_batch(_values(5, "b"), partition=1))
        consumer = client.consumer(name, partitions=[1], wait_ms=0, max_messages=1000)
        values = await consumer.poll_values()
    assert first == BatchAcked(1, first.base_offset, 300)
    assert second.offsets == range(first.offsets.stop, first.offsets.stop + 5)
    assert values == _values(300, "a") + _values(5, "b")


async def test_megabyte_values_are_sent_and_fetched_whole(node: Cluster, topic_name: str) -> None:
    sent = [os.urandom(1_000_000) for _ in range(3)]
    async with AsyncClient(node.urls) as client:
        await client.create_topic(topic_name, 1)
        async with client.producer(topic_name) as producer:
            for value in sent:
                await (await producer.send_batch([value], partition=0))
        consumer = client.consumer(topic_name, wait_ms=0, max_bytes=1024 * 1024)
        fetched = [value for _ in sent for value in await consumer.poll_values()]
    assert fetched == sent


async def test_empty_answers_one_after_another_each_end(node: Cluster, topic_name: str) -> None:
    async with AsyncClient(node.urls) as client:
        for name in (f"{topic_name}-a", f"{topic_name}-b"):
            await client.create_topic(name, 1)
            await asyncio.wait_for(client.delete_topic(name), 20)  # answered without a body


def test_sync_batch_is_acked_with_consecutive_offsets_and_read_back_in_order(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    with client.producer(name) as producer:
        futures = [producer.send_batch(_values(100, f"s{n}-")) for n in range(3)]
    acked = [f.result() for f in futures]
    assert [a.count for a in acked] == [100, 100, 100]
    assert [a.base_offset for a in acked] == [
        acked[0].base_offset,
        acked[0].base_offset + 100,
        acked[0].base_offset + 200,
    ]
    values = client.consumer(name, wait_ms=0).poll_values()
    assert values == [v for n in range(3) for v in _values(100, f"s{n}-")]


async def test_a_failed_batch_fails_its_future_and_later_batches_still_land(
    node: Cluster, topic_name: str
) -> None:
    async with AsyncClient(node.urls) as client:
        name = topic_name
        await client.create_topic(name, 1)
        async with client.producer(name) as producer:
            refused = await producer.send_batch(_values(10), partition=5)
            accepted = await producer.send_batch(_values(10), partition=0)
            with pytest.raises(RaftlineError) as info:
                await refused
            assert (await accepted).count == 10
    assert info.value.code == "unknown_partition"


def test_a_failed_sync_batch_fails_only_its_own_future(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    with client.producer(name) as producer:
        refused = producer.send_batch(_values(3), partition=9)
        accepted = producer.send_batch(_values(3), partition=0)
    with pytest.raises(RaftlineError):
        refused.result()
    assert accepted.result().count == 3


def test_messages_sent_before_a_batch_are_stored_before_it(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    with client.producer(name, linger_ms=10_000) as producer:
        single = producer.send(b"first")
        batch = producer.send_batch([b"second", b"third"])
    assert batch.result().base_offset == single.result().offset + 1
    assert client.consumer(name, wait_ms=0).poll_values() == [b"first", b"second", b"third"]


async def test_async_messages_sent_before_a_batch_are_stored_before_it(
    node: Cluster, topic_name: str
) -> None:
    async with AsyncClient(node.urls) as client:
        name = topic_name
        await client.create_topic(name, 1)
        async with client.producer(name, linger_ms=10_000) as producer:
            single = await producer.send(b"first")
            batch = await producer.send_batch([b"second", b"third"])
            acked, where = await batch, await single
        values = await client.consumer(name, wait_ms=0).poll_values()
    assert acked.base_offset == where.offset + 1
    assert values == [b"first", b"second", b"third"]


def test_a_keyed_batch_goes_to_the_partition_of_its_key(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic(4)
    acked = client.produce_batch(name, partition_for_key(b"user-3", 4), [b"x"], key="user-3")
    with client.producer(name) as producer:
        future = producer.send_batch([b"y", b"z"], key="user-3")
    assert future.result().partition == acked.partition == partition_for_key(b"user-3", 4)
    [message] = client.fetch(name, acked.partition, acked.base_offset).messages[:1]
    assert message.key == b"user-3"


def test_a_batch_sent_without_acks_has_no_offsets(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    acked = client.produce_batch(name, 0, _values(4), acks="none")
    assert (acked.base_offset, acked.count) == (None, 4)
    with pytest.raises(ValueError):
        _ = acked.offsets


def test_an_empty_batch_is_refused_before_sending(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    with client.producer(name) as producer, pytest.raises(ValueError):
        producer.send_batch([])


def test_fetched_values_keep_max_messages_and_continue_after_the_last_one(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    acked = client.produce_batch(name, 0, _values(5))
    first = client.fetch_values(name, 0, acked.base_offset, max_messages=2)
    rest = client.fetch_values(name, 0, first.next_offset, max_messages=10)
    middle = client.fetch_values(name, 0, acked.base_offset + 3, max_messages=10)
    assert first.values == _values(2)
    assert rest.values == _values(5)[2:]
    assert middle.values == _values(5)[3:]


def test_json_wire_fetches_the_same_values(node: Cluster, new_topic: Callable[..., str]) -> None:
    with Client(node.urls, wire="json") as client:
        name = new_topic()
        acked = client.produce_batch(name, 0, [b"one", b"two"])
        fetched = client.fetch_values(name, 0, acked.base_offset)
    assert fetched.values == [b"one", b"two"]
    assert fetched.next_offset == acked.base_offset + 2


class FetchRecordingClient(Client):
    """A client that notes which node each fetch asked."""

    fetched_from: list[str | None]

    def exchange(self, method: str, path: str, request: Any, url: str | None = None) -> Any:
        if method == "GET" and path.endswith("/messages"):
            self.fetched_from.append(url)
        return super().exchange(method, path, request, url)


def test_a_consumer_fetches_from_the_partition_leader(
    node: Cluster, new_topic: Callable[..., str]
) -> None:
    # A node that is not the leader forwards the fetch and answers JSON, not the batches.
    with FetchRecordingClient(node.urls) as client:
        client.fetched_from = []
        name = new_topic()
        client.produce_batch(name, 0, [b"x"])
        assert client.consumer(name, wait_ms=0).poll_values() == [b"x"]
        leader = client.metadata.leader_url(name, 0)
    assert leader is not None
    assert client.fetched_from == [leader]


class AttemptRecordingClient(Client):
    """A client that notes the node of every fetch attempt, retries included."""

    attempts: list[str | None]

    def _once(self, method: str, path: str, request: Any, url: str | None) -> Any:
        if method == "GET" and path.endswith("/messages"):
            self.attempts.append(url)
        return super()._once(method, path, request, url)


def test_a_leader_address_the_client_cannot_reach_is_skipped_until_the_next_lookup(
    node: Cluster, new_topic: Callable[..., str]
) -> None:
    with AttemptRecordingClient(node.urls, retry=RetryPolicy(backoff_ms=1)) as client:
        client.attempts = []
        name = new_topic()
        client.produce_batch(name, 0, [b"a", b"b"])
        consumer = client.consumer(name, wait_ms=0, max_messages=1)
        client.refresh_metadata(name)
        leader = client.metadata.leaders[(name, 0)]
        assert leader is not None
        client.metadata.nodes[leader] = "127.0.0.1:1"  # advertised, but not reachable from here
        assert consumer.poll_values() == [b"a"]
        assert consumer.poll_values() == [b"b"]
    # One failed try at the advertised address, then the bootstrap node answers.
    assert client.attempts == ["http://127.0.0.1:1", None, None]
