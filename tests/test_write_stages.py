"""Per-stage timings of the replicated write path: what nodes record, and how /metrics shows it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from inproc_harness import http_cluster
from test_node_cluster import batch_of, leader_of, led_topic, produce_anywhere

from raftline.clients.client import AsyncClient
from raftline.node.broker import Broker
from raftline.node.stages import BUCKETS_S, METRIC, LatencyHistogram, StageTimes

pytestmark = pytest.mark.timeout(120)


def counts(broker: Broker) -> dict[str, int]:
    return {s: h.count for s, h in broker.runtime.stage_times.histograms.items()}


def test_an_observation_lands_in_the_first_bucket_whose_bound_holds_it() -> None:
    histogram = LatencyHistogram()
    histogram.observe(0.004)
    histogram.observe(0.005)
    histogram.observe(60.0)
    assert histogram.counts[BUCKETS_S.index(0.005)] == 2
    assert histogram.counts[-1] == 1  # beyond the last bound: +Inf only
    assert histogram.count == 3 and histogram.sum == pytest.approx(60.009)


def test_metrics_lines_are_a_prometheus_histogram_with_cumulative_buckets() -> None:
    times = StageTimes()
    times.observe("commit", 0.0004)
    times.observe("commit", 0.012)
    lines = times.metrics_lines(7)
    assert f"# TYPE {METRIC} histogram" in lines
    assert f'{METRIC}_bucket{{node="7",stage="commit",le="0.0005"}} 1' in lines
    assert f'{METRIC}_bucket{{node="7",stage="commit",le="0.015"}} 2' in lines
    assert f'{METRIC}_bucket{{node="7",stage="commit",le="+Inf"}} 2' in lines
    assert f'{METRIC}_count{{node="7",stage="commit"}} 2' in lines
    assert f'{METRIC}_count{{node="7",stage="fetch_wait"}} 0' in lines


async def test_an_acked_produce_is_timed_on_the_leader_and_on_its_followers(
    cluster: list[Broker],
) -> None:
    leader = await led_topic(cluster, "timed")
    followers = [b for b in cluster if b is not leader]
    before = {b.node_id: counts(b) for b in cluster}
    await leader.produce("timed", 0, batch_of(b"a", b"b"), "all")
    after = counts(leader)
    for stage in ("produce", "propose_wait", "commit", "ack_wait", "leader_write"):
        assert after[stage] > before[leader.node_id][stage], stage
    # The followers' acks made the commit: each wrote and fsynced the entry first.
    assert any(
        counts(f)["follower_persist"] > before[f.node_id]["follower_persist"] for f in followers
    )
    assert 'stage="commit"' in leader.metrics_text()


async def test_a_writes_disk_hand_offs_are_timed_apart_from_its_fsyncs(
    cluster: list[Broker],
) -> None:
    leader = await led_topic(cluster, "handed")
    before = counts(leader)
    await leader.produce("handed", 0, batch_of(b"a"), "all")
    # The ack may come before the leader's own write returns (it applies once the followers'
    # copies are durable and its own is written): wait for that write, then look.
    stages = ("disk_queue", "fsync_call", "disk_return")
    for _ in range(100):
        if all(counts(leader)[s] > before[s] for s in stages):
            break
        await asyncio.sleep(0.05)
    after = counts(leader)
    for stage in stages:
        assert after[stage] > before[stage], stage


async def test_a_long_poll_that_a_commit_releases_is_timed(cluster: list[Broker]) -> None:
    await cluster[0].create_topic("polled", 1, 3, {})
    end = await produce_anywhere(cluster, "polled", batch_of(b"first")) + 1
    leader = leader_of(cluster, "polled")
    before = counts(leader)["fetch_wait"]
    poll = asyncio.ensure_future(leader.fetch("polled", 0, end, 1 << 20, 5000))
    await asyncio.sleep(0.1)
    await leader.produce("polled", 0, batch_of(b"second"), "all")
    await asyncio.wait_for(poll, 2)
    assert counts(leader)["fetch_wait"] == before + 1


async def test_the_tick_timer_records_how_late_it_fired(cluster: list[Broker]) -> None:
    lag = cluster[0].runtime.stage_times.histograms["loop_lag"]
    before = lag.count
    await asyncio.sleep(3 * cluster[0].config.tick_ms / 1000)
    assert lag.count > before


async def test_a_produce_sent_to_a_follower_counts_as_forwarded(tmp_path: Path) -> None:
    async with http_cluster(tmp_path, 3) as cluster:
        brokers = cluster.brokers
        leader = await led_topic(brokers, "routed")
        index = next(i for i, b in enumerate(brokers) if b is not leader)
        follower = brokers[index]
        async with AsyncClient(cluster.urls[index]) as client:
            await client.produce_batch("routed", 0, [b"x"], url=cluster.urls[index])
        assert follower.counters["forwarded_requests"] == 1
        assert leader.counters["forwarded_requests"] == 0
