"""A compacted topic through one in-process node: old versions go, offsets and the latest stay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import serving

pytestmark = pytest.mark.timeout(60)

COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": 1024,
    "min.cleanable.dirty.ratio": 0.01,
}


async def _fetch_all(api: TestClient, topic: str, offset: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        response = await api.get(
            f"/v1/topics/{topic}/partitions/0/messages?offset={offset}&max_messages=1000"
        )
        assert response.status == 200, await response.text()
        body = await response.json()
        if not body["messages"]:
            return out
        out += body["messages"]
        offset = body["messages"][-1]["offset"] + 1


async def test_compacted_topic_keeps_the_latest_value_per_key_at_its_offset(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "data") as (api, broker):
        response = await api.post("/v1/topics", json={"name": "kv", "config": COMPACT})
        assert response.status == 201, await response.text()
        written: list[tuple[int, str, str]] = []
        for i in range(60):
            message = {"key": f"k{i % 4}", "value": f"v{i}"}
            response = await api.post("/v1/topics/kv/messages", json={"messages": [message]})
            assert response.status == 200, await response.text()
            offset = (await response.json())["offsets"][0]["offset"]
            written.append((offset, message["key"], message["value"]))
        before = await _fetch_all(api, "kv")
        assert len(before) == 60

        await broker.upkeep.clean_once()

        after = [(m["offset"], m["key"], m["value"]) for m in await _fetch_all(api, "kv")]
        # below the active segment: the latest per key among those offsets; from it on: all
        (cleaner,) = broker.upkeep.cleaners.values()
        end = cleaner.log.segment_bases[-1]
        assert end > 0
        latest_below = {key: (o, key, value) for o, key, value in written if o < end}
        expected = sorted(latest_below.values()) + [r for r in written if r[0] >= end]
        assert after == expected
        assert len(after) < len(before)
        # a fetch from a removed offset starts at the next kept one
        removed = next(o for o, k, v in written if (o, k, v) not in after)
        rest = await _fetch_all(api, "kv", removed)
        assert rest[0]["offset"] == min(o for o, _, _ in after if o > removed)
        metrics = await (await api.get("/metrics")).text()
        removed_line = next(
            line
            for line in metrics.splitlines()
            if "raftline_cleaner_records_removed_total{" in line
        )
        assert int(removed_line.split()[-1]) == 60 - len(after)
        # keyless records are refused on a compacted topic
        response = await api.post("/v1/topics/kv/messages", json={"messages": [{"value": "x"}]})
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_request"


@pytest.mark.parametrize(
    "config",
    [
        {"delete.retention.ms": -1},
        {"delete.retention.ms": "soon"},
        {"min.compaction.lag.ms": -5},
        {"min.cleanable.dirty.ratio": 1.5},
        {"min.cleanable.dirty.ratio": "half"},
    ],
)
async def test_bad_compaction_settings_are_refused(tmp_path: Path, config: dict) -> None:
    async with serving(tmp_path / "data") as (api, _):
        response = await api.post("/v1/topics", json={"name": "kv", "config": config})
        assert response.status == 400, await response.text()
        good = {
            "delete.retention.ms": 0,
            "min.compaction.lag.ms": 10,
            "min.cleanable.dirty.ratio": 0,
        }
        response = await api.post("/v1/topics", json={"name": "ok", "config": good})
        assert response.status == 201, await response.text()


async def test_compact_alone_turns_retention_off_and_compact_delete_keeps_it(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "data") as (api, broker):
        topics = {
            "only": {"cleanup.policy": "compact", "retention.ms": 1000},
            "both": {"cleanup.policy": "compact,delete", "retention.ms": 1000},
            "plain": {"retention.ms": 1000},
        }
        for name, config in topics.items():
            response = await api.post("/v1/topics", json={"name": name, "config": config})
            assert response.status == 201, await response.text()
        for name in topics:
            response = await api.post(
                f"/v1/topics/{name}/messages", json={"messages": [{"key": "k", "value": "v"}]}
            )
            assert response.status == 200, await response.text()
        logs = {
            replica.topic: replica_group.storage.log
            for group, replica in broker.partitions.items()
            if (replica_group := broker.runtime.groups.get(group)) is not None
        }
        assert logs["only"].config.retention_ms == -1
        assert logs["both"].config.retention_ms == 1000
        assert logs["plain"].config.retention_ms == 1000
        cleaned = {
            replica.topic
            for group, replica in broker.partitions.items()
            if group in broker.upkeep.cleaners
        }
        assert cleaned == {"only", "both"}
