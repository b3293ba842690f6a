"""Binary header values and producer-side compression through a real node, byte for byte."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cluster_harness import Cluster

from raftline.clients.client import AsyncClient, Client, encode_message
from raftline.clients.wire import fetch_request, messages_path
from raftline.raftlog.batch import iter_headers
from raftline.raftlog.compression import Codec

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

HEADERS = {"raw": bytes(range(256)), "bad-utf8": b"\xc3\x28", "text": "é", "empty": b""}
EXPECTED = {"raw": bytes(range(256)), "bad-utf8": b"\xc3\x28", "text": "é", "empty": ""}


@pytest.mark.parametrize("wire", ["batch", "json"])
def test_binary_header_values_round_trip_byte_for_byte(
    node: Cluster, new_topic: Callable[..., str], wire: str
) -> None:
    name = new_topic()
    with Client(node.urls, wire=wire) as client:
        with client.producer(name) as producer:
            future = producer.send(b"v", headers=HEADERS)
        [json_acked] = client.produce(name, [encode_message("w", headers=HEADERS)])
        first = client.fetch(name, 0, future.result().offset).messages[0]
        second = client.fetch(name, 0, json_acked.offset).messages[0]
    assert first.headers == second.headers == EXPECTED


def test_the_json_fetch_answer_carries_binary_headers_as_headers_b64(
    client: Client, new_topic: Callable[..., str]
) -> None:
    name = new_topic()
    [acked] = client.produce(name, [encode_message("v", headers={"h": b"\xff", "t": "x"})])
    body = client.call("GET", messages_path(name, 0), params={"offset": str(acked.offset)})
    [message] = body["messages"]
    assert (message["headers"], message["headers_b64"]) == ({"t": "x"}, {"h": "/w=="})


def _stored_codecs(client: Client, topic: str, offset: int) -> list[int]:
    request = fetch_request("batch", offset, 500, 1 << 20, 0)
    answer = client.exchange("GET", messages_path(topic, 0), request)
    return [header.codec for _, header in iter_headers(memoryview(answer.raw))]


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_a_producer_compressed_batch_is_stored_as_sent(
    client: Client, topic_name: str, compression: str
) -> None:
    client.create_topic(topic_name, 1, config={"compression.type": "producer"})
    values = [f"value {i} ".encode() * 20 for i in range(50)]
    with client.producer(topic_name, compression=compression, linger_ms=10_000) as producer:
        futures = [producer.send(v, headers={"h": b"\x00\xff"}) for v in values]
    first = futures[0].result().offset
    fetched = client.fetch(topic_name, 0, first).messages
    assert [m.value for m in fetched] == values
    assert all(m.headers == {"h": b"\x00\xff"} for m in fetched)
    assert _stored_codecs(client, topic_name, first) == [Codec[compression.upper()]]


async def test_an_async_compressed_batch_is_stored_as_sent(node: Cluster, topic_name: str) -> None:
    async with AsyncClient(node.urls) as client:
        await client.create_topic(topic_name, 1, config={"compression.type": "producer"})
        async with client.producer(topic_name, compression="zstd") as producer:
            batch = await (await producer.send_batch([b"a" * 500, b"b" * 500], partition=0))
        fetched = await client.fetch_values(topic_name, 0, batch.base_offset)
    assert fetched.values == [b"a" * 500, b"b" * 500]
    with Client(node.urls) as sync:
        assert _stored_codecs(sync, topic_name, batch.base_offset) == [Codec.ZSTD]


def test_a_topic_with_its_own_compression_recompresses_what_the_producer_sent(
    client: Client, topic_name: str
) -> None:
    client.create_topic(topic_name, 1, config={"compression.type": "lz4"})
    with client.producer(topic_name, compression="gzip") as producer:
        future = producer.send(b"x" * 300)
    offset = future.result().offset
    assert client.fetch_values(topic_name, 0, offset).values == [b"x" * 300]
    assert _stored_codecs(client, topic_name, offset) == [Codec.LZ4]
