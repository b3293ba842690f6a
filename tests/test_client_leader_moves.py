"""A node that forwards a request to the partition's leader names that leader in its answer, and
the client sends its next requests of the partition there instead of paying the forward again."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from inproc_harness import http_cluster
from test_node_cluster import led_topic

from raftline.api.app import LEADER_HEADER
from raftline.clients.aio import AsyncClient
from raftline.clients.core import Call
from raftline.clients.metadata import Metadata
from raftline.clients.wire import Answer, Request

pytestmark = pytest.mark.timeout(120)


async def test_an_answer_a_follower_forwarded_names_the_leader(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        brokers = cluster.brokers
        leader = await led_topic(brokers, "routed")
        path = "/v1/topics/routed/partitions/0/messages?offset=0"
        async with aiohttp.ClientSession() as http:
            for index, broker in enumerate(brokers):
                async with http.get(cluster.urls[index] + path) as answer:
                    assert answer.status == 200
                    named = answer.headers.get(LEADER_HEADER)
                    expected = None if broker is leader else str(leader.node_id)
                    assert named == expected, broker.node_id


async def test_a_producer_sends_to_the_leader_a_forwarded_answer_named(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        brokers = cluster.brokers
        leader = await led_topic(brokers, "moved")
        follower = next(b for b in brokers if b is not leader)
        async with AsyncClient(",".join(cluster.urls)) as client:
            await client._run(client.refreshed("moved"))
            client.metadata.leaders[("moved", 0)] = follower.node_id  # as if the leader moved
            async with client.producer("moved") as producer:
                for value in (b"one", b"two", b"three"):
                    await producer.send(value, partition=0)
                    await producer.flush()
        assert follower.counters["forwarded_requests"] == 1
        assert client.metadata.leaders[("moved", 0)] == leader.node_id


def test_a_leader_the_client_has_no_address_for_is_not_taken() -> None:
    metadata = Metadata()
    metadata.update(
        {"name": "t", "partitions": [{"partition": 0, "leader": 1}]},
        {"nodes": [{"id": 1, "http": "a:1"}, {"id": 2, "http": "b:1"}]},
    )
    metadata.leader_moved("t", 0, 9)
    assert metadata.leader_url("t", 0) == "http://a:1"
    metadata.leader_moved("t", 0, 2)
    assert metadata.leader_url("t", 0) == "http://b:1"


def test_a_failed_call_still_reaches_the_op_that_made_it() -> None:
    client = AsyncClient("http://a:1")
    client.metadata.update(
        {"name": "t", "partitions": [{"partition": 0, "leader": 1}]},
        {"nodes": [{"id": 1, "http": "a:1"}]},
    )
    seen: list[str] = []

    def op(url: str | None):  # type: ignore[no-untyped-def]
        try:
            yield Call("GET", "/x", Request(), url)
        except OSError as error:
            seen.append(str(error))
        answer = yield Call("GET", "/y", Request(), url)
        return answer.raw

    steps = client.to_leader("t", 0, op)
    next(steps)
    steps.throw(OSError("refused"))
    with pytest.raises(StopIteration) as done:
        steps.send(Answer({}, b"body"))
    assert done.value.value == b"body" and seen == ["refused"]
