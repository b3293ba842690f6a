"""Restore from the bucket after every node lost its disk (real brokers, a real SeaweedFS): the
restored topic reads from offset 0 exactly as uploaded, and new writes continue after it."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from inproc_harness import configs, serving, start_all
from seaweedfs import SeaweedServer

from raftline.api.app import create_app
from raftline.clients import cli
from raftline.node.broker import Broker, BrokerError
from raftline.node.config import NodeConfig
from raftline.node.metadata import MetadataError, MetadataState
from raftline.raftlog.records import Record, build_batch, decode_batch
from raftline.tiered import layout
from raftline.tiered.store import ObjectStore, S3Config

_prefixes = (f"r{i}" for i in itertools.count())

TIERED = {
    "remote.storage.enable": "true",
    "segment.bytes": "4096",
    "local.retention.bytes": "0",
}
# (offset, key, value, headers) of one record
Row = tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@pytest.fixture
def nodes(
    tmp_path: Path, seaweed: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> list[NodeConfig]:
    """Three node configs sharing one bucket prefix (a new one per test)."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    prefix = next(_prefixes)
    out = configs(tmp_path, 3)
    for config in out:
        config.s3_endpoint, config.s3_bucket, config.s3_prefix = seaweed.endpoint, bucket, prefix
        config.retention_check_s = 0.1
        config.fsync = "never"
    return out


async def stop_all(brokers: list[Broker]) -> None:
    for broker in brokers:
        await broker.stop()


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.2)


async def leader(brokers: list[Broker], topic: str, partition: int) -> Broker:
    """The broker (of `brokers`, the running ones) leading the partition, once there is one."""
    found: list[Broker] = []

    async def elected() -> bool:
        for broker in brokers:
            replica = next(
                (
                    r
                    for r in broker.partitions.values()
                    if r.topic == topic and r.partition == partition
                ),
                None,
            )
            if replica is not None and replica.role == "leader":
                found[:] = [broker]
                return True
        return False

    await eventually(elected)
    return found[0]


def record(i: int) -> Record:
    return Record(b"v%06d" % i + b"x" * 150, key=b"k%d" % (i % 7), headers=[("n", b"%d" % i)])


async def produce(broker: Broker, topic: str, partition: int, numbers: range) -> list[int]:
    return [
        await broker.produce(topic, partition, build_batch([record(i)]), "all") for i in numbers
    ]


async def read_all(broker: Broker, topic: str, partition: int) -> list[Row]:
    """Every record from offset 0 to the high watermark, as a consumer fetches them."""
    rows: list[Row] = []
    offset = 0
    while True:
        batches, _, high_watermark = await broker.fetch(topic, partition, offset, 4096, 0)
        for raw in batches:
            decoded = decode_batch(raw)
            offset = decoded.header.last_offset + 1
            if not decoded.header.is_control:
                rows += [(r.offset, r.key, r.value, tuple(r.headers)) for r in decoded.records]
        if offset >= high_watermark or not batches:
            return rows


def store_of(config: NodeConfig) -> ObjectStore:
    assert config.s3_endpoint and config.s3_bucket
    return ObjectStore(
        S3Config.from_env(config.s3_endpoint, config.s3_bucket, prefix=config.s3_prefix)
    )


async def manifests(config: NodeConfig, topic: str, topic_id: int, partitions: int) -> list[dict]:
    store = store_of(config)
    keys = [layout.manifest_key(topic, topic_id, p) for p in range(partitions)]
    return [json.loads(await store.get(key)) for key in keys]


async def uploads_done(brokers: list[Broker], topic: str, partitions: int) -> None:
    """Waits until every sealed segment of the topic's first `partitions` partitions is in the
    bucket under a durable manifest."""

    async def done() -> bool:
        for p in range(partitions):
            tiering = (await leader(brokers, topic, p)).tiering
            assert tiering is not None
            held = next(t for g, t in tiering.partitions.items() if g.endswith(f"~{p}"))
            active_base = held.storage.log.segment_bases[-1]
            if active_base == 0 or held.state.durable_next < active_base:
                return False
        return True

    await eventually(done)


async def written_and_uploaded(
    nodes: list[NodeConfig], topic: str, count: int
) -> tuple[int, list[list[Row]], list[dict]]:
    """A 2-partition tiered topic written on a fresh cluster, which then loses every disk.
    Returns its topic id, the records of each partition below what its manifest holds, and the
    manifests."""
    brokers = await start_all(nodes)
    try:
        await brokers[0].create_topic(topic, 2, 3, TIERED)
        for p in (0, 1):
            await produce(await leader(brokers, topic, p), topic, p, range(count))
        await uploads_done(brokers, topic, 2)
        topic_id = brokers[0].meta.state.topics[topic].topic_id
        documents = await manifests(nodes[0], topic, topic_id, 2)
        rows = []
        for p, document in enumerate(documents):
            everything = await read_all(await leader(brokers, topic, p), topic, p)
            rows.append([r for r in everything if r[0] < document["next_offset"]])
    finally:
        await stop_all(brokers)
    for config in nodes:
        shutil.rmtree(config.data_dir)
    return topic_id, rows, documents


