"""Server-side filters and streams through the HTTP API of one in-process node: filtered fetches
skip and advance, group positions and commits pass filtered records, a filtered queue receive
leaves the others to other receivers; a stream pushes records produced after it connected and
never sends more than the credit its client granted; a queue stream's msgpack frames carry what
its JSON frames do."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
from typing import Any

import msgpack
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from raftline.clients.queueing import QueueCore
from raftline.clients.streaming import batch_frame
from raftline.clients.wire import fetch_answer

pytestmark = pytest.mark.timeout(90)


async def ok(api: TestClient, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    response = await api.request(method, path, json=body, **kw)
    text = await response.text()
    assert response.status < 300, (response.status, text)
    return json.loads(text) if text else None


async def regions(api: TestClient, topic: str = "orders", count: int = 12) -> None:
    """`count` messages on partition 0: key k<i>, header region eu/us/ap in turn, trace on
    every third."""
    await ok(api, "POST", "/v1/topics", {"name": topic, "partitions": 1})
    messages = []
    for i in range(count):
        headers = {"region": ["eu", "us", "ap"][i % 3]}
        if i % 3 == 0:
            headers["trace"] = f"t{i}"
        messages.append({"key": f"k{i}", "value": f"v{i}", "headers": headers, "partition": 0})
    await ok(api, "POST", f"/v1/topics/{topic}/messages", {"messages": messages})


async def test_filtered_fetch_returns_only_matching_records_and_advances_past_the_rest(
    api: TestClient,
) -> None:
    await regions(api)
    body = await ok(
        api, "GET", "/v1/topics/orders/partitions/0/messages", params={"header.region": "us"}
    )
    assert [m["value"] for m in body["messages"]] == ["v1", "v4", "v7", "v10"]
    assert body["next_offset"] == 13  # the ap and eu records after v10 are passed over too


async def test_a_filtered_fetch_with_a_small_limit_resumes_after_its_last_match(
    api: TestClient,
) -> None:
    await regions(api)
    params = {"filter": 'headers.region == "ap"', "max_messages": "2"}
    first = await ok(api, "GET", "/v1/topics/orders/partitions/0/messages", params=params)
    assert [m["offset"] for m in first["messages"]] == [3, 6]
    params["offset"] = str(first["next_offset"])
    second = await ok(api, "GET", "/v1/topics/orders/partitions/0/messages", params=params)
    assert [m["offset"] for m in second["messages"]] == [9, 12]
    assert second["next_offset"] == 13


async def test_simple_filter_forms_are_all_required_at_once(api: TestClient) -> None:
    await regions(api)
    body = await ok(
        api,
        "GET",
        "/v1/topics/orders/partitions/0/messages",
        params={"has_header": "trace", "header.region": "eu", "filter": "offset >= 5"},
    )
    assert [m["key"] for m in body["messages"]] == ["k6", "k9"]
    by_key = await ok(api, "GET", "/v1/topics/orders/partitions/0/messages", params={"key": "k5"})
    assert [m["offset"] for m in by_key["messages"]] == [6]


async def test_a_filter_that_matches_nothing_answers_empty_at_the_end(api: TestClient) -> None:
    await regions(api)
    body = await ok(api, "GET", "/v1/topics/orders/partitions/0/messages", params={"key": "nobody"})
    assert body["messages"] == [] and body["next_offset"] == 13


async def test_a_bad_filter_is_a_400_naming_the_problem_and_position(api: TestClient) -> None:
    await regions(api)
    response = await api.get(
        "/v1/topics/orders/partitions/0/messages", params={"filter": 'key == "a" and'}
    )
    body = await response.json()
    assert response.status == 400
    assert body["error"]["code"] == "invalid_request"
    assert "position 14" in body["error"]["message"] and body["filter_position"] == 14


async def test_a_filtered_fetch_asking_for_batches_gets_json(api: TestClient) -> None:
    await regions(api)
    response = await api.get(
        "/v1/topics/orders/partitions/0/messages",
        params={"key": "k3"},
        headers={"Accept": "application/vnd.raftline.batch"},
    )
    assert response.content_type == "application/json"
    assert [m["key"] for m in (await response.json())["messages"]] == ["k3"]


async def join(api: TestClient) -> dict[str, Any]:
    """A member of group g reading orders from the earliest offset."""
    body = {"topics": ["orders"], "auto_offset_reset": "earliest"}
    joined: dict[str, Any] = await ok(api, "POST", "/v1/groups/g/members", body)
    return joined


async def test_a_filtered_group_fetch_commits_past_the_records_it_skipped(api: TestClient) -> None:
    await regions(api)
    joined = await join(api)
    member = joined["member_id"]
    body = await ok(
        api,
        "GET",
        f"/v1/groups/g/members/{member}/messages",
        params={"filter": 'headers.region in ("eu")'},
    )
    assert [m["value"] for m in body["messages"]] == ["v0", "v3", "v6", "v9"]
    assert body["positions"] == [{"topic": "orders", "partition": 0, "offset": 13}]
    again = await ok(api, "GET", f"/v1/groups/g/members/{member}/messages")
    assert again["messages"] == []  # the member never reads the skipped records again
    commit = {"member_id": member, "generation": joined["generation"], "offsets": body["positions"]}
    await ok(api, "POST", "/v1/groups/g/offsets", commit)
    offsets = await ok(api, "GET", "/v1/groups/g/offsets")
    assert [(o["offset"], o["lag"]) for o in offsets["offsets"]] == [(13, 0)]


async def test_a_filtered_queue_receive_leaves_other_records_to_other_receivers(
    api: TestClient,
) -> None:
    await regions(api, "work", 6)
    await ok(api, "POST", "/v1/queues", {"name": "jobs", "topic": "work"})
    eu = await ok(
        api,
        "POST",
        "/v1/queues/jobs/receive",
        {"max_messages": 10, "filter": {"headers": {"region": "eu"}}},
    )
    assert [m["value"] for m in eu["messages"]] == ["v0", "v3"]
    assert all(m["delivery_count"] == 1 for m in eu["messages"])
    rest = await ok(api, "POST", "/v1/queues/jobs/receive", {"max_messages": 10})
    assert sorted(m["value"] for m in rest["messages"]) == ["v1", "v2", "v4", "v5"]
    assert all(m["delivery_count"] == 1 for m in rest["messages"])  # never counted as delivered


async def test_a_bad_queue_filter_is_a_400(api: TestClient) -> None:
    await regions(api, "work", 1)
    await ok(api, "POST", "/v1/queues", {"name": "jobs", "topic": "work"})
    response = await api.post("/v1/queues/jobs/receive", json={"filter": "timestamp > 'x'"})
    assert response.status == 400
    assert "timestamp is an integer" in (await response.json())["error"]["message"]


async def frames(socket: Any, timeout: float = 5.0) -> dict[str, Any]:
    message = await socket.receive(timeout=timeout)
    assert message.type == WSMsgType.TEXT, message
    return json.loads(message.data)


async def test_a_stream_pushes_records_produced_after_it_connected(api: TestClient) -> None:
    await ok(api, "POST", "/v1/topics", {"name": "live", "partitions": 2})
    socket = await api.ws_connect("/v1/topics/live/stream", params={"offset": "latest"})
    await asyncio.sleep(0.3)  # connected and waiting
    later = {"messages": [{"value": "x", "partition": 1}]}
    await ok(api, "POST", "/v1/topics/live/messages", later)
    frame = await frames(socket)
    assert [(m["topic"], m["partition"], m["value"]) for m in frame["messages"]] == [
        ("live", 1, "x")
    ]
    assert {"topic": "live", "partition": 1, "offset": 2} in frame["positions"]
    await socket.close()


async def test_a_stream_never_sends_more_than_the_credit_granted(api: TestClient) -> None:
    await regions(api)
    socket = await api.ws_connect(
        "/v1/topics/orders/stream", params={"credit": "5", "max_messages": "3"}
    )
    got = []
    while len(got) < 5:
        got += [m["offset"] for m in (await frames(socket))["messages"]]
    assert got == [1, 2, 3, 4, 5]
    with pytest.raises(asyncio.TimeoutError):  # the window is spent: nothing more comes
        await socket.receive(timeout=1.0)
    await socket.send_str(json.dumps({"credit": 4}))
    more = []
    while len(more) < 4:
        more += [m["offset"] for m in (await frames(socket))["messages"]]
    assert more == [6, 7, 8, 9]
    with pytest.raises(asyncio.TimeoutError):
        await socket.receive(timeout=1.0)
    await socket.close()


async def test_a_stream_resumes_from_per_partition_offsets_with_a_filter(api: TestClient) -> None:
    await regions(api)
    socket = await api.ws_connect(
        "/v1/topics/orders/stream", params={"offset.0": "5", "has_header": "trace"}
    )
    frame = await frames(socket)
    assert [m["offset"] for m in frame["messages"]] == [7, 10]
    assert frame["positions"] == [{"topic": "orders", "partition": 0, "offset": 13}]
    await socket.close()


async def test_a_group_stream_sends_group_fetch_answers(api: TestClient) -> None:
    await regions(api)
    joined = await join(api)
    socket = await api.ws_connect(
        f"/v1/groups/g/members/{joined['member_id']}/stream", params={"key": "k7"}
    )
    frame = await frames(socket)
    assert frame["generation"] == joined["generation"]
    assert [m["value"] for m in frame["messages"]] == ["v7"]
    assert frame["positions"] == [{"topic": "orders", "partition": 0, "offset": 13}]
    await socket.close()


async def test_a_queue_stream_pushes_locked_messages_within_its_credit(api: TestClient) -> None:
    await regions(api, "work", 6)
    await ok(api, "POST", "/v1/queues", {"name": "jobs", "topic": "work"})
    socket = await api.ws_connect("/v1/queues/jobs/stream", params={"credit": "2"})
    frame = await frames(socket)
    assert len(frame["messages"]) == 2 and all("receipt" in m for m in frame["messages"])
    with pytest.raises(asyncio.TimeoutError):
        await socket.receive(timeout=1.0)
    await socket.close()
    described = await ok(api, "GET", "/v1/queues/jobs")
    assert described["locked"] == 2


async def streamed_queue(api: TestClient, queue: str, params: dict[str, str]) -> list[Any]:
    """Every frame of a new stream on `queue` until none comes for half a second."""
    socket = await api.ws_connect(f"/v1/queues/{queue}/stream", params=params)
    got = []
    with contextlib.suppress(asyncio.TimeoutError):
        while True:
            got.append(await socket.receive(timeout=0.5))
    await socket.close()
    return got


async def test_a_msgpack_queue_stream_carries_exactly_what_a_json_one_does(
    api: TestClient,
) -> None:
    await ok(api, "POST", "/v1/topics", {"name": "mixed", "partitions": 1})
    binary = base64.b64encode(b"\xff\x00bin").decode()
    messages = [
        {"value": "text", "key": "k", "headers": {"h": "v"}, "partition": 0},
        {"value_b64": binary, "headers_b64": {"raw": binary}, "partition": 0},
        {"key_b64": binary, "value": "", "headers": {"h": "v"}, "partition": 0},
    ]
    await ok(api, "POST", "/v1/topics/mixed/messages", {"messages": messages})
    for name in ("as-json", "as-msgpack"):  # two queues over the topic: each gets every record
        await ok(api, "POST", "/v1/queues", {"name": name, "topic": "mixed"})
    texts = await streamed_queue(api, "as-json", {})
    packed = await streamed_queue(api, "as-msgpack", {"format": "msgpack"})
    assert {f.type for f in texts} == {WSMsgType.TEXT}
    assert {f.type for f in packed} == {WSMsgType.BINARY}
    core = QueueCore.__new__(QueueCore)  # its decoding only
    from_json = [core._message(m) for f in texts for m in json.loads(f.data)["messages"]]
    from_msgpack = [
        core._message(m, packed=True) for f in packed for m in msgpack.unpackb(f.data)["messages"]
    ]
    assert len(from_json) == 3
    unreceipted = [
        [dataclasses.replace(m, receipt="") for m in got] for got in (from_json, from_msgpack)
    ]
    assert unreceipted[0] == unreceipted[1]
    assert from_msgpack[1].value == b"\xff\x00bin" and from_msgpack[1].headers == {
        "raw": b"\xff\x00bin"
    }
    # receipts are the queue's own: the msgpack ones settle as JSON ones do
    receipts = [m.receipt for m in from_msgpack]
    settled = await ok(api, "POST", "/v1/queues/as-msgpack/ack", {"receipts": receipts})
    assert all(r["ok"] for r in settled["results"])


async def test_a_queue_stream_refuses_an_unknown_format(api: TestClient) -> None:
    await regions(api, "work", 1)
    await ok(api, "POST", "/v1/queues", {"name": "jobs", "topic": "work"})
    response = await api.get(
        "/v1/queues/jobs/stream", params={"format": "xml"}, headers={"Upgrade": "websocket"}
    )
    assert response.status == 400
    assert "format" in (await response.json())["error"]["message"]


async def test_a_stream_without_websocket_is_refused_with_426(api: TestClient) -> None:
    await regions(api, "live", 1)
    response = await api.get("/v1/topics/live/stream")
    assert response.status == 426
    assert "WebSocket" in (await response.json())["error"]["message"]


async def test_a_bad_credit_frame_ends_the_stream_with_an_error(api: TestClient) -> None:
    await regions(api, "live", 1)
    socket = await api.ws_connect("/v1/topics/live/stream", params={"offset": "latest"})
    await socket.send_str(json.dumps({"credit": -1}))
    frame = await frames(socket)
    assert frame["error"]["code"] == "invalid_request"
    assert (await socket.receive(timeout=5)).type in (WSMsgType.CLOSE, WSMsgType.CLOSED)


async def test_a_batch_stream_sends_stored_batches_and_decodes_only_what_credit_cuts(
    api: TestClient,
) -> None:
    await ok(api, "POST", "/v1/topics", {"name": "raw", "partitions": 1})
    for batch in range(2):  # two stored batches of three records each
        three = [{"value": f"b{batch}-{i}", "partition": 0} for i in range(3)]
        await ok(api, "POST", "/v1/topics/raw/messages", {"messages": three})
    socket = await api.ws_connect(
        "/v1/topics/raw/stream", params={"format": "batches", "credit": "5"}
    )
    first = await socket.receive(timeout=5)
    assert first.type == WSMsgType.BINARY
    partition, next_offset, answer = batch_frame(first.data)
    records = fetch_answer(answer, partition, 1, 1000).messages
    assert [m.value for m in records] == [b"b0-0", b"b0-1", b"b0-2"] and next_offset == 4
    second = await frames(socket)  # the next batch does not fit the 2 credits left: decoded
    assert [m["value"] for m in second["messages"]] == ["b1-0", "b1-1"]
    assert second["positions"] == [{"topic": "raw", "partition": 0, "offset": 6}]
    with pytest.raises(asyncio.TimeoutError):
        await socket.receive(timeout=1.0)
    await socket.close()


async def test_a_group_stream_announcing_a_rebalance_waits_until_the_member_saw_it(
    api: TestClient,
) -> None:
    await ok(api, "POST", "/v1/topics", {"name": "orders", "partitions": 2})
    body = {"topics": ["orders"], "auto_offset_reset": "earliest", "member_id": "a"}
    a = await ok(api, "POST", "/v1/groups/g/members", body)
    socket = await api.ws_connect("/v1/groups/g/members/a/stream")
    first = await frames(socket)  # the generation, positions: frame 1
    assert first["frame"] == 1 and first["rebalancing"] is False
    joining = asyncio.ensure_future(
        ok(api, "POST", "/v1/groups/g/members", {**body, "member_id": "b"})
    )
    told = await frames(socket)
    assert told["rebalancing"] is True and told["generation"] == a["generation"]
    await socket.send_str(json.dumps({"credit": 0, "seen": told["frame"] - 1}))
    with pytest.raises(asyncio.TimeoutError):  # not seen yet: the stream reads nothing on
        await socket.receive(timeout=2.0)
    await socket.send_str(json.dumps({"credit": 0, "seen": told["frame"]}))
    moved = await frames(socket)
    assert moved["generation"] == a["generation"] + 1 and moved["frame"] == told["frame"] + 1
    assert len(moved["assignment"]) == 1
    await joining
    await socket.close()


async def test_metrics_count_open_streams_and_messages_pushed(api: TestClient) -> None:
    await regions(api)
    socket = await api.ws_connect("/v1/topics/orders/stream", params={"credit": "4"})
    got = 0
    while got < 4:
        got += len((await frames(socket))["messages"])
    text = await (await api.get("/metrics")).text()
    assert 'raftline_streams_open{kind="topic"} 1' in text
    assert 'raftline_stream_messages_total{kind="topic"} 4' in text
    await socket.close()


async def test_streams_are_closed_as_going_away_when_the_node_stops(api: TestClient) -> None:
    await regions(api, "live", 1)
    socket = await api.ws_connect("/v1/topics/live/stream", params={"offset": "latest"})
    await asyncio.sleep(0.2)
    await api.app.shutdown()  # what stopping the node's HTTP server signals first
    closed = await socket.receive(timeout=5)
    assert closed.type == WSMsgType.CLOSE and closed.data == 1001
