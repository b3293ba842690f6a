"""Header values that are not UTF-8 in the JSON and msgpack contract: headers_b64 in, out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import serving

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[TestClient]:
    async with serving(tmp_path / "data") as (client, _):
        assert (await client.post("/v1/topics", json={"name": "t"})).status == 201
        yield client


async def _produce(api: TestClient, message: dict[str, Any]) -> Any:
    return await api.post("/v1/topics/t/messages", json={"messages": [message]})


async def test_headers_b64_in_and_out_beside_text_headers(api: TestClient) -> None:
    response = await _produce(
        api, {"value": "v", "headers": {"t": "é"}, "headers_b64": {"b": "/wA=", "e": ""}}
    )
    assert response.status == 200, await response.text()
    [message] = (await (await api.get("/v1/topics/t/partitions/0/messages")).json())["messages"]
    assert message["headers"] == {"t": "é", "e": ""}  # empty bytes are UTF-8 text
    assert message["headers_b64"] == {"b": "/wA="}


async def test_text_only_headers_have_no_headers_b64(api: TestClient) -> None:
    await _produce(api, {"value": "v", "headers": {"t": "x"}})
    [message] = (await (await api.get("/v1/topics/t/partitions/0/messages")).json())["messages"]
    assert "headers_b64" not in message


async def test_msgpack_answers_carry_binary_header_values_as_bytes(api: TestClient) -> None:
    await _produce(api, {"value": "v", "headers": {"t": "x"}, "headers_b64": {"b": "/wA="}})
    response = await api.get(
        "/v1/topics/t/partitions/0/messages", headers={"Accept": "application/msgpack"}
    )
    [message] = msgpack.unpackb(await response.read())["messages"]
    assert message["headers"] == {"t": "x", "b": b"\xff\x00"}
    assert "headers_b64" not in message


@pytest.mark.parametrize(
    "headers",
    [
        {"headers_b64": {"b": "%%%"}},
        {"headers_b64": {"b": 1}},
        {"headers_b64": ["b"]},
        {"headers": {"b": "x"}, "headers_b64": {"b": "eA=="}},
    ],
)
async def test_bad_headers_b64_get_invalid_request(api: TestClient, headers: dict) -> None:
    response = await _produce(api, {"value": "v", **headers})
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_request"


async def test_the_openapi_document_names_headers_b64(api: TestClient) -> None:
    schemas = (await (await api.get("/openapi.json")).json())["components"]["schemas"]
    assert "headers_b64" in schemas["ProduceMessage"]["properties"]
    assert "headers_b64" in schemas["FetchedMessage"]["properties"]