async def test_a_cluster_that_lost_every_disk_gets_back_every_uploaded_record(
    nodes: list[NodeConfig],
) -> None:
    topic_id, uploaded, documents = await written_and_uploaded(nodes, "orders", 150)
    assert all(len(rows) > 50 for rows in uploaded)

    brokers = await start_all(nodes)
    try:
        [result] = await brokers[1].restore_topics()
        assert result["restored"] and result["name"] == "orders"
        assert result["topic_id"] == topic_id
        assert [p["next_offset"] for p in result["partitions"]] == [
            d["next_offset"] for d in documents
        ]
        described = await brokers[0].describe_topic("orders")
        assert described["config"] == TIERED and len(described["partitions"]) == 2
        for p in (0, 1):
            assert await read_all(await leader(brokers, "orders", p), "orders", p) == uploaded[p]
    finally:
        await stop_all(brokers)


async def test_writes_after_a_restore_continue_after_the_last_uploaded_offset(
    nodes: list[NodeConfig],
) -> None:
    _, uploaded, documents = await written_and_uploaded(nodes, "events", 100)
    brokers = await start_all(nodes)
    try:
        await brokers[0].restore_topics(["events"])
        head = await leader(brokers, "events", 0)
        [offset] = await produce(head, "events", 0, range(1000, 1001))
        # The new leader's first entry (a Raft no-op) takes the first offset after the bucket's.
        assert offset == documents[0]["next_offset"] + 1
        rows = await read_all(head, "events", 0)
        new = record(1000)
        assert rows == [*uploaded[0], (offset, new.key, new.value, tuple(new.headers))]
    finally:
        await stop_all(brokers)


async def test_a_restored_topic_deleted_later_leaves_the_bucket(nodes: list[NodeConfig]) -> None:
    """The restoring cluster adopts the topic object (it carried the lost cluster's id), so its
    sweep of deleted topics removes it after a delete like a topic it created."""
    topic_id, _, _ = await written_and_uploaded(nodes, "adopted", 60)
    brokers = await start_all(nodes)
    store = store_of(nodes[0])
    key = layout.topic_key("adopted", topic_id)
    try:
        await brokers[0].restore_topics(["adopted"])
        cluster_id = brokers[0].meta.state.cluster_id

        async def adopted() -> bool:
            return json.loads(await store.get(key))["cluster_id"] == cluster_id

        await eventually(adopted)
        for broker in brokers:
            assert broker.tiering is not None
            broker.tiering.sweep_topics_s = 0.2
        await brokers[0].delete_topic("adopted")

        async def gone() -> bool:
            return not await store.list(f"topics/adopted/{topic_id}/") and not any(
                [await store.list(layout.partition_path("adopted", topic_id, p)) for p in (0, 1)]
            )

        await eventually(gone)
    finally:
        await stop_all(brokers)


async def test_a_restored_partition_reads_the_same_after_its_leader_fails(
    nodes: list[NodeConfig],
) -> None:
    """Every replica knows what the bucket held at the restore, not only the first leader: a
    follower that applied the new leader's later uploads still reads from offset 0."""
    _, uploaded, _ = await written_and_uploaded(nodes, "audit", 100)
    brokers = await start_all(nodes)
    try:
        await brokers[2].restore_topics()
        first = await leader(brokers, "audit", 0)
        await produce(first, "audit", 0, range(100, 200))
        await uploads_done(brokers, "audit", 1)
        before = await read_all(first, "audit", 0)
        assert before[: len(uploaded[0])] == uploaded[0] and len(before) == len(uploaded[0]) + 100
        await first.stop()
        brokers.remove(first)
        second = await leader(brokers, "audit", 0)
        assert await read_all(second, "audit", 0) == before
    finally:
        await stop_all(brokers)


async def test_segments_a_stale_manifest_lost_are_restored_from_their_objects(
    nodes: list[NodeConfig],
) -> None:
    """A manifest overwritten by an older one (a PUT the store ran after its client gave up)
    names fewer segments than the bucket holds: the restore repairs it from the objects."""
    topic_id, uploaded, documents = await written_and_uploaded(nodes, "ledger", 120)
    stale = dict(documents[0])
    dropped = stale["segments"][-2:]
    stale["segments"] = stale["segments"][:-2]
    stale["next_offset"] = dropped[0]["base_offset"]
    store = store_of(nodes[0])
    await store.put(layout.manifest_key("ledger", topic_id, 0), json.dumps(stale).encode())
    brokers = await start_all(nodes)
    try:
        [result] = await brokers[0].restore_topics()
        assert result["partitions"][0]["next_offset"] == documents[0]["next_offset"]
        assert await read_all(await leader(brokers, "ledger", 0), "ledger", 0) == uploaded[0]
        [repaired] = await manifests(nodes[0], "ledger", topic_id, 1)
        assert [s["object"] for s in repaired["segments"][-2:]] == [s["object"] for s in dropped]
    finally:
        await stop_all(brokers)


