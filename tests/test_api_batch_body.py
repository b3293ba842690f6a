"""The binary produce and fetch bodies (application/vnd.raftline.batch) on a real in-process node.

Producers send one Kafka record batch they built; consumers may ask for whole stored batches.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import serving

from raftline.api import app as app_module
from raftline.api.codec import BATCH_CONTENT_TYPE
from raftline.raftlog import batch as batch_format
from raftline.raftlog.records import (
    Codec,
    Record,
    build_batch,
    build_control_batch,
    iter_batches,
)

pytestmark = pytest.mark.timeout(60)
BATCH_HEADERS = {"Content-Type": BATCH_CONTENT_TYPE}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[TestClient]:
    async with serving(tmp_path / "data") as (client, _):
        response = await client.post("/v1/topics", json={"name": "t", "partitions": 2})
        assert response.status == 201, await response.text()
        yield client


def _records(*values: bytes) -> list[Record]:
    return [Record(value=v, key=b"k" + v) for v in values]


async def _post(api: TestClient, body: bytes, query: str = "partition=1", topic: str = "t") -> Any:
    return await api.post(f"/v1/topics/{topic}/messages?{query}", data=body, headers=BATCH_HEADERS)


async def _create_one_partition_topic(api: TestClient, name: str, config: dict[str, str]) -> None:
    response = await api.post("/v1/topics", json={"name": name, "partitions": 1, "config": config})
    assert response.status == 201, await response.text()


async def _get_batches(api: TestClient, query: str, where: str = "t/partitions/1") -> Any:
    """A fetch that asks for whole stored batches."""
    return await api.get(
        f"/v1/topics/{where}/messages?{query}", headers={"Accept": BATCH_CONTENT_TYPE}
    )


async def _error(response: Any, status: int, code: str) -> None:
    body = await response.json()
    assert response.status == status, body
    assert body["error"]["code"] == code


async def test_a_batch_body_is_stored_and_answered_with_its_base_offset_and_count(
    api: TestClient,
) -> None:
    response = await _post(api, build_batch(_records(b"a", b"b", b"c")))
    assert response.status == 200
    answer = await response.json()
    assert (answer["partition"], answer["count"]) == (1, 3)
    fetched = await (await api.get("/v1/topics/t/partitions/1/messages?offset=0")).json()
    offsets = [m["offset"] for m in fetched["messages"]]
    assert offsets == [answer["base_offset"] + i for i in range(3)]
    assert [(m["key"], m["value"]) for m in fetched["messages"]] == [
        ("ka", "a"),
        ("kb", "b"),
        ("kc", "c"),
    ]


async def test_a_batch_body_with_acks_none_gets_202(api: TestClient) -> None:
    response = await _post(api, build_batch(_records(b"a")), "partition=0&acks=none")
    assert response.status == 202


async def test_a_batch_body_needs_a_partition(api: TestClient) -> None:
    await _error(await _post(api, build_batch(_records(b"a")), ""), 400, "invalid_request")


async def test_a_batch_body_for_a_missing_partition_is_unknown_partition(api: TestClient) -> None:
    await _error(
        await _post(api, build_batch(_records(b"a")), "partition=2"), 404, "unknown_partition"
    )


async def test_bytes_that_are_not_a_batch_get_invalid_request(api: TestClient) -> None:
    await _error(await _post(api, b"not a batch at all" * 5), 400, "invalid_request")


async def test_a_batch_whose_records_are_broken_under_a_valid_crc_is_rejected(
    api: TestClient,
) -> None:
    body = bytearray(build_batch(_records(b"value")))
    body[batch_format.HEADER_SIZE] = 0x7F  # the first record's length: now past the end
    body[batch_format.CRC_OFFSET : batch_format.CRC_OFFSET + 4] = batch_format.compute_crc(
        body
    ).to_bytes(4, "big")
    await _error(await _post(api, bytes(body)), 400, "invalid_request")


async def test_producers_cannot_write_control_batches(api: TestClient) -> None:
    await _error(await _post(api, build_control_batch(100, b"{}")), 400, "invalid_request")


async def test_a_record_over_max_message_bytes_is_too_large(api: TestClient) -> None:
    await _create_one_partition_topic(api, "small", {"max.message.bytes": "100"})
    response = await _post(api, build_batch(_records(b"x" * 200)), "partition=0", topic="small")
    await _error(response, 413, "message_too_large")


async def test_fetch_with_the_batch_type_answers_whole_batches_and_positions_in_headers(
    api: TestClient,
) -> None:
    first = await (await _post(api, build_batch(_records(b"a", b"b")))).json()
    await _post(api, build_batch(_records(b"c")))
    response = await _get_batches(api, f"offset={first['base_offset'] + 1}")
    assert response.status == 200
    assert response.content_type == BATCH_CONTENT_TYPE
    decoded = list(iter_batches(await response.read()))
    values = [r.value for d in decoded for r in d.records]
    assert values == [b"a", b"b", b"c"]  # the first batch whole: the client skips offset 0
    assert int(response.headers["Raftline-Next-Offset"]) == first["base_offset"] + 3
    assert int(response.headers["Raftline-High-Watermark"]) == first["base_offset"] + 3
    assert "Raftline-Log-Start-Offset" in response.headers


async def test_batch_fetch_stops_at_the_batch_that_reaches_max_messages(api: TestClient) -> None:
    first = await (await _post(api, build_batch(_records(b"a", b"b")))).json()
    await _post(api, build_batch(_records(b"c")))
    response = await _get_batches(api, f"offset={first['base_offset']}&max_messages=1")
    decoded = list(iter_batches(await response.read()))
    assert [r.value for d in decoded for r in d.records] == [b"a", b"b"]
    assert int(response.headers["Raftline-Next-Offset"]) == first["base_offset"] + 2


async def test_a_batch_body_sent_in_many_chunks_is_stored_as_sent(api: TestClient) -> None:
    sent = build_batch(_records(os.urandom(300_000), os.urandom(300_000)))

    async def in_chunks() -> AsyncIterator[bytes]:  # chunked transfer encoding, no length
        for at in range(0, len(sent), 65_536):
            yield sent[at : at + 65_536]

    answer = await (await _post(api, in_chunks())).json()  # type: ignore[arg-type]
    response = await _get_batches(api, f"offset={answer['base_offset']}")
    stored = await response.read()
    # Only the base offset and the Raft term (bytes 0-7 and 12-15) are stamped on append.
    assert (len(stored), stored[8:12], stored[16:]) == (len(sent), sent[8:12], sent[16:])


async def test_a_body_growing_past_the_limit_while_it_streams_is_too_large(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "MAX_BODY_BYTES", 100_000)

    async def in_chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 65_536

    await _error(await _post(api, in_chunks()), 413, "message_too_large")  # type: ignore[arg-type]


async def test_a_batch_fetched_alone_is_answered_whole(api: TestClient) -> None:
    values = [os.urandom(1_000_000)]
    answer = await (await _post(api, build_batch(values))).json()
    response = await _get_batches(api, f"offset={answer['base_offset']}&max_bytes=1048576")
    assert [r.value for d in iter_batches(await response.read()) for r in d.records] == values


async def test_a_topic_that_forces_a_compression_stores_the_batch_recompressed(
    api: TestClient,
) -> None:
    await _create_one_partition_topic(api, "zipped", {"compression.type": "gzip"})
    response = await _post(api, build_batch(_records(b"a", b"b")), "partition=0", topic="zipped")
    assert response.status == 200
    answer = await _get_batches(api, "offset=earliest", where="zipped/partitions/0")
    [stored] = list(iter_batches(await answer.read()))
    assert stored.header.codec == Codec.GZIP
    assert [(r.key, r.value) for r in stored.records] == [(b"ka", b"a"), (b"kb", b"b")]
