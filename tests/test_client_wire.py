"""The client's two body formats against a real node: record batches (default) and plain JSON."""

from __future__ import annotations

import itertools

import pytest
from cluster_harness import Cluster

from raftline.clients.client import Client, encode_record

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]
_names = (f"wire-{i}" for i in itertools.count())


def test_an_unknown_wire_is_refused() -> None:
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1", wire="xml")


@pytest.mark.parametrize("wire", ["batch", "json"])
def test_produced_messages_read_back_the_same_in_either_format(node: Cluster, wire: str) -> None:
    with Client(node.urls, wire=wire) as client:
        name = next(_names)
        client.create_topic(name, 1)
        with client.producer(name, linger_ms=50) as producer:
            futures = [
                producer.send(b"\xff\x00", key="k"),
                producer.send("text", headers={"h": "1"}),
            ]
        acked = [f.result() for f in futures]
        assert [a.offset for a in acked] == [acked[0].offset, acked[0].offset + 1]
        messages = client.fetch(name, 0, acked[0].offset).messages
    assert [(m.key, m.value, m.headers) for m in messages] == [
        (b"k", b"\xff\x00", {}),
        (None, b"text", {"h": "1"}),
    ]


def test_a_batch_fetch_keeps_max_messages_and_continues_after_the_last_one(node: Cluster) -> None:
    with Client(node.urls) as client:
        name = next(_names)
        client.create_topic(name, 1)
        records = [encode_record(str(i)) for i in range(5)]
        acked = client.produce_records(name, 0, records)
        first = client.fetch(name, 0, acked[0].offset, max_messages=2)
        assert [m.text for m in first.messages] == ["0", "1"]
        rest = client.fetch(name, 0, first.next_offset, max_messages=10)
    assert [m.text for m in rest.messages] == ["2", "3", "4"]
