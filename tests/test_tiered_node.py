"""Tiered storage through a real broker against a real SeaweedFS: uploads, local trimming after
the manifest is durable, reads from offset 0 identical to local ones, outages, config refusals."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from inproc_harness import configs, start_all, wait_for
from seaweedfs import SeaweedServer, running_seaweedfs

from raftline.node.broker import Broker, BrokerError
from raftline.raftlog.records import Record, build_batch, decode_batch
from raftline.tiered.store import ObjectStore, S3Config

_prefixes = (f"t{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    with running_seaweedfs(Path(tmp_path_factory.mktemp("weed"))) as server:
        yield server


@pytest.fixture(scope="module")
def bucket(seaweed: SeaweedServer) -> str:
    return seaweed.create_bucket()


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
