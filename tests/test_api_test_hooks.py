"""The test-only admin hooks over HTTP: absent unless the node enables them; clock and network."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import serving

from raftline.node.broker import Broker

pytestmark = pytest.mark.timeout(60)

HOUR_MS = 3_600_000


def real_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
async def hooked(tmp_path: Path) -> AsyncIterator[tuple[TestClient, Broker]]:
    async with serving(tmp_path / "data", test_hooks=True) as served:
        yield served


async def _produce_one_and_read_timestamp(api: TestClient, value: str) -> int:
    response = await api.post("/v1/topics/t/messages", json={"messages": [{"value": value}]})
    assert response.status == 200, await response.text()
    offset = (await response.json())["offsets"][0]["offset"]
    response = await api.get(f"/v1/topics/t/partitions/0/messages?offset={offset}")
    assert response.status == 200, await response.text()
    message = (await response.json())["messages"][0]
    assert message["value"] == value
    return int(message["timestamp"])


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/admin/clock", {"offset_ms": 5}), ("/v1/admin/network", {})]
)
async def test_hooks_answer_404_when_the_node_runs_without_test_hooks(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    async with serving(tmp_path / "data", test_hooks=False) as (api, broker):
        response = await api.post(path, json=body)
        assert response.status == 404
        assert broker.clock.offset_ms == 0 and broker.runtime.transport.link_faults is None


async def test_clock_hook_shifts_default_message_timestamps_and_zero_restores_them(
    hooked: tuple[TestClient, Broker],
) -> None:
    api, _ = hooked
    assert (await api.post("/v1/topics", json={"name": "t"})).status == 201
    response = await api.post("/v1/admin/clock", json={"offset_ms": HOUR_MS})
    assert response.status == 200
    before = real_ms()
    skewed = await _produce_one_and_read_timestamp(api, "skewed")
    assert before + HOUR_MS <= skewed <= real_ms() + HOUR_MS
    assert (await api.post("/v1/admin/clock", json={"offset_ms": 0})).status == 200
    before = real_ms()
    restored = await _produce_one_and_read_timestamp(api, "restored")
    assert before <= restored <= real_ms()


async def test_clock_hook_rejects_a_bad_offset_with_400(hooked: tuple[TestClient, Broker]) -> None:
    api, broker = hooked
    response = await api.post("/v1/admin/clock", json={"offset_ms": "soon"})
    assert response.status == 400
    assert broker.clock.offset_ms == 0


async def test_network_hook_sets_link_faults_and_an_empty_body_clears_them(
    hooked: tuple[TestClient, Broker],
) -> None:
    api, broker = hooked
    faults = {"delay_ms": 30, "jitter_ms": 10, "reorder": 0.1, "duplicate": 0.2, "peers": [2]}
    response = await api.post("/v1/admin/network", json=faults)
    assert response.status == 200
    assert await response.json() == faults
    assert broker.runtime.transport.link_faults is not None
    assert (await api.post("/v1/admin/network", json={})).status == 200
    assert broker.runtime.transport.link_faults is None


async def test_network_hook_rejects_a_bad_body_with_400(hooked: tuple[TestClient, Broker]) -> None:
    api, broker = hooked
    response = await api.post("/v1/admin/network", json={"delay_ms": 10, "jitter_ms": 50})
    assert response.status == 400
    assert broker.runtime.transport.link_faults is None
