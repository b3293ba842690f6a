"""The produce stream (api/produce_stream.py) on in-process nodes: an acks=all answer frame means
the batch is committed; batches sent without waiting are each answered with their own offsets;
a partition the node does not lead is answered leader_unavailable naming the leader; a bad batch
is an error frame for its request id, a frame without a header ends the stream with 1002."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from inproc_harness import http_cluster
from test_node_cluster import led_topic

from raftline.api.produce_stream import HEADER
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(120)


def frame(request_id: int, partition: int, *values: bytes) -> bytes:
    return HEADER.pack(request_id, partition) + build_batch([Record(v) for v in values])


def stream_url(base: str, topic: str) -> str:
    return f"{base}/v1/topics/{topic}/produce-stream?acks=all"


async def log_end(http: aiohttp.ClientSession, base: str, topic: str) -> int:
    async with http.get(f"{base}/v1/topics/{topic}/partitions/0/messages?offset=0") as fetched:
        return int((await fetched.json())["high_watermark"])


async def answer(socket: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    message = await socket.receive(timeout=15)
    assert message.type == aiohttp.WSMsgType.TEXT, message
    return json.loads(message.data)  # type: ignore[no-any-return]


async def test_an_acks_all_answer_frame_means_the_batch_is_committed(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        leader = await led_topic(cluster.brokers, "committed")
        base = cluster.url_of(leader)
        async with aiohttp.ClientSession() as http:
            start = await log_end(http, base, "committed")
            async with http.ws_connect(stream_url(base, "committed")) as socket:
                await socket.send_bytes(frame(7, 0, b"a", b"b"))
                acked = await answer(socket)
            assert acked == {"id": 7, "partition": 0, "base_offset": start, "count": 2}
            # A fetch reads up to the high watermark only: what a majority has.
            path = f"/v1/topics/committed/partitions/0/messages?offset={start}"
            async with http.get(base + path) as fetched:
                body = await fetched.json()
        assert [m["value"] for m in body["messages"]] == ["a", "b"]
        assert body["high_watermark"] == start + 2


async def test_pipelined_frames_are_each_answered_with_their_own_offsets(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        leader = await led_topic(cluster.brokers, "piped")
        base = cluster.url_of(leader)
        async with aiohttp.ClientSession() as http:
            start = await log_end(http, base, "piped")
            async with http.ws_connect(stream_url(base, "piped")) as socket:
                for request_id in range(1, 6):  # batches of 1, 2, ... 5 records
                    values = [b"%d" % request_id] * request_id
                    await socket.send_bytes(frame(request_id, 0, *values))
                answers = [await answer(socket) for _ in range(5)]
    by_id = {a["id"]: a for a in answers}
    assert sorted(by_id) == [1, 2, 3, 4, 5]
    spans = sorted((a["base_offset"], a["base_offset"] + a["count"]) for a in answers)
    assert spans == [(start + a, start + b) for a, b in [(0, 1), (1, 3), (3, 6), (6, 10), (10, 15)]]
    assert all(by_id[i]["count"] == i for i in by_id)


async def test_a_partition_this_node_does_not_lead_is_answered_not_leader(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        leader = await led_topic(cluster.brokers, "elsewhere")
        follower = next(i for i, b in enumerate(cluster.brokers) if b is not leader)
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(stream_url(cluster.urls[follower], "elsewhere")) as socket,
        ):
            await socket.send_bytes(frame(3, 0, b"x"))
            refused = await answer(socket)
        assert refused["id"] == 3 and refused["partition"] == 0
        assert refused["error"]["code"] == "leader_unavailable"
        assert refused["error"]["retryable"] is True
        assert refused["leader_http"] == leader.config.http
        assert leader.counters["forwarded_requests"] == 0


async def test_a_bad_batch_is_an_error_frame_and_the_stream_goes_on(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        leader = await led_topic(cluster.brokers, "garbled")
        base = cluster.url_of(leader)
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(stream_url(base, "garbled")) as socket,
        ):
            await socket.send_bytes(HEADER.pack(1, 0) + b"not a record batch")
            refused = await answer(socket)
            await socket.send_bytes(frame(2, 0, b"fine"))
            acked = await answer(socket)
    assert refused["id"] == 1 and refused["status"] == 400
    assert refused["error"]["code"] == "invalid_request"
    assert "record batch" in refused["error"]["message"]
    assert acked["id"] == 2 and acked["count"] == 1


async def test_a_frame_too_short_for_its_header_closes_the_stream_as_a_protocol_error(
    tmp_path: Path,
) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        leader = await led_topic(cluster.brokers, "short")
        base = cluster.url_of(leader)
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(stream_url(base, "short")) as socket,
        ):
            await socket.send_bytes(b"\x00\x01")
            refused = await answer(socket)
            closing = await socket.receive(timeout=15)
    assert refused["id"] is None and "12-byte header" in refused["error"]["message"]
    assert closing.type == aiohttp.WSMsgType.CLOSE
    assert closing.data == aiohttp.WSCloseCode.PROTOCOL_ERROR