async def test_an_idle_partition_uploads_its_last_records_within_segment_ms(
    nodes: list[NodeConfig],
) -> None:
    """The restore's RPO: with no append to roll the active segment, segment.ms still seals it
    and the leader uploads it."""
    brokers = await start_all(nodes)
    try:
        config = {**TIERED, "segment.bytes": str(1 << 20), "segment.ms": "1500"}
        await brokers[0].create_topic("idle", 1, 3, config)
        head = await leader(brokers, "idle", 0)
        [*_, last] = await produce(head, "idle", 0, range(10))
        topic_id = head.meta.state.topics["idle"].topic_id

        async def uploaded() -> bool:
            try:
                [document] = await manifests(nodes[0], "idle", topic_id, 1)
            except Exception:  # no manifest yet
                return False
            return bool(document["next_offset"] > last)

        started = time.monotonic()
        await eventually(uploaded, timeout=30)
        assert time.monotonic() - started < 1.5 + 10
    finally:
        await stop_all(brokers)


async def test_restore_on_a_node_without_object_storage_is_refused(tmp_path: Path) -> None:
    [broker] = await start_all(configs(tmp_path, 1))
    try:
        with pytest.raises(BrokerError, match="--s3-endpoint") as refused:
            await broker.restore_topics()
        assert refused.value.code == "invalid_request"
    finally:
        await broker.stop()


async def test_restoring_a_topic_the_bucket_lacks_names_it(
    nodes: list[NodeConfig], tmp_path: Path
) -> None:
    [solo] = configs(tmp_path / "solo", 1)
    solo.s3_endpoint, solo.s3_bucket = nodes[0].s3_endpoint, nodes[0].s3_bucket
    solo.s3_prefix = nodes[0].s3_prefix
    [broker] = await start_all([solo])
    try:
        with pytest.raises(BrokerError, match="no topic object in the bucket for ghost"):
            await broker.restore_topics(["ghost"])
    finally:
        await broker.stop()


def metadata_with_nodes(count: int) -> MetadataState:
    state = MetadataState()
    for i in range(1, count + 1):
        state.apply({"op": "register_node", "node": {"id": i, "raft": "r", "http": "h"}})
    return state


def test_a_restored_topic_keeps_its_id_and_later_topics_get_higher_ones() -> None:
    state = metadata_with_nodes(1)
    restore = {"topic_id": 7, "next_offsets": [120, 0]}
    created = state.apply(
        {"op": "create_topic", "name": "a", "replicas": [[1], [1]], "restore": restore}
    )
    assert created["topic_id"] == 7 and state.topics["a"].restored_at == (120, 0)
    assert state.apply({"op": "create_topic", "name": "b", "replicas": [[1]]})["topic_id"] == 8
    assert state.topics["b"].restored_at == ()


@pytest.mark.parametrize(
    "restore",
    [
        {"topic_id": 0, "next_offsets": [1]},
        {"topic_id": 3, "next_offsets": [1, 2]},
        {"topic_id": 3},
    ],
)
def test_a_restore_point_per_partition_and_a_topic_id_are_required(restore: dict) -> None:
    state = metadata_with_nodes(1)
    with pytest.raises(MetadataError):
        state.apply({"op": "create_topic", "name": "a", "replicas": [[1]], "restore": restore})
    assert "a" not in state.topics


async def test_the_restore_command_rebuilds_topics_over_http(
    nodes: list[NodeConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    _, uploaded, documents = await written_and_uploaded(nodes, "clicks", 80)
    brokers = await start_all(nodes)
    http = TestClient(TestServer(create_app(brokers[0], self_http=nodes[0].http)))
    await http.start_server()
    try:
        url = str(http.make_url("")).rstrip("/")
        assert await asyncio.to_thread(cli.main, ["restore", "--url", url]) == 0
        table = capsys.readouterr().out
        starts = ",".join(str(d["next_offset"]) for d in documents)
        assert "clicks" in table and starts in table and "restored" in table
        assert await read_all(await leader(brokers, "clicks", 1), "clicks", 1) == uploaded[1]
        again = await http.post("/v1/restore", json={"topics": ["clicks"]})
        assert (await again.json())["topics"][0]["reason"] == "topic_exists"
    finally:
        await http.close()
        await stop_all(brokers)


async def test_the_restore_endpoint_refuses_a_malformed_body(tmp_path: Path) -> None:
    async with serving(tmp_path) as (http, _):
        reply = await http.post("/v1/restore", json={"topics": "all"})
        assert reply.status == 400
        assert (await reply.json())["error"]["code"] == "invalid_request"
        reply = await http.post("/v1/restore", json={})
        assert reply.status == 400 and "--s3-endpoint" in await reply.text()
