"""Tiered storage through a real broker against a real SeaweedFS: uploads, local trimming after
the manifest is durable, reads from offset 0 identical to local ones, outages, config refusals."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from inproc_harness import configs, start_all, wait_for
from kafka.record.memory_records import MemoryRecords
from seaweedfs import FlakyProxy, SeaweedServer

from raftline.api.app import create_app
from raftline.node.broker import Broker, BrokerError
from raftline.raftlog.records import Record, build_batch, decode_batch
from raftline.raftlog.types import EntryKind
from raftline.tiered import layout
from raftline.tiered.manifest import ManifestState
from raftline.tiered.store import ObjectStore, S3Config

_prefixes = (f"t{i}" for i in itertools.count())


@pytest.fixture
def s3_env(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> SeaweedServer:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return seaweed


@pytest.fixture
def prefix() -> str:
    return next(_prefixes)


@pytest.fixture
async def node(
    tmp_path: Path, s3_env: SeaweedServer, bucket: str, prefix: str
) -> AsyncIterator[Broker]:
    [config] = configs(tmp_path, 1)
    config.s3_endpoint, config.s3_bucket, config.s3_prefix = s3_env.endpoint, bucket, prefix
    config.retention_check_s = 0.1
    config.fsync = "never"
    [broker] = await start_all([config])
    yield broker
    await broker.stop()


def store_of(seaweed: SeaweedServer, bucket: str, prefix: str) -> ObjectStore:
    return ObjectStore(S3Config.from_env(seaweed.endpoint, bucket, prefix=prefix))


TIERED = {
    "remote.storage.enable": "true",
    "segment.bytes": "4096",
    "local.retention.bytes": "0",
}


async def produce(broker: Broker, topic: str, count: int, size: int = 200) -> list[bytes]:
    values = []
    for i in range(count):
        value = f"{i:06d}".encode() + b"x" * size
        values.append(value)
        await broker.produce(topic, 0, build_batch([Record(value, key=b"k")]), "all")
    return values


async def tiered_topic(node: Broker, topic: str, count: int) -> tuple[list[bytes], Any, Any]:
    """A 1-partition tiered topic with `count` records: (values, its replica, its tiering)."""
    await node.create_topic(topic, 1, 1, TIERED)
    values = await produce(node, topic, count)
    replica = next(r for r in node.partitions.values() if r.topic == topic)
    return values, replica, node.tiering.partitions[replica.group]  # type: ignore[union-attr]


async def fetch_all(broker: Broker, topic: str, start: int = 0) -> list[tuple[int, bytes]]:
    out = []
    offset = start
    while True:
        batches, _, high_watermark = await broker.fetch(topic, 0, offset, 3000, 0)
        for raw in batches:
            decoded = decode_batch(raw)
            offset = decoded.header.last_offset + 1
            if decoded.header.is_control:
                continue
            out += [(r.offset, r.value) for r in decoded.records if r.offset >= start]
        if offset >= high_watermark or not batches:
            return out


async def test_sealed_segments_go_to_the_bucket_and_local_disk_keeps_only_the_rest(
    node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    await node.create_topic("orders", 1, 1, TIERED)
    values = await produce(node, "orders", 120)
    replica = node.partitions[next(iter(node.partitions))]
    await wait_for(lambda: replica.log.log_start_offset > 60, timeout=20)

    store = store_of(s3_env, bucket, prefix)
    keys = [info.key for info in await store.list()]
    assert sum(k.endswith(".log") for k in keys) >= 3
    manifests = [k for k in keys if k.endswith("manifest.json")]
    assert len(manifests) == 1
    document = json.loads(await store.get(manifests[0]))
    assert document["format_version"] == 1
    # Local trimming never passed what the durable manifest holds.
    assert replica.log.log_start_offset <= document["next_offset"]
    assert any(k.startswith("topics/orders/") for k in keys)

    records = await fetch_all(node, "orders")
    assert [value for _, value in records] == values
    offsets = [offset for offset, _ in records]
    assert offsets == sorted(offsets)


async def test_a_remote_read_returns_the_bytes_a_local_read_returned(node: Broker) -> None:
    await node.create_topic("same", 1, 1, TIERED)
    await produce(node, "same", 60)
    replica = node.partitions[next(iter(node.partitions))]
    local = []
    offset = 0
    while offset < replica.high_watermark:
        batches, _, _ = await node.fetch("same", 0, offset, 1000, 0)
        local += [bytes(b) for b in batches]
        offset = decode_batch(batches[-1]).header.last_offset + 1
    await wait_for(lambda: replica.log.log_start_offset > 30, timeout=20)
    remote = []
    offset = 0
    while offset < replica.log.log_start_offset:
        batches, log_start, _ = await node.fetch("same", 0, offset, 1000, 0)
        assert log_start == 0
        remote += [bytes(b) for b in batches]
        offset = decode_batch(batches[-1]).header.last_offset + 1
    assert remote == local[: len(remote)]


async def test_uploads_wait_out_a_store_outage_and_nothing_unuploaded_is_deleted(
    node: Broker, s3_env: SeaweedServer
) -> None:
    await node.create_topic("outage", 1, 1, TIERED)
    tiering = node.tiering
    assert tiering is not None
    s3_env.pause()
    try:
        values = await produce(node, "outage", 80)  # produce goes on while the store is down
        replica = node.partitions[next(iter(node.partitions))]
        await asyncio.sleep(2.0)
        assert replica.log.log_start_offset == 0  # nothing left the disk: nothing is uploaded
        assert tiering.metrics()["raftline_tiered_upload_lag_segments"] > 0
        assert [v for _, v in await fetch_all(node, "outage")] == values  # local reads go on
    finally:
        s3_env.resume()
    await wait_for(lambda: replica.log.log_start_offset > 40, timeout=60)
    assert [v for _, v in await fetch_all(node, "outage")] == values


async def test_a_failing_store_counts_errors_and_local_disk_keeps_everything(
    tmp_path: Path, s3_env: SeaweedServer
) -> None:
    [config] = configs(tmp_path, 1)
    config.s3_endpoint, config.s3_bucket = "http://127.0.0.1:9", "nowhere"  # refused
    config.retention_check_s = 0.1
    [broker] = await start_all([config])
    try:
        await broker.create_topic("failing", 1, 1, TIERED)
        values = await produce(broker, "failing", 60)
        tiering = broker.tiering
        assert tiering is not None
        await wait_for(lambda: tiering.upload_errors > 0, timeout=30)
        replica = broker.partitions[next(iter(broker.partitions))]
        assert replica.log.log_start_offset == 0
        assert [v for _, v in await fetch_all(broker, "failing")] == values
        metrics = broker.metrics_text()
        assert "raftline_tiered_upload_errors_total" in metrics
        assert tiering.metrics()["raftline_tiered_upload_lag_bytes"] > 0
    finally:
        await broker.stop()


async def test_remote_storage_needs_a_node_with_object_storage(tmp_path: Path) -> None:
    [broker] = await start_all(configs(tmp_path, 1))
    try:
        with pytest.raises(BrokerError, match="--s3-endpoint"):
            await broker.create_topic("refused", 1, 1, {"remote.storage.enable": "true"})
    finally:
        await broker.stop()


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"remote.storage.enable": "yes"}, "true or false"),
        ({"local.retention.ms": "1000"}, "remote.storage.enable=true"),
        ({**TIERED, "local.retention.bytes": "-3"}, ">= -2"),
        ({**TIERED, "retention.ms": "1000", "local.retention.ms": "2000"}, "must not exceed"),
        ({**TIERED, "cleanup.policy": "compact"}, "compacted"),
    ],
)
async def test_bad_tiered_settings_are_refused(
    node: Broker, config: dict[str, str], problem: str
) -> None:
    with pytest.raises(BrokerError, match=problem) as refused:
        await node.create_topic("bad", 1, 1, config)
    assert refused.value.code == "invalid_request"


async def test_a_new_leader_continues_the_manifest_without_other_objects(
    tmp_path: Path, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    cfgs = configs(tmp_path, 3)
    for config in cfgs:
        config.s3_endpoint, config.s3_bucket, config.s3_prefix = s3_env.endpoint, bucket, prefix
        config.retention_check_s = 0.1
        config.fsync = "never"
    brokers = await start_all(cfgs)
    stopped: Broker | None = None
    try:
        await brokers[0].create_topic("moving", 1, 3, TIERED)
        group = next(iter(brokers[0].partitions))

        def leader() -> Broker | None:
            return next(
                (b for b in brokers if b is not stopped and b.partitions[group].role == "leader"),
                None,
            )

        await wait_for(lambda: leader() is not None)
        first = leader()
        assert first is not None
        values = await produce(first, "moving", 60)
        await wait_for(
            lambda: all(len(b.tiering.partitions[group].state.segments) >= 2 for b in brokers),
            timeout=30,
        )  # type: ignore[union-attr]
        store = store_of(s3_env, bucket, prefix)
        before = {
            info.key: await store.get(info.key)
            for info in await store.list()
            if info.key.endswith(".log")
        }

        stopped = first
        await first.stop()
        # What the survivors know is in the bucket (an add the old leader committed last may
        # still be applied under the new leader: that segment was uploaded by the old one).
        handed_over_at = min(
            b.tiering.partitions[group].state.next_offset  # type: ignore[union-attr]
            for b in brokers
            if b is not first
        )
        await wait_for(lambda: leader() is not None, timeout=20)
        second = leader()
        assert second is not None
        values += await produce(second, "moving", 60)
        tiering = second.tiering.partitions[group]  # type: ignore[union-attr]
        await wait_for(lambda: tiering.state.next_offset > len(values), timeout=30)
        await wait_for(lambda: tiering.state.durable_revision == tiering.state.revision, timeout=30)

        after = {info.key for info in await store.list() if info.key.endswith(".log")}
        manifest = json.loads(await store.get(tiering._manifest_key()))
        named = [s["object"] for s in manifest["segments"]]
        assert after == set(named)  # no object the manifest does not name: none was redone
        # The new leader uploaded only what was not in the bucket when it took over.
        new = [s for s in manifest["segments"] if s["base_offset"] >= handed_over_at]
        assert 0 < second.tiering.uploaded_segments <= len(new)  # type: ignore[union-attr]
        for key, data in before.items():
            assert await store.get(key) == data  # objects already there are untouched
        for earlier, later in zip(manifest["segments"], manifest["segments"][1:], strict=False):
            assert later["base_offset"] == earlier["last_offset"] + 1
        assert [v for _, v in await fetch_all(second, "moving")] == values
    finally:
        for broker in brokers:
            if broker is not stopped:
                await broker.stop()


async def _ok(response: Any, status: int = 200) -> Any:
    assert response.status == status, await response.text()
    return await response.json()


async def _read_all(api: TestClient, isolation: str) -> list[str]:
    values: list[str] = []
    offset = 0
    while True:
        body = await _ok(
            await api.get(
                f"/v1/topics/tx/partitions/0/messages?offset={offset}&isolation={isolation}"
            )
        )
        values += [m["value"] for m in body["messages"]]
        if body["next_offset"] == offset or body["next_offset"] >= body["high_watermark"]:
            return values
        offset = body["next_offset"]


async def test_read_committed_from_the_bucket_drops_aborted_transactions(
    node: Broker,
) -> None:
    api = TestClient(TestServer(create_app(node, self_http=node.config.http)))
    await api.start_server()
    try:
        await _ok(await api.post("/v1/topics", json={"name": "tx", "config": TIERED}), 201)
        init = {"transactional_id": "tx-1", "transaction_timeout_ms": 60_000}
        producer = await _ok(await api.post("/v1/producers", json=init))
        pid, epoch = producer["producer_id"], producer["producer_epoch"]
        expected: list[str] = []
        everything: list[str] = []
        filler = "f" * 300
        for round_ in range(6):
            commit = round_ % 2 == 0
            values = [f"{'c' if commit else 'a'}{round_}-{i}-{filler}" for i in range(4)]
            body = {
                "transactional": True,
                "transactional_id": "tx-1",
                "producer_id": pid,
                "producer_epoch": epoch,
                "sequence": 0,
                "messages": [{"value": v, "partition": 0} for v in values],
            }
            await _ok(await api.post("/v1/topics/tx/messages", json=body))
            plain = [f"p{round_}-{i}-{filler}" for i in range(10)]
            await _ok(
                await api.post(
                    "/v1/topics/tx/messages",
                    json={"messages": [{"value": v, "partition": 0} for v in plain]},
                )
            )
            action = "commit" if commit else "abort"
            ended = await _ok(
                await api.post(
                    f"/v1/transactions/tx-1/{action}",
                    json={"producer_id": pid, "producer_epoch": epoch},
                )
            )
            epoch = ended["producer_epoch"]
            expected += [*values, *plain] if commit else plain
            everything += [*values, *plain]
        # Filler after the last marker, so that the transactions' segments seal and upload.
        for _ in range(4):
            plain = [f"z-{filler}" for _ in range(10)]
            await _ok(
                await api.post(
                    "/v1/topics/tx/messages",
                    json={"messages": [{"value": v, "partition": 0} for v in plain]},
                )
            )
            expected += plain
            everything += plain
        replica = next(r for r in node.partitions.values() if r.topic == "tx")
        tiering = node.tiering.partitions[replica.group]  # type: ignore[union-attr]
        await wait_for(
            lambda: (
                any(s.txn_index for s in tiering.state.segments)
                and replica.log.log_start_offset > tiering.state.segments[-1].base_offset
            ),
            timeout=30,
        )
        # The local log's transaction index left with the segments below the local log start:
        # only the bucket's transaction index can drop those aborts now.
        assert replica.log.aborted_txns(0, replica.log.log_start_offset) == []
        assert sorted(await _read_all(api, "read_committed")) == sorted(expected)
        assert await _read_all(api, "read_committed") == expected
        assert await _read_all(api, "read_uncommitted") == everything
    finally:
        await api.close()


async def test_bucket_objects_are_kafka_batches_with_tiered_entries_as_control_batches(
    node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    values, _, tiering = await tiered_topic(node, "kafka", 80)
    await wait_for(lambda: len(tiering.state.segments) >= 4, timeout=30)
    store = store_of(s3_env, bucket, prefix)
    seen: list[bytes] = []
    controls = 0
    for segment in tiering.state.segments:
        records = MemoryRecords(await store.get(segment.object))
        while (kbatch := records.next_batch()) is not None:
            assert kbatch.validate_crc()
            if kbatch.is_control_batch:
                controls += 1
                continue
            seen += [r.value for r in kbatch]
    assert controls > 0  # Raft no-ops and tiered entries travel as control batches
    assert seen == values[: len(seen)] and len(seen) > 20


async def test_a_replica_that_missed_tiered_entries_rebuilds_from_the_bucket(node: Broker) -> None:
    """As a follower that installed the leader's trim point: its state lacks the commands below
    its log start; before leading it takes the bucket's manifest plus the commands it still has."""
    _, replica, tiering = await tiered_topic(node, "rebuilt", 80)
    await wait_for(lambda: replica.log.log_start_offset > 40, timeout=30)
    await wait_for(lambda: tiering.state.durable_revision == tiering.state.revision, timeout=30)
    tiering.stop()
    known = list(tiering.state.segments)
    uploaded = node.tiering.uploaded_segments  # type: ignore[union-attr]
    tiering.state = ManifestState()  # everything below the log start "missed"
    await tiering.upload_round()
    assert tiering.state.segments[: len(known)] == known
    assert node.tiering.uploaded_segments == uploaded  # type: ignore[union-attr]
    tiering.state.check()


