"""Idempotent producers on a real in-process node: producer ids, dedup, 409s, restarts.

A retried request (same producer id, epoch and sequence) answers the original's offsets with
"duplicate": true and writes nothing, whether the original has committed, is still in flight,
or was written before a restart (snapshot, or the log replayed without one).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import serving

from raftline.api.codec import BATCH_CONTENT_TYPE
from raftline.node.producers import SNAPSHOT_FILE
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(60)


async def _json(response: Any) -> Any:
    return await response.json()


async def _topic(api: TestClient, name: str = "t", partitions: int = 2) -> None:
    response = await api.post("/v1/topics", json={"name": name, "partitions": partitions})
    assert response.status == 201, await response.text()


async def _producer(api: TestClient) -> tuple[int, int]:
    response = await api.post("/v1/producers", json={})
    assert response.status == 200, await response.text()
    body = await response.json()
    return body["producer_id"], body["producer_epoch"]


def _body(pid: int, epoch: int, seq: int, *values: str, partition: int = 0) -> dict[str, Any]:
    return {
        "producer_id": pid,
        "producer_epoch": epoch,
        "sequence": seq,
        "messages": [{"value": v, "partition": partition} for v in values],
    }


async def _produce(api: TestClient, body: dict[str, Any], topic: str = "t") -> tuple[int, Any]:
    response = await api.post(f"/v1/topics/{topic}/messages", json=body)
    return response.status, await response.json()


async def _values(api: TestClient, topic: str = "t", partition: int = 0) -> list[str]:
    response = await api.get(f"/v1/topics/{topic}/partitions/{partition}/messages?offset=0")
    assert response.status == 200, await response.text()
    return [m["value"] for m in (await response.json())["messages"]]


async def test_producer_ids_are_distinct_and_never_handed_out_again(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        ids = [await _producer(api) for _ in range(5)]
        assert len({pid for pid, _ in ids}) == 5 and all(e == 0 for _, e in ids)
        empty = await api.post("/v1/producers")
        assert empty.status == 200, await empty.text()
        bad = await api.post("/v1/producers", json={"transaction_timeout_ms": 0})
        assert bad.status == 400
        await _topic(api)
        pid, epoch = ids[0]
        # a transactional request names its transactional_id
        status, body = await _produce(api, {**_body(pid, epoch, 0, "a"), "transactional": True})
        assert status == 400, body
    async with serving(tmp_path / "d") as (api, _):
        later, _ = await _producer(api)
        assert later > max(pid for pid, _ in ids), "an id was handed out again after a restart"


async def test_retry_gets_the_original_offsets_and_writes_once(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api)
        pid, epoch = await _producer(api)
        assert (await _produce(api, {"messages": [{"value": "plain", "partition": 0}]}))[0] == 200
        status, first = await _produce(api, _body(pid, epoch, 0, "a", "b"))
        assert status == 200 and "duplicate" not in first
        status, again = await _produce(api, _body(pid, epoch, 0, "a", "b"))
        assert status == 200
        assert again == {**first, "duplicate": True}
        status, next_one = await _produce(api, _body(pid, epoch, 2, "c"))
        assert status == 200
        assert next_one["offsets"][0]["offset"] == first["offsets"][1]["offset"] + 1
        # an older batch still in the window of 5 is a duplicate too
        assert (await _produce(api, _body(pid, epoch, 0, "a", "b")))[1]["duplicate"] is True
        assert await _values(api) == ["plain", "a", "b", "c"]


async def test_gap_and_stale_epoch_get_409(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api)
        pid, _ = await _producer(api)
        assert (await _produce(api, _body(pid, 1, 0, "a")))[0] == 200
        status, body = await _produce(api, _body(pid, 1, 5, "gap"))
        assert status == 409 and body["error"]["code"] == "out_of_order_sequence", body
        status, body = await _produce(api, _body(pid, 0, 1, "old"))
        assert status == 409 and body["error"]["code"] == "producer_fenced", body
        # a new epoch starts at 0, anything else is out of order
        status, body = await _produce(api, _body(pid, 2, 3, "x"))
        assert status == 409 and body["error"]["code"] == "out_of_order_sequence", body
        assert (await _produce(api, _body(pid, 2, 0, "b")))[0] == 200
        status, body = await _produce(api, _body(pid, 1, 1, "fenced now"))
        assert body["error"]["code"] == "producer_fenced"
        # every message of an idempotent request goes to one partition
        spread = _body(pid, 2, 1, "p0")
        spread["messages"].append({"value": "p1", "partition": 1})
        status, body = await _produce(api, spread)
        assert status == 400, body
        status, body = await _produce(api, {**_body(pid, 2, 1, "x"), "sequence": -1})
        assert status == 400, body
        status, body = await _produce(api, {"producer_id": pid, "messages": [{"value": "x"}]})
        assert status == 400, body
        assert await _values(api) == ["a", "b"]


async def test_a_retry_of_a_batch_in_flight_waits_for_it(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, broker):
        await _topic(api)
        pid, epoch = await _producer(api)
        batch = build_batch(
            [Record(value=b"once")], producer_id=pid, producer_epoch=epoch, base_sequence=0
        )
        # The first proposes at once; the second finds it in flight before it commits.
        first = asyncio.ensure_future(broker.append("t", 0, batch, "all"))
        second = asyncio.ensure_future(broker.append("t", 0, batch, "all"))
        results = await asyncio.gather(first, second)
        assert results[0] == (results[0][0], False)
        assert results[1] == (results[0][0], True)
        many = await asyncio.gather(*(broker.append("t", 0, batch, "all") for _ in range(5)))
        assert all(r == (results[0][0], True) for r in many)
        assert await _values(api) == ["once"]


async def test_binary_batch_body_is_deduplicated(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api)
        pid, epoch = await _producer(api)

        async def post(seq: int, *values: bytes, epoch: int = epoch) -> tuple[int, Any]:
            batch = build_batch(
                [Record(value=v) for v in values],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
            )
            response = await api.post(
                "/v1/topics/t/messages?partition=1",
                data=batch,
                headers={"Content-Type": BATCH_CONTENT_TYPE},
            )
            return response.status, await response.json()

        status, first = await post(0, b"x", b"y")
        assert status == 200 and "duplicate" not in first
        status, again = await post(0, b"x", b"y")
        assert status == 200 and again == {**first, "duplicate": True}
        status, gap = await post(7, b"z")
        assert status == 409 and gap["error"]["code"] == "out_of_order_sequence"
        assert (await post(2, b"z"))[1]["base_offset"] == first["base_offset"] + 2
        assert (await post(0, b"z", epoch=epoch - 1 if epoch else 0))[0] in (200, 409)
        assert await _values(api, partition=1) == ["x", "y", "z"]


@pytest.mark.parametrize("snapshot", ["clean stop", "no snapshot", "periodic"])
async def test_a_restart_keeps_dedup(tmp_path: Path, snapshot: str) -> None:
    data = tmp_path / "d"
    async with serving(data) as (api, broker):
        if snapshot == "periodic":
            broker.config.producer_snapshot_every = 3
        await _topic(api, partitions=1)
        pid, epoch = await _producer(api)
        offsets = []
        for seq in range(8):
            status, body = await _produce(api, _body(pid, epoch, seq, f"m{seq}"))
            assert status == 200, body
            offsets.append(body["offsets"])
    snapshots = list(data.glob(f"partitions/*/{SNAPSHOT_FILE}"))
    assert snapshots
    if snapshot == "no snapshot":
        for path in snapshots:
            path.unlink()
    async with serving(data) as (api, broker):
        for seq in range(3, 8):  # the last 5 batches are remembered
            for _ in range(100):
                status, body = await _produce(api, _body(pid, epoch, seq, f"m{seq}"))
                if status != 503:
                    break
                await asyncio.sleep(0.05)
            assert status == 200, body
            assert body == {"offsets": offsets[seq], "duplicate": True}
        status, body = await _produce(api, _body(pid, epoch, 9, "gap"))
        assert status == 409 and body["error"]["code"] == "out_of_order_sequence"
        assert (await _produce(api, _body(pid, epoch, 8, "m8")))[0] == 200
        assert await _values(api) == [f"m{i}" for i in range(9)]


async def test_idle_producers_expire_into_unknown(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, broker):
        broker.config.producer_expiry_ms = 60_000
        await _topic(api, partitions=1)
        pid, epoch = await _producer(api)
        other, _ = await _producer(api)
        assert (await _produce(api, _body(pid, epoch, 0, "old")))[0] == 200
        # a producer's own timestamps never move the expiry clock: an hour ahead expires nobody
        ahead = _body(other, 0, 0, "ahead")
        ahead["messages"][0]["timestamp"] = broker.clock.now_ms() + 3_600_000
        assert (await _produce(api, ahead))[0] == 200
        status, body = await _produce(api, _body(pid, epoch, 0, "old"))
        assert status == 200 and body.get("duplicate") is True, body
        # the partition leader's clock entries do: an hour later both (idle) are forgotten
        broker.upkeep.keep_producer_clocks()  # the log's first clock, now
        broker.clock.set_offset_ms(3_600_000)
        broker.upkeep.keep_producer_clocks()
        await _wait_expired(broker)
        # so its retry is no longer recognised, and it may go on at any sequence (Kafka's
        # unknown producer): the window of an expired producer is gone
        status, body = await _produce(api, _body(pid, epoch, 4, "after"))
        assert status == 200 and "duplicate" not in body, body
        assert (await _produce(api, _body(pid, epoch, 5, "next")))[0] == 200
        metrics = await (await api.get("/metrics")).text()
        assert 'raftline_producers_expired_total{node="1"} 2' in metrics
        assert 'raftline_idempotent_producers{node="1"} 1' in metrics


async def _wait_expired(broker: Any) -> None:
    for _ in range(100):
        if any(r.producers.expired for r in broker.partitions.values()):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no producer expired")


async def _retry_writes_once(data: Path, restart: bool) -> bool:
    """What the tests above check, as a predicate: a retried batch is stored once (the retry
    sent after a restart when `restart`)."""
    async with serving(data) as (api, broker):
        await _topic(api, "planted", partitions=1)
        pid, epoch = await _producer(api)
        batch = build_batch(
            [Record(value=b"p")], producer_id=pid, producer_epoch=epoch, base_sequence=0
        )
        await broker.append("planted", 0, batch, "all")
        if not restart:
            await broker.append("planted", 0, batch, "all")
            return await _values(api, "planted") == ["p"]
    async with serving(data) as (api, broker):
        for _ in range(100):
            try:
                await broker.append("planted", 0, batch, "all")
                break
            except Exception:  # the restarted node is electing itself
                await asyncio.sleep(0.05)
        return await _values(api, "planted") == ["p"]


@pytest.mark.parametrize("bug", [None, "no leader check", "no replay on restart"])
async def test_planted_bugs_in_the_wiring_are_caught(
    tmp_path: Path, bug: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dedup checks are not vacuous: a leader that proposes without checking, or a replica
    that restarts without its snapshot and without replaying the log, writes a retry twice."""
    from raftline.node.eos.producer_state import NEW, ProducerStateMachine
    from raftline.node.producers import PartitionProducers

    if bug == "no leader check":
        monkeypatch.setattr(
            PartitionProducers, "check", lambda self, header: (NEW, (header.producer_id, 0, 0))
        )
    restart = bug != "no leader check"
    if bug == "no replay on restart":

        def forgetful_load(self: PartitionProducers, first_index: int, commit: int) -> int:
            self.state = ProducerStateMachine(commit + 1)
            return commit + 1

        monkeypatch.setattr(PartitionProducers, "load", forgetful_load)
    once = await _retry_writes_once(tmp_path / "d", restart)
    assert once is (bug is None)
