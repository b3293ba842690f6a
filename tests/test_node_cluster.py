"""In-process clusters of brokers on loopback: elections, replication, failover, restart.

Several Broker objects share one event loop; each has its own data dir and Raft port.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from inproc_harness import configs, start_all, wait_for

from raftline.node.broker import Broker, BrokerError, NotLeader
from raftline.raftlog.records import (
    RAFT_NOOP,
    Record,
    build_batch,
    build_control_batch,
    iter_batches,
)

pytestmark = pytest.mark.timeout(120)


def values(batches: list[bytes]) -> list[bytes]:
    return [
        r.value or b""
        for decoded in iter_batches(b"".join(batches))
        if not decoded.header.is_control
        for r in decoded.records
    ]


def batch_of(*payloads: bytes) -> bytes:
    return build_batch([Record(p) for p in payloads])


async def produce_anywhere(
    brokers: list[Broker], topic: str, batch: bytes, partition: int = 0
) -> int:
    """Produce on whichever broker leads the partition, retrying through elections."""
    deadline = time.monotonic() + 15
    while True:
        for broker in brokers:
            try:
                return await broker.produce(topic, partition, batch, "all")
            except BrokerError as exc:
                if not exc.retryable and not isinstance(exc, NotLeader):
                    raise
        if time.monotonic() > deadline:
            raise AssertionError("no broker accepted the write")
        await asyncio.sleep(0.02)


def leading(brokers: list[Broker], topic: str) -> Broker | None:
    group = brokers[0].meta.state.topics[topic].group(0)
    return next(
        (
            b
            for b in brokers
            if group in b.runtime.groups and b.runtime.groups[group].role == "leader"
        ),
        None,
    )


def leader_id(brokers: list[Broker], topic: str) -> int | None:
    leader = leading(brokers, topic)
    return None if leader is None else leader.node_id


def leader_of(brokers: list[Broker], topic: str) -> Broker:
    leader = leading(brokers, topic)
    assert leader is not None, f"no leader for {topic}/0"
    return leader


async def led_topic(brokers: list[Broker], topic: str) -> Broker:
    """A 1-partition RF 3 topic with one write committed: its leader, elected and serving."""
    await brokers[0].create_topic(topic, 1, 3, {})
    await produce_anywhere(brokers, topic, batch_of(b"warm"))
    return leader_of(brokers, topic)


async def test_three_nodes_elect_one_controller_and_register_every_node(
    cluster: list[Broker],
) -> None:
    views = [await b.cluster() for b in cluster]
    controllers = {v["controller"] for v in views}
    assert len(controllers) == 1 and controllers.pop() in (1, 2, 3)
    assert all(sorted(n["id"] for n in v["nodes"]) == [1, 2, 3] for v in views)
    assert len({v["cluster_id"] for v in views}) == 1


async def test_created_topic_is_replicated_to_three_nodes_and_visible_everywhere(
    cluster: list[Broker],
) -> None:
    description = await cluster[1].create_topic("orders", 3, 3, {"retention.ms": "60000"})
    assert [p["replicas"] for p in description["partitions"]] != []
    assert all(sorted(p["replicas"]) == [1, 2, 3] for p in description["partitions"])
    leaders = sorted(p["replicas"][0] for p in description["partitions"])
    assert leaders == [1, 2, 3]  # preferred leaders spread evenly
    for broker in cluster:
        assert (await broker.list_topics()) == [
            {"name": "orders", "partitions": 3, "replication_factor": 3}
        ]


async def test_concurrent_topic_reads_on_every_node_are_all_answered(
    cluster: list[Broker],
) -> None:
    # Each describe is a read barrier on the metadata group; every node numbers its own, so
    # the metadata leader holds reads of the same number from several nodes at once.
    await cluster[0].create_topic("orders", 1, 3, {})
    reads = [broker.describe_topic("orders") for broker in cluster for _ in range(4)]
    descriptions = await asyncio.wait_for(asyncio.gather(*reads), 10)
    assert {d["name"] for d in descriptions} == {"orders"}


async def test_acks_all_produce_is_fetched_from_the_committed_log(cluster: list[Broker]) -> None:
    await cluster[0].create_topic("events", 1, 3, {})
    first = await produce_anywhere(cluster, "events", batch_of(b"a", b"b", b"c"))
    second = await produce_anywhere(cluster, "events", batch_of(b"d"))
    assert second == first + 3  # one batch takes consecutive offsets
    leader = leader_of(cluster, "events")
    batches, log_start, high_watermark = await leader.fetch("events", 0, 0, 1 << 20, 0)
    assert values(batches) == [b"a", b"b", b"c", b"d"]
    assert log_start == 0 and high_watermark == second + 1


async def test_follower_answers_not_leader_with_the_leaders_http_address(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("routed", 1, 3, {})
    await produce_anywhere(cluster, "routed", batch_of(b"x"))
    leader = leader_of(cluster, "routed")
    follower = next(b for b in cluster if b is not leader)
    with pytest.raises(NotLeader) as caught:
        await follower.produce("routed", 0, batch_of(b"y"), "all")
    assert caught.value.leader_http == leader.config.http


async def test_long_poll_fetch_wakes_when_a_write_commits(cluster: list[Broker]) -> None:
    await cluster[0].create_topic("poll", 1, 3, {})
    end = await produce_anywhere(cluster, "poll", batch_of(b"first")) + 1
    leader = leader_of(cluster, "poll")
    poll = asyncio.ensure_future(leader.fetch("poll", 0, end, 1 << 20, 5000))
    await asyncio.sleep(0.1)
    assert not poll.done()
    await leader.produce("poll", 0, batch_of(b"second"), "all")
    batches, _, _ = await asyncio.wait_for(poll, 2)
    assert values(batches) == [b"second"]


async def test_partition_leader_loss_moves_writes_to_a_new_leader_without_losing_acked_data(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("failover", 1, 3, {})
    acked = [await produce_anywhere(cluster, "failover", batch_of(b"m%d" % i)) for i in range(5)]
    old = leader_of(cluster, "failover")
    await old.stop()
    survivors = [b for b in cluster if b is not old]
    offset = await produce_anywhere(survivors, "failover", batch_of(b"after"))
    assert offset > acked[-1]
    new = leader_of(survivors, "failover")
    batches, _, _ = await new.fetch("failover", 0, 0, 1 << 20, 0)
    assert values(batches) == [b"m%d" % i for i in range(5)] + [b"after"]
    cluster.remove(old)


async def test_unknown_topic_and_partition_are_reported(cluster: list[Broker]) -> None:
    with pytest.raises(BrokerError) as missing:
        await cluster[0].produce("nope", 0, batch_of(b"x"), "all")
    assert missing.value.code == "unknown_topic"
    await cluster[0].create_topic("small", 1, 1, {})
    with pytest.raises(BrokerError) as partition:
        await cluster[0].fetch("small", 7, 0, 100, 0)
    assert partition.value.code == "unknown_partition"


async def test_restart_of_every_node_keeps_topics_and_messages(tmp_path: Path) -> None:
    cfgs = configs(tmp_path, 3)
    brokers = await start_all(cfgs)
    await brokers[0].create_topic("durable", 2, 3, {})
    for i in range(3):
        await produce_anywhere(brokers, "durable", batch_of(b"v%d" % i))
    for broker in brokers:
        await broker.stop()
    brokers = await start_all(cfgs)
    try:
        assert [t["name"] for t in await brokers[2].list_topics()] == ["durable"]
        await produce_anywhere(brokers, "durable", batch_of(b"after restart"))
        batches, _, _ = await leader_of(brokers, "durable").fetch("durable", 0, 0, 1 << 20, 0)
        assert values(batches) == [b"v0", b"v1", b"v2", b"after restart"]
    finally:
        for broker in brokers:
            await broker.stop()


async def test_single_node_needs_no_peers_and_recovers_after_restart(tmp_path: Path) -> None:
    (cfg,) = configs(tmp_path, 1)
    broker = (await start_all([cfg]))[0]
    await broker.create_topic("solo", 1, 1, {})
    offset = await broker.produce("solo", 0, batch_of(b"kept"), "all")
    await broker.stop()
    broker = (await start_all([cfg]))[0]
    try:
        await wait_for(lambda: leading([broker], "solo") is broker)
        batches, _, high_watermark = await broker.fetch("solo", 0, offset, 1 << 20, 0)
        assert values(batches) == [b"kept"] and high_watermark > offset
    finally:
        await broker.stop()


async def test_idle_groups_go_quiet_and_stop_sending_raft_messages(cluster: list[Broker]) -> None:
    await cluster[0].create_topic("idle", 3, 3, {})
    await produce_anywhere(cluster, "idle", batch_of(b"x"))
    total = sum(len(b.runtime.groups) for b in cluster)
    await wait_for(lambda: sum(b.runtime.quiet_groups() for b in cluster) == total)
    sent = [b.runtime.stats["messages_sent"] for b in cluster]
    await asyncio.sleep(0.5)  # ten ticks
    assert [b.runtime.stats["messages_sent"] for b in cluster] == sent


async def test_a_quiet_partition_elects_a_new_leader_when_its_leaders_node_dies(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("sleepy", 1, 3, {})
    await produce_anywhere(cluster, "sleepy", batch_of(b"before"))
    group = cluster[0].meta.state.topics["sleepy"].group(0)
    await wait_for(lambda: all(b.runtime.groups[group].quiet for b in cluster))
    old = leader_of(cluster, "sleepy")
    await old.stop()
    cluster.remove(old)
    await produce_anywhere(cluster, "sleepy", batch_of(b"after"))
    batches, _, _ = await leader_of(cluster, "sleepy").fetch("sleepy", 0, 0, 1 << 20, 0)
    assert values(batches) == [b"before", b"after"]


async def test_retention_trims_old_segments_and_moves_the_log_start(tmp_path: Path) -> None:
    (cfg,) = configs(tmp_path, 1)
    cfg.retention_check_s = 0.1
    broker = (await start_all([cfg]))[0]
    try:
        config = {"segment.bytes": "1024", "retention.bytes": "1024"}
        await broker.create_topic("short", 1, 1, config)
        for i in range(20):
            await broker.produce("short", 0, batch_of(b"%03d" % i + b"x" * 200), "all")
        replica = broker.partitions[next(iter(broker.partitions))]
        await wait_for(lambda: replica.log_start_offset > 0)
        # Trims come at rolls and at each retention check: wait until one check moved nothing.
        start = -1
        while start != replica.log_start_offset:
            start = replica.log_start_offset
            await asyncio.sleep(3 * cfg.retention_check_s)
        (partition,) = (await broker.describe_topic("short"))["partitions"]
        assert partition["log_start_offset"] == start
        with pytest.raises(BrokerError) as caught:
            await broker.fetch("short", 0, 0, 1 << 20, 0)
        assert caught.value.code == "offset_out_of_range"
        assert caught.value.extra["log_start_offset"] == start
        batches, log_start, _ = await broker.fetch("short", 0, start, 1 << 20, 0)
        assert log_start == start and values(batches)[0].startswith(b"%03d" % (start - 1))
    finally:
        await broker.stop()


async def test_controller_moves_leadership_back_to_the_preferred_replica(tmp_path: Path) -> None:
    cfgs = configs(tmp_path, 3)
    for cfg in cfgs:
        cfg.leader_settle_s = 0.5
    brokers = await start_all(cfgs)
    try:
        description = await brokers[0].create_topic("balanced", 1, 3, {})
        preferred = description["partitions"][0]["replicas"][0]
        await wait_for(lambda: leader_id(brokers, "balanced") == preferred)
        group = brokers[0].meta.state.topics["balanced"].group(0)
        other = next(n for n in (1, 2, 3) if n != preferred)
        brokers[preferred - 1].runtime.transfer_leadership(group, other)
        await wait_for(lambda: leader_id(brokers, "balanced") == other)
        await wait_for(lambda: leader_id(brokers, "balanced") == preferred)
        assert sum(b.counters["leadership_moves"] for b in brokers) >= 1
    finally:
        for broker in brokers:
            await broker.stop()


async def test_produce_refuses_batches_it_must_not_store(tmp_path: Path) -> None:
    broker = (await start_all(configs(tmp_path, 1)))[0]
    try:
        await broker.create_topic("strict", 1, 1, {})
        corrupt = bytearray(batch_of(b"payload"))
        corrupt[-1] ^= 0xFF
        control = build_control_batch(RAFT_NOOP, b"")
        for bad in (bytes(corrupt), control, batch_of(b"a") + batch_of(b"b"), b"junk"):
            with pytest.raises(BrokerError) as caught:
                await broker.produce("strict", 0, bad, "all")
            assert caught.value.code == "invalid_request"
        assert await broker.produce("strict", 0, batch_of(b"fine"), "all") >= 0
    finally:
        await broker.stop()


async def test_deleting_a_topic_removes_its_replicas_everywhere_and_the_name_can_be_reused(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("gone", 2, 3, {})
    await produce_anywhere(cluster, "gone", batch_of(b"old"))
    dirs = [b.config.data_dir / "partitions" for b in cluster]
    await cluster[2].delete_topic("gone")
    await wait_for(lambda: all(not b.partitions for b in cluster))
    await wait_for(lambda: all(not any(d.iterdir()) for d in dirs))
    with pytest.raises(BrokerError) as caught:
        await cluster[1].describe_topic("gone")
    assert caught.value.code == "unknown_topic"
    await cluster[1].create_topic("gone", 1, 3, {})
    await produce_anywhere(cluster, "gone", batch_of(b"new"))
    batches, _, _ = await leader_of(cluster, "gone").fetch("gone", 0, 0, 1 << 20, 0)
    assert values(batches) == [b"new"]


async def test_concurrent_produce_requests_share_appends_and_fsyncs(tmp_path: Path) -> None:
    broker = (await start_all(configs(tmp_path, 1)))[0]
    try:
        await broker.create_topic("busy", 1, 1, {})
        await broker.produce("busy", 0, batch_of(b"warm"), "all")
        before = broker.runtime.stats["fsyncs"]
        offsets = await asyncio.gather(
            *(broker.produce("busy", 0, batch_of(b"m%d" % i, b"n"), "all") for i in range(50))
        )
        assert broker.runtime.stats["fsyncs"] - before < 10
        assert sorted(offsets) == list(range(offsets[0], offsets[0] + 100, 2))
    finally:
        await broker.stop()


async def test_acks_leader_and_acks_none_writes_become_visible(tmp_path: Path) -> None:
    broker = (await start_all(configs(tmp_path, 1)))[0]
    try:
        await broker.create_topic("acks", 1, 1, {})
        assert await broker.produce("acks", 0, batch_of(b"none"), "none") == -1
        offset = await broker.produce("acks", 0, batch_of(b"leader"), "leader")
        await wait_for(
            lambda: broker.partitions[next(iter(broker.partitions))].high_watermark > offset
        )
        batches, _, _ = await broker.fetch("acks", 0, 0, 1 << 20, 0)
        assert values(batches) == [b"none", b"leader"]
    finally:
        await broker.stop()