@pytest.mark.parametrize("retention_emptied", [False, True])
async def test_a_replica_that_applied_commands_past_its_gap_still_rebuilds_from_the_bucket(
    node: Broker, retention_emptied: bool
) -> None:
    """Issue 16's chaos finding: a follower that installed the leader's trim point went on
    applying the later commands (refused: they do not follow its state), which moved its applied
    index past the gap; as leader it must still rebuild from the bucket and serve offset 0. Also
    when remote retention had emptied its state's segments before the gap."""
    values, replica, tiering = await tiered_topic(node, "gapped", 80)
    await wait_for(lambda: replica.log.log_start_offset > 40, timeout=30)
    await wait_for(lambda: tiering.state.durable_revision == tiering.state.revision, timeout=30)
    tiering.stop()
    known = list(tiering.state.segments)
    first = tiering.storage.first_index()
    # The follower's state: the first segment only; the commands after it left the log.
    seen = known[0]
    end = seen.last_offset + 1
    if retention_emptied:  # added, then truncated by retention.*: revision 2, no segments
        tiering.state = ManifestState([], end, 2, 2, end, [], end)
    else:
        tiering.state = ManifestState([seen], seen.base_offset, 1, 1, end, [], end)
    assert tiering.state.applied_index + 1 < first
    later = tiering.storage.entries(first, tiering.storage.last_index(), 1 << 30)
    for entry in later:
        if entry.kind == EntryKind.CONTROL:
            tiering.apply_entry(entry)
    assert tiering.state.next_offset == end  # the later adds were refused
    await tiering.upload_round()
    assert tiering.state.segments[: len(known)] == known
    tiering.state.check()
    assert [v for _, v in await fetch_all(node, "gapped")] == values


