"""The v1 HTTP contract served by a real single-node broker in-process: round trips and errors."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient

from raftline.api.partitioner import partition_for_key

pytestmark = pytest.mark.timeout(60)


async def _create(api: TestClient, name: str = "orders", **fields: Any) -> dict[str, Any]:
    response = await api.post("/v1/topics", json={"name": name, **fields})
    assert response.status == 201, await response.text()
    return await response.json()


async def _produce(api: TestClient, topic: str, *messages: dict[str, Any]) -> list[dict]:
    response = await api.post(f"/v1/topics/{topic}/messages", json={"messages": list(messages)})
    assert response.status == 200, await response.text()
    return (await response.json())["offsets"]


async def _fetch(api: TestClient, topic: str, partition: int, query: str = "") -> dict[str, Any]:
    response = await api.get(f"/v1/topics/{topic}/partitions/{partition}/messages?{query}")
    assert response.status == 200, await response.text()
    return await response.json()


async def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    body = await response.json()
    assert response.status == status, body
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["retryable"], bool)
    return body


# ---- topics ---------------------------------------------------------------------------------


async def test_created_topic_is_described_with_its_partitions_and_config(api: TestClient) -> None:
    await _create(api, partitions=3, replication_factor=1, config={"retention.ms": 60000})
    described = await (await api.get("/v1/topics/orders")).json()
    assert described["name"] == "orders"
    assert described["config"]["retention.ms"] == "60000"
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert all(p["replicas"] == [1] for p in described["partitions"])


async def test_listed_topics_show_partitions_and_replication(api: TestClient) -> None:
    await _create(api, partitions=2)
    listed = await (await api.get("/v1/topics")).json()
    assert listed == {"topics": [{"name": "orders", "partitions": 2, "replication_factor": 1}]}


async def test_deleted_topic_is_gone(api: TestClient) -> None:
    await _create(api)
    assert (await api.delete("/v1/topics/orders")).status == 204
    await _error(await api.get("/v1/topics/orders"), 404, "unknown_topic")


# ---- produce and fetch ----------------------------------------------------------------------


async def test_produced_messages_come_back_in_order_with_consecutive_offsets(
    api: TestClient,
) -> None:
    await _create(api)
    offsets = await _produce(api, "orders", {"value": "a"}, {"value": "b"}, {"value": "c"})
    assert [o["offset"] for o in offsets] == list(
        range(offsets[0]["offset"], offsets[0]["offset"] + 3)
    )
    fetched = await _fetch(api, "orders", 0, "offset=earliest")
    assert [m["value"] for m in fetched["messages"]] == ["a", "b", "c"]
    assert [m["offset"] for m in fetched["messages"]] == [o["offset"] for o in offsets]
    assert fetched["next_offset"] == fetched["high_watermark"] == offsets[-1]["offset"] + 1


async def test_key_headers_timestamp_and_binary_values_round_trip(api: TestClient) -> None:
    await _create(api)
    raw = bytes([0, 255, 7])
    await _produce(
        api,
        "orders",
        {"key": "k", "value": "v", "headers": {"h": "x"}, "timestamp": 1_700_000_000_000},
        {"value_b64": base64.b64encode(raw).decode()},
    )
    first, second = (await _fetch(api, "orders", 0))["messages"]
    assert (first["key"], first["value"], first["headers"]) == ("k", "v", {"h": "x"})
    assert first["timestamp"] == 1_700_000_000_000
    assert base64.b64decode(second["value_b64"]) == raw
    assert second["key"] is None


async def test_keys_pick_the_kafka_partition_and_explicit_partition_wins(api: TestClient) -> None:
    await _create(api, partitions=4)
    offsets = await _produce(
        api,
        "orders",
        {"key": "user-1", "value": "a"},
        {"key": "user-1", "value": "b", "partition": 3},
    )
    assert offsets[0]["partition"] == partition_for_key(b"user-1", 4)
    assert offsets[1]["partition"] == 3


async def test_offsets_are_returned_in_request_order_across_partitions(api: TestClient) -> None:
    await _create(api, partitions=3)
    offsets = await _produce(
        api,
        "orders",
        {"value": "p2", "partition": 2},
        {"value": "p0", "partition": 0},
        {"value": "p2b", "partition": 2},
    )
    assert [o["partition"] for o in offsets] == [2, 0, 2]
    assert offsets[2]["offset"] == offsets[0]["offset"] + 1


async def test_keyless_messages_of_one_request_share_one_partition(api: TestClient) -> None:
    await _create(api, partitions=5)
    offsets = await _produce(api, "orders", *({"value": str(i)} for i in range(10)))
    assert len({o["partition"] for o in offsets}) == 1


async def test_fetch_from_a_middle_offset_skips_earlier_records_of_the_batch(
    api: TestClient,
) -> None:
    await _create(api)
    offsets = await _produce(api, "orders", *({"value": str(i)} for i in range(5)))
    fetched = await _fetch(api, "orders", 0, f"offset={offsets[2]['offset']}")
    assert [m["value"] for m in fetched["messages"]] == ["2", "3", "4"]


async def test_max_messages_limits_the_answer_and_next_offset_continues(api: TestClient) -> None:
    await _create(api)
    offsets = await _produce(api, "orders", *({"value": str(i)} for i in range(5)))
    fetched = await _fetch(api, "orders", 0, "max_messages=2")
    assert [m["value"] for m in fetched["messages"]] == ["0", "1"]
    assert fetched["next_offset"] == offsets[2]["offset"]


async def test_latest_starts_after_the_last_message(api: TestClient) -> None:
    await _create(api)
    await _produce(api, "orders", {"value": "old"})
    fetched = await _fetch(api, "orders", 0, "offset=latest")
    assert fetched["messages"] == []
    assert fetched["next_offset"] == fetched["high_watermark"]


async def test_long_poll_returns_a_message_produced_while_waiting(api: TestClient) -> None:
    await _create(api)
    end = (await _fetch(api, "orders", 0, "offset=latest"))["next_offset"]
    poll = asyncio.ensure_future(_fetch(api, "orders", 0, f"offset={end}&wait_ms=5000"))
    await asyncio.sleep(0.2)
    await _produce(api, "orders", {"value": "late"})
    fetched = await asyncio.wait_for(poll, 5)
    assert [m["value"] for m in fetched["messages"]] == ["late"]


async def test_acks_none_answers_202_with_an_empty_body(api: TestClient) -> None:
    await _create(api)
    response = await api.post(
        "/v1/topics/orders/messages", json={"acks": "none", "messages": [{"value": "x"}]}
    )
    assert response.status == 202
    assert await response.json() == {}


async def test_msgpack_bodies_and_answers(api: TestClient) -> None:
    await _create(api)
    response = await api.post(
        "/v1/topics/orders/messages",
        data=msgpack.packb({"messages": [{"value": b"\xff\x01"}]}),
        headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
    )
    assert response.status == 200
    assert response.content_type == "application/msgpack"
    [offset] = msgpack.unpackb(await response.read())["offsets"]
    fetched = await _fetch(api, "orders", 0, f"offset={offset['offset']}")
    assert base64.b64decode(fetched["messages"][0]["value_b64"]) == b"\xff\x01"


async def test_a_message_up_to_a_raised_max_message_bytes_goes_through(api: TestClient) -> None:
    await _create(api, config={"max.message.bytes": 3 * 1024 * 1024})
    await _produce(api, "orders", {"value": "x" * (2 * 1024 * 1024)})
    fetched = await _fetch(api, "orders", 0, "max_bytes=1")
    assert len(fetched["messages"][0]["value"]) == 2 * 1024 * 1024


async def test_a_ten_megabyte_message_goes_through_when_the_topic_allows_it(
    api: TestClient,
) -> None:
    ten_mb = 10 * 1024 * 1024
    await _create(api, config={"max.message.bytes": ten_mb})
    [offset] = await _produce(api, "orders", {"value": "x" * (ten_mb - 100)})
    fetched = await _fetch(api, "orders", 0, f"offset={offset['offset']}&max_bytes=1")
    assert len(fetched["messages"][0]["value"]) == ten_mb - 100


async def test_a_request_whose_batch_exceeds_the_log_limit_is_too_large(api: TestClient) -> None:
    nine_mb = 9 * 1024 * 1024
    await _create(api, config={"max.message.bytes": 10 * 1024 * 1024})
    response = await api.post(
        "/v1/topics/orders/messages",
        json={"messages": [{"value": "x" * nine_mb, "partition": 0} for _ in range(2)]},
    )
    await _error(response, 413, "message_too_large")


# ---- errors: each contract code from a real bad request --------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"messages": [{"value": "a", "value_b64": "YQ=="}]}',
        b'{"messages": [{"value_b64": "%%%"}]}',
        b'{"messages": [{"value": 12}]}',
        b'{"messages": "nope"}',
        b'{"acks": "maybe", "messages": [{"value": "a"}]}',
        b"[1, 2]",
    ],
)
async def test_malformed_produce_bodies_get_invalid_request(api: TestClient, body: bytes) -> None:
    await _create(api)
    response = await api.post(
        "/v1/topics/orders/messages", data=body, headers={"Content-Type": "application/json"}
    )
    await _error(response, 400, "invalid_request")


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["null", "bool", "int", "float", "str"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == "dict":
        keys = ["messages", "value", "value_b64", "key", "partition", "acks", "headers",
                "timestamp", "name", "partitions", "config", "x"]  # fmt: skip
        return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}
    return {
        "null": None,
        "bool": rng.random() < 0.5,
        "int": rng.choice([-1, 0, 1, 2**40, -(2**70)]),
        "float": rng.choice([0.5, -1e300, 1e400]),
        "str": rng.choice(["", "a", "all", "é", "\u0000", "YQ==", "x" * 300]),
    }[kind]


async def test_random_bodies_never_cause_a_server_error(api: TestClient) -> None:
    await _create(api, partitions=2)
    rng = random.Random(7)
    for _ in range(200):
        for path in ("/v1/topics/orders/messages", "/v1/topics"):
            body = json.dumps(_random_json(rng)).encode()
            response = await api.post(path, data=body)
            assert response.status < 500 or response.status == 503, await response.text()
            if response.status >= 400:
                assert set((await response.json())["error"]) == {"code", "message", "retryable"}


async def test_garbage_msgpack_gets_invalid_request(api: TestClient) -> None:
    await _create(api)
    response = await api.post(
        "/v1/topics/orders/messages",
        data=b"\xc1\xc1",
        headers={"Content-Type": "application/msgpack"},
    )
    await _error(response, 400, "invalid_request")


@pytest.mark.parametrize("name", ["bad name", "x" * 250, "", "a/b"])
async def test_bad_topic_names_get_invalid_request(api: TestClient, name: str) -> None:
    await _error(await api.post("/v1/topics", json={"name": name}), 400, "invalid_request")


@pytest.mark.parametrize("query", ["offset=-1", "offset=abc", "max_messages=0", "wait_ms=x"])
async def test_bad_fetch_parameters_get_invalid_request(api: TestClient, query: str) -> None:
    await _create(api)
    response = await api.get(f"/v1/topics/orders/partitions/0/messages?{query}")
    await _error(response, 400, "invalid_request")


async def test_internal_batch_endpoint_rejects_bytes_that_are_not_a_batch(
    api: TestClient,
) -> None:
    await _create(api)
    response = await api.post(
        "/v1/internal/topics/orders/partitions/0/batch?acks=all",
        data=b"\x00" * 100,
        headers={"Content-Type": "application/octet-stream"},
    )
    await _error(response, 400, "invalid_request")


async def test_unknown_topic(api: TestClient) -> None:
    response = await api.post("/v1/topics/ghost/messages", json={"messages": [{"value": "a"}]})
    await _error(response, 404, "unknown_topic")


async def test_deleting_an_unknown_topic_is_unknown_topic(api: TestClient) -> None:
    await _error(await api.delete("/v1/topics/ghost"), 404, "unknown_topic")


async def test_unknown_partition_on_fetch_and_produce(api: TestClient) -> None:
    await _create(api, partitions=2)
    await _error(await api.get("/v1/topics/orders/partitions/2/messages"), 404, "unknown_partition")
    response = await api.post(
        "/v1/topics/orders/messages", json={"messages": [{"value": "a", "partition": 7}]}
    )
    await _error(response, 404, "unknown_partition")


async def test_topic_exists(api: TestClient) -> None:
    await _create(api)
    await _error(await api.post("/v1/topics", json={"name": "orders"}), 409, "topic_exists")


async def test_offset_out_of_range_reports_the_valid_range(api: TestClient) -> None:
    await _create(api)
    await _produce(api, "orders", {"value": "a"})
    response = await api.get("/v1/topics/orders/partitions/0/messages?offset=1000000")
    body = await _error(response, 416, "offset_out_of_range")
    assert body["log_start_offset"] == 0
    assert body["high_watermark"] >= 1


async def test_message_over_the_default_one_megabyte_is_too_large(api: TestClient) -> None:
    await _create(api)
    response = await api.post(
        "/v1/topics/orders/messages", json={"messages": [{"value": "x" * (1024 * 1024 + 1)}]}
    )
    await _error(response, 413, "message_too_large")


async def test_message_over_the_topic_limit_is_too_large(api: TestClient) -> None:
    await _create(api, config={"max.message.bytes": 100})
    response = await api.post(
        "/v1/topics/orders/messages", json={"messages": [{"value": "x" * 101}]}
    )
    await _error(response, 413, "message_too_large")


async def test_replication_beyond_the_cluster_size_is_not_enough_replicas(
    api: TestClient,
) -> None:
    response = await api.post("/v1/topics", json={"name": "orders", "replication_factor": 3})
    body = await _error(response, 503, "not_enough_replicas")
    assert body["error"]["retryable"] is True


async def test_unknown_routes_and_methods_still_get_error_bodies(api: TestClient) -> None:
    await _error(await api.get("/v2/nothing"), 404, "not_found")
    await _error(await api.put("/v1/topics"), 405, "method_not_allowed")


# ---- cluster, health, metrics, OpenAPI --------------------------------------------------------


async def test_cluster_lists_this_node_as_controller(api: TestClient) -> None:
    cluster = await (await api.get("/v1/cluster")).json()
    assert cluster["controller"] == 1
    assert [n["id"] for n in cluster["nodes"]] == [1]
    assert cluster["nodes"][0]["alive"] is True


async def test_health_and_readiness(api: TestClient) -> None:
    assert (await api.get("/healthz")).status == 200
    assert (await api.get("/readyz")).status == 200


async def test_metrics_are_prometheus_text_counting_requests(api: TestClient) -> None:
    await api.get("/v1/topics")
    text = await (await api.get("/metrics")).text()
    assert "# TYPE raftline_http_requests_total counter" in text
    assert 'route="/v1/topics",status="200"' in text
    assert 'raftline_http_request_seconds_total{method="GET",route="/v1/topics"}' in text


async def test_openapi_document_describes_every_route(api: TestClient) -> None:
    document = await (await api.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.")
    served = {
        route.resource.canonical
        for route in api.app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    assert served <= set(document["paths"])


async def test_a_read_committed_fetch_reads_to_the_last_stable_offset(api: TestClient) -> None:
    await _create(api)
    await _produce(api, "orders", {"value": "a"}, {"value": "b"})
    fetched = await _fetch(api, "orders", 0, "offset=earliest&isolation=read_committed")
    assert [m["value"] for m in fetched["messages"]] == ["a", "b"]
    # Without transactional writes every committed message is stable.
    assert fetched["last_stable_offset"] == fetched["high_watermark"]
    assert "last_stable_offset" not in await _fetch(api, "orders", 0, "offset=earliest")


async def test_an_unknown_isolation_level_is_refused(api: TestClient) -> None:
    await _create(api)
    response = await api.get("/v1/topics/orders/partitions/0/messages?isolation=serializable")
    await _error(response, 400, "invalid_request")
