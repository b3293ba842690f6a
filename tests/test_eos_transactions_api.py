"""Transactions on a real in-process node: init, transactional produce, commit and abort
markers, read_committed fetches (partition and group), fencing, timeouts, restarts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import serving

from raftline.api.codec import BATCH_CONTENT_TYPE
from raftline.raftlog.records import Record, build_batch, iter_batches

pytestmark = pytest.mark.timeout(90)


async def _ok(response: Any, status: int = 200) -> Any:
    assert response.status == status, await response.text()
    return await response.json()


async def _init(api: TestClient, tid: str, timeout_ms: int = 60_000) -> tuple[int, int]:
    body = await _ok(
        await api.post(
            "/v1/producers", json={"transactional_id": tid, "transaction_timeout_ms": timeout_ms}
        )
    )
    return body["producer_id"], body["producer_epoch"]


def _txn_body(tid: str, pid: int, epoch: int, seq: int, partition: int, *values: str) -> Any:
    return {
        "transactional": True,
        "transactional_id": tid,
        "producer_id": pid,
        "producer_epoch": epoch,
        "sequence": seq,
        "messages": [{"value": v, "partition": partition} for v in values],
    }


async def _end(api: TestClient, tid: str, pid: int, epoch: int, commit: bool) -> Any:
    action = "commit" if commit else "abort"
    return await api.post(
        f"/v1/transactions/{tid}/{action}", json={"producer_id": pid, "producer_epoch": epoch}
    )


async def _read(api: TestClient, partition: int, isolation: str, topic: str = "t") -> Any:
    response = await api.get(
        f"/v1/topics/{topic}/partitions/{partition}/messages?offset=0&isolation={isolation}"
    )
    return await _ok(response)


def _values(body: Any) -> list[str]:
    return [m["value"] for m in body["messages"]]


async def _topic(api: TestClient, partitions: int = 2) -> None:
    await _ok(await api.post("/v1/topics", json={"name": "t", "partitions": partitions}), 201)


async def test_commit_is_visible_to_read_committed_and_abort_never(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api)
        pid, epoch = await _init(api, "tx-1")
        await _ok(await api.post("/v1/topics/t/messages", json={"messages": [{"value": "plain"}]}))
        for partition in (0, 1):
            body = _txn_body("tx-1", pid, epoch, 0, partition, f"c{partition}a", f"c{partition}b")
            await _ok(await api.post("/v1/topics/t/messages", json=body))
        # open: read_uncommitted sees it, read_committed stops at the LSO
        for partition in (0, 1):
            assert f"c{partition}a" in _values(await _read(api, partition, "read_uncommitted"))
            stable = await _read(api, partition, "read_committed")
            assert not [v for v in _values(stable) if v.startswith("c")]
            assert stable["last_stable_offset"] < stable["high_watermark"]
        answer = await _ok(await _end(api, "tx-1", pid, epoch, commit=True))
        assert answer["producer_id"] == pid and answer["producer_epoch"] == epoch + 1
        for partition in (0, 1):
            stable = await _read(api, partition, "read_committed")
            assert [v for v in _values(stable) if v.startswith("c")] == [
                f"c{partition}a",
                f"c{partition}b",
            ]
            assert stable["last_stable_offset"] == stable["high_watermark"]
        # the next transaction, at the bumped epoch from sequence 0, is aborted
        epoch = answer["producer_epoch"]
        for partition in (0, 1):
            body = _txn_body("tx-1", pid, epoch, 0, partition, f"a{partition}")
            await _ok(await api.post("/v1/topics/t/messages", json=body))
        answer = await _ok(await _end(api, "tx-1", pid, epoch, commit=False))
        assert answer["producer_epoch"] == epoch + 1
        for partition in (0, 1):
            assert f"a{partition}" in _values(await _read(api, partition, "read_uncommitted"))
            stable = await _read(api, partition, "read_committed")
            assert not [v for v in _values(stable) if v.startswith("a")]
            assert stable["next_offset"] == stable["high_watermark"]
        # a late write of the ended transaction is fenced
        late = _txn_body("tx-1", pid, epoch, 1, 0, "late")
        response = await api.post("/v1/topics/t/messages", json=late)
        assert response.status == 409, await response.text()
        assert (await response.json())["error"]["code"] == "producer_fenced"


async def test_init_fences_the_old_epoch_and_aborts_its_transaction(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-2")
        await _ok(
            await api.post("/v1/topics/t/messages", json=_txn_body("tx-2", pid, epoch, 0, 0, "x"))
        )
        pid2, epoch2 = await _init(api, "tx-2")
        assert (pid2, epoch2) > (pid, epoch)
        stable = await _read(api, 0, "read_committed")
        assert _values(stable) == [] and stable["last_stable_offset"] == stable["high_watermark"]
        response = await _end(api, "tx-2", pid, epoch, commit=True)
        assert (
            response.status == 409 and (await response.json())["error"]["code"] == "producer_fenced"
        )
        response = await api.post(
            "/v1/topics/t/messages", json=_txn_body("tx-2", pid, epoch, 1, 0, "y")
        )
        assert response.status == 409
        body = _txn_body("tx-2", pid2, epoch2, 0, 0, "z")
        await _ok(await api.post("/v1/topics/t/messages", json=body))
        await _ok(await _end(api, "tx-2", pid2, epoch2, commit=True))
        assert _values(await _read(api, 0, "read_committed")) == ["z"]


async def test_a_transaction_past_its_timeout_is_aborted(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-3", timeout_ms=300)
        await _ok(
            await api.post("/v1/topics/t/messages", json=_txn_body("tx-3", pid, epoch, 0, 0, "t"))
        )
        for _ in range(100):
            stable = await _read(api, 0, "read_committed")
            if stable["last_stable_offset"] == stable["high_watermark"]:
                break
            await asyncio.sleep(0.05)
        assert stable["last_stable_offset"] == stable["high_watermark"]
        assert _values(stable) == []
        response = await _end(api, "tx-3", pid, epoch, commit=True)
        assert response.status == 409


async def test_markers_are_kafka_control_batches(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, broker):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-4")
        await _ok(
            await api.post("/v1/topics/t/messages", json=_txn_body("tx-4", pid, epoch, 0, 0, "m"))
        )
        await _ok(await _end(api, "tx-4", pid, epoch, commit=True))
        replica = next(iter(broker.partitions.values()))
        data = replica.log.read(0, 1 << 20, replica.high_watermark)
        batches = list(iter_batches(data))
        markers = [b for b in batches if b.header.is_control and b.header.producer_id == pid]
        assert len(markers) == 1 and markers[0].header.is_transactional
        assert markers[0].header.producer_epoch == epoch + 1
        data_batches = [
            b for b in batches if not b.header.is_control and b.header.producer_id == pid
        ]
        assert data_batches[0].header.is_transactional


async def test_binary_transactional_batch_and_refusals(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-5")
        batch = build_batch(
            [Record(value=b"bin")],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        )
        headers = {"Content-Type": BATCH_CONTENT_TYPE}
        response = await api.post("/v1/topics/t/messages?partition=0", data=batch, headers=headers)
        assert response.status == 400  # no transactional_id
        response = await api.post(
            "/v1/topics/t/messages?partition=0&transactional_id=tx-5", data=batch, headers=headers
        )
        await _ok(response)
        await _ok(await _end(api, "tx-5", pid, epoch, commit=True))
        assert _values(await _read(api, 0, "read_committed")) == ["bin"]
        response = await api.post(
            "/v1/transactions/tx-5/offsets",
            json={"producer_id": pid, "producer_epoch": epoch + 1, "group": "g", "offsets": []},
        )
        assert response.status == 400
        body = _txn_body("tx-5", pid, epoch + 1, 0, 0, "x")
        del body["transactional_id"]
        assert (await api.post("/v1/topics/t/messages", json=body)).status == 400
        response = await _end(api, "nobody", 1, 0, commit=True)
        assert response.status == 404


async def test_a_restart_keeps_transactions(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-6")
        await _ok(
            await api.post(
                "/v1/topics/t/messages", json=_txn_body("tx-6", pid, epoch, 0, 0, "kept")
            )
        )
        await _ok(await _end(api, "tx-6", pid, epoch, commit=True))
        await _ok(
            await api.post(
                "/v1/topics/t/messages", json=_txn_body("tx-6", pid, epoch + 1, 0, 0, "open")
            )
        )
    async with serving(tmp_path / "d") as (api, _):
        for _ in range(100):
            response = await api.get(
                "/v1/topics/t/partitions/0/messages?offset=0&isolation=read_committed"
            )
            if response.status == 200:
                break
            await asyncio.sleep(0.05)
        stable = await _ok(response)
        assert _values(stable) == ["kept"]
        assert stable["last_stable_offset"] < stable["high_watermark"]  # "open" still open
        answer = await _ok(await _end(api, "tx-6", pid, epoch + 1, commit=True))
        assert answer["producer_epoch"] == epoch + 2
        assert _values(await _read(api, 0, "read_committed")) == ["kept", "open"]


async def test_group_fetch_read_committed(tmp_path: Path) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-7")
        produce = "/v1/topics/t/messages"
        await _ok(await api.post(produce, json={"messages": [{"value": "p1", "partition": 0}]}))
        await _ok(await api.post(produce, json=_txn_body("tx-7", pid, epoch, 0, 0, "t1")))
        await _ok(await api.post(produce, json={"messages": [{"value": "p2", "partition": 0}]}))
        joined = await _ok(
            await api.post(
                "/v1/groups/g/members", json={"topics": ["t"], "auto_offset_reset": "earliest"}
            )
        )
        member = joined["member_id"]

        async def poll(isolation: str) -> list[str]:
            response = await api.get(
                f"/v1/groups/g/members/{member}/messages?isolation={isolation}"
            )
            return [m["value"] for m in (await _ok(response))["messages"]]

        assert await poll("read_committed") == ["p1"]  # t1 is open: the LSO stops before it
        assert await poll("read_committed") == []
        await _ok(await _end(api, "tx-7", pid, epoch, commit=True))
        assert await poll("read_committed") == ["t1", "p2"]


async def test_offsets_in_a_transaction_reach_the_group_only_with_a_commit(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-8")

        async def committed() -> dict[tuple[str, int], int]:
            body = await _ok(await api.get("/v1/groups/cg/offsets"))
            return {(o["topic"], o["partition"]): o["offset"] for o in body["offsets"]}

        async def add(offset: int, epoch: int) -> Any:
            return await api.post(
                "/v1/transactions/tx-8/offsets",
                json={
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "group": "cg",
                    "offsets": [{"topic": "t", "partition": 0, "offset": offset}],
                },
            )

        produce = "/v1/topics/t/messages"
        await _ok(await api.post(produce, json=_txn_body("tx-8", pid, epoch, 0, 0, "out1")))
        assert (await add(5, epoch)).status == 204
        await _ok(await _end(api, "tx-8", pid, epoch, commit=False))
        response = await api.get("/v1/groups/cg/offsets")
        assert response.status == 404 or await committed() == {}
        epoch += 1
        await _ok(await api.post(produce, json=_txn_body("tx-8", pid, epoch, 0, 0, "out2")))
        assert (await add(7, epoch)).status == 204
        assert (await add(8, epoch - 1)).status == 409  # fenced
        await _ok(await _end(api, "tx-8", pid, epoch, commit=True))
        assert await committed() == {("t", 0): 7}
        assert _values(await _read(api, 0, "read_committed")) == ["out2"]


async def test_kafka_python_reads_the_segments_with_their_markers(tmp_path: Path) -> None:
    from kafka.record.memory_records import MemoryRecords

    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        pid, epoch = await _init(api, "tx-9")
        produce = "/v1/topics/t/messages"
        await _ok(await api.post(produce, json=_txn_body("tx-9", pid, epoch, 0, 0, "c")))
        await _ok(await _end(api, "tx-9", pid, epoch, commit=True))
        await _ok(await api.post(produce, json=_txn_body("tx-9", pid, epoch + 1, 0, 0, "a")))
        await _ok(await _end(api, "tx-9", pid, epoch + 1, commit=False))
    segments = sorted((tmp_path / "d" / "partitions").glob("t~*/*.log"))
    assert segments
    seen = []
    for segment in segments:
        memory = MemoryRecords(segment.read_bytes())
        while memory.has_next():
            batch = memory.next_batch()
            if batch is None:
                break
            assert batch.validate_crc()
            if batch.producer_id == pid:
                seen.append((batch.is_transactional, batch.is_control_batch, batch.producer_epoch))
    assert seen == [
        (True, False, epoch),
        (True, True, epoch + 1),  # commit marker, at the bumped epoch
        (True, False, epoch + 1),
        (True, True, epoch + 2),  # abort marker
    ]


async def test_latest_is_the_last_stable_offset_and_a_deleted_topic_needs_no_marker(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        await _ok(await api.post("/v1/topics", json={"name": "gone", "partitions": 1}), 201)
        pid, epoch = await _init(api, "tx-10")
        produce = "/v1/topics/t/messages"
        await _ok(await api.post(produce, json={"messages": [{"value": "p", "partition": 0}]}))
        await _ok(await api.post(produce, json=_txn_body("tx-10", pid, epoch, 0, 0, "open")))
        answer = await _ok(
            await api.get(
                "/v1/topics/t/partitions/0/messages?offset=latest&isolation=read_committed"
            )
        )
        assert answer["next_offset"] == answer["last_stable_offset"] < answer["high_watermark"]
        body = _txn_body("tx-10", pid, epoch, 0, 0, "x")
        await _ok(await api.post("/v1/topics/gone/messages", json=body))
        assert (await api.delete("/v1/topics/gone")).status == 204
        await _ok(await _end(api, "tx-10", pid, epoch, commit=True))
        assert _values(await _read(api, 0, "read_committed")) == ["p", "open"]


async def test_transactional_offsets_naming_a_member_are_fenced_by_its_generation(
    tmp_path: Path,
) -> None:
    """KIP-447: offsets sent with the consumer's member id and generation join the transaction
    only while that member holds the partitions in the group's current generation."""
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=2)
        pid, epoch = await _init(api, "tx-9")
        first = await _ok(await api.post("/v1/groups/cg/members", json={"topics": ["t"]}))

        async def add(member: str, generation: int, partition: int) -> Any:
            body = {
                "producer_id": pid,
                "producer_epoch": epoch,
                "group": "cg",
                "offsets": [{"topic": "t", "partition": partition, "offset": 1}],
                "member_id": member,
                "generation": generation,
            }
            return await api.post("/v1/transactions/tx-9/offsets", json=body)

        member, generation = first["member_id"], first["generation"]
        assert (await add(member, generation, 0)).status == 204
        second = await _ok(await api.post("/v1/groups/cg/members", json={"topics": ["t"]}))
        assert second["generation"] > generation
        stale = await add(member, generation, 0)
        assert stale.status == 409 and (await stale.json())["error"]["code"] == "stale_generation"
        other = second["member_id"]
        held = [a["partition"] for a in second["assignment"]]
        assert (await add(other, second["generation"], held[0])).status == 204
        moved = await add(member, second["generation"], held[0])  # not its partition any more
        assert moved.status == 409
        bad = await api.post(
            "/v1/transactions/tx-9/offsets",
            json={
                "producer_id": pid,
                "producer_epoch": epoch,
                "group": "cg",
                "member_id": "x",
                "offsets": [{"topic": "t", "partition": 0, "offset": 1}],
            },
        )
        assert bad.status == 400  # a member id without its generation


async def test_a_never_written_partition_is_stable_up_to_its_high_watermark(
    tmp_path: Path,
) -> None:
    """The leader's Raft no-op takes offset 0 but opens no transaction: a reader waiting for
    "no transaction open" (LSO == HW) must not wait forever on an empty partition."""
    async with serving(tmp_path / "d") as (api, _):
        await _topic(api, partitions=1)
        stable = await _read(api, 0, "read_committed")
        assert stable["high_watermark"] >= 1  # the no-op is committed
        assert stable["last_stable_offset"] == stable["high_watermark"]
        assert _values(stable) == []