async def test_offset_for_a_timestamp_below_the_local_log_start_comes_from_the_bucket(
    node: Broker,
) -> None:
    await node.create_topic("timed", 1, 1, TIERED)
    for i in range(60):
        record = Record(f"{i:04d}".encode() + b"t" * 200, timestamp=1_000_000 + i * 1000)
        await node.produce("timed", 0, build_batch([record]), "all")
    replica = next(r for r in node.partitions.values() if r.topic == "timed")
    await wait_for(lambda: replica.log.log_start_offset > 30, timeout=30)
    offset = await node.offset_for_timestamp("timed", 0, 1_000_000 + 10 * 1000)
    batches, _, _ = await node.fetch("timed", 0, offset, 1, 0)
    first = decode_batch(batches[0]).records[0]
    assert first.value is not None and first.value.startswith(b"0010")


async def test_retention_removes_old_segments_from_the_bucket_too(
    node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    await node.create_topic("aging", 1, 1, {**TIERED, "retention.bytes": "8192"})
    values = await produce(node, "aging", 100)
    replica = next(r for r in node.partitions.values() if r.topic == "aging")
    tiering = node.tiering.partitions[replica.group]  # type: ignore[union-attr]
    await wait_for(lambda: tiering.state.start_offset > 0 and not tiering.state.garbage, 30)
    state = tiering.state
    store = store_of(s3_env, bucket, prefix)
    topic_id = node.meta.state.topics["aging"].topic_id
    stored = {i.key for i in await store.list(layout.partition_path("aging", topic_id, 0))}
    named = {key for s in state.segments for key in s.keys}
    assert {k for k in stored if not k.endswith("manifest.json")} == named  # the rest deleted
    manifest = json.loads(await store.get(tiering._manifest_key()))
    assert manifest["start_offset"] == state.start_offset > 0
    with pytest.raises(BrokerError) as gone:
        await node.fetch("aging", 0, 0, 1000, 0)
    assert gone.value.code == "offset_out_of_range"
    records = await fetch_all(node, "aging", state.start_offset)
    assert [v for _, v in records] == values[-len(records) :]


async def test_a_store_failing_some_requests_still_gets_every_segment_and_manifest(
    tmp_path: Path, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    proxy = await FlakyProxy(s3_env.endpoint, every=3).start()
    [config] = configs(tmp_path, 1)
    config.s3_endpoint, config.s3_bucket, config.s3_prefix = proxy.endpoint, bucket, prefix
    config.retention_check_s, config.fsync = 0.1, "never"
    [broker] = await start_all([config])
    try:
        await broker.create_topic("flaky", 1, 1, TIERED)
        values = await produce(broker, "flaky", 100)
        replica = next(r for r in broker.partitions.values() if r.topic == "flaky")
        await wait_for(lambda: replica.log.log_start_offset > 60, timeout=60)
        assert proxy.failed > 0 and broker.tiering.store.retries > 0  # type: ignore[union-attr]
        store = store_of(s3_env, bucket, prefix)
        tiering = broker.tiering.partitions[replica.group]  # type: ignore[union-attr]
        manifest = json.loads(await store.get(tiering._manifest_key()))
        for segment in manifest["segments"]:  # every object the manifest names is there
            data = await store.get(segment["object"])
            assert len(data) == segment["size_bytes"]
        assert [v for _, v in await fetch_all(broker, "flaky")] == values
    finally:
        await broker.stop()
        await proxy.stop()


async def test_a_stale_manifest_never_replaces_a_newer_one_in_the_bucket(
    node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    _, _, tiering = await tiered_topic(node, "cas", 40)
    await wait_for(lambda: tiering.state.durable_revision >= 2, timeout=30)
    tiering.stop()
    store = store_of(s3_env, bucket, prefix)
    newest = await store.get(tiering._manifest_key())
    stale = ManifestState()  # as a deposed leader would hold it: one segment, revision 1
    stale.apply(1, {"op": "add", "segment": tiering.state.segments[0].to_json()})
    assert not await tiering._write_manifest(stale.document("cas", 1, 0))
    assert await store.get(tiering._manifest_key()) == newest


async def test_a_second_cluster_never_writes_into_a_partition_another_one_uploaded(
    tmp_path: Path, node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    await node.create_topic("shared", 1, 1, TIERED)
    await produce(node, "shared", 40)
    first = next(r for r in node.partitions.values() if r.topic == "shared")
    first_tiering = node.tiering.partitions[first.group]  # type: ignore[union-attr]
    await wait_for(lambda: first_tiering.state.durable_revision > 0, timeout=30)
    store = store_of(s3_env, bucket, prefix)
    manifest = await store.get(first_tiering._manifest_key())

    [config] = configs(tmp_path / "other", 1)  # another cluster, same bucket and prefix
    config.s3_endpoint, config.s3_bucket, config.s3_prefix = s3_env.endpoint, bucket, prefix
    config.retention_check_s, config.fsync = 0.1, "never"
    [other] = await start_all([config])
    try:
        await other.create_topic("shared", 1, 1, TIERED)
        second = next(r for r in other.partitions.values() if r.topic == "shared")
        assert (
            other.meta.state.topics["shared"].topic_id == node.meta.state.topics["shared"].topic_id
        )
        await produce(other, "shared", 40)
        tiering = other.tiering.partitions[second.group]  # type: ignore[union-attr]
        await wait_for(lambda: tiering.last_error is not None, timeout=30)
        assert "already holds" in tiering.last_error
        assert tiering.state.segments == [] and second.log.log_start_offset == 0
        assert await store.get(first_tiering._manifest_key()) == manifest
    finally:
        await other.stop()


async def test_a_restarted_node_keeps_its_manifest_state_and_serves_the_bucket(
    tmp_path: Path, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    [config] = configs(tmp_path, 1)
    config.s3_endpoint, config.s3_bucket, config.s3_prefix = s3_env.endpoint, bucket, prefix
    config.retention_check_s, config.fsync = 0.1, "never"
    [broker] = await start_all([config])
    try:
        await broker.create_topic("again", 1, 1, TIERED)
        values = await produce(broker, "again", 60)
        replica = next(r for r in broker.partitions.values() if r.topic == "again")
        await wait_for(lambda: replica.log.log_start_offset > 30, timeout=30)
        segments = list(broker.tiering.partitions[replica.group].state.segments)  # type: ignore[union-attr]
    finally:
        await broker.stop()
    [broker] = await start_all([config])
    try:
        await wait_for(lambda: replica.group in broker.partitions, timeout=30)
        await wait_for(lambda: broker.partitions[replica.group].role == "leader", timeout=30)
        tiering = broker.tiering.partitions[replica.group]  # type: ignore[union-attr]
        assert tiering.state.segments[: len(segments)] == segments
        assert [v for _, v in await fetch_all(broker, "again")] == values
        values += await produce(broker, "again", 40)
        await wait_for(lambda: tiering.state.next_offset > segments[-1].last_offset + 20, 30)
        tiering.state.check()
        assert [v for _, v in await fetch_all(broker, "again")] == values
    finally:
        await broker.stop()


async def test_deleting_a_topic_removes_its_objects_from_the_bucket(
    node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    _, _, tiering = await tiered_topic(node, "doomed", 40)
    await wait_for(lambda: tiering.state.durable_revision > 0, timeout=30)
    topic_id = node.meta.state.topics["doomed"].topic_id
    store = store_of(s3_env, bucket, prefix)
    folder = layout.partition_path("doomed", topic_id, 0) + "/"
    assert await store.list(folder)
    node.tiering.sweep_topics_s = 0.2  # type: ignore[union-attr]  # the topic object's sweep
    await node.delete_topic("doomed")
    deadline = asyncio.get_running_loop().time() + 30
    while await store.list(folder) or await store.list(f"topics/doomed/{topic_id}/"):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.2)
