"""The node's wall clock with its test offset (and what follows it), and injected link faults."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from inproc_harness import configs, start_all
from test_node_cluster import batch_of

from raftline.node.clock import WallClock
from raftline.node.netfaults import LinkFaults


def test_clock_without_offset_reads_real_wall_time() -> None:
    before = time.time_ns() // 1_000_000
    now = WallClock().now_ms()
    assert before <= now <= time.time_ns() // 1_000_000


def test_clock_offset_shifts_wall_time_and_zero_restores_it() -> None:
    clock = WallClock()
    clock.set_offset_ms(3_600_000)
    real = time.time_ns() // 1_000_000
    assert 3_600_000 <= clock.now_ms() - real < 3_601_000
    clock.set_offset_ms(0)
    assert abs(clock.now_ms() - time.time_ns() // 1_000_000) < 1_000


@pytest.mark.parametrize("offset", ["5", 1.5, True, None, 10**15])
def test_clock_rejects_offsets_that_are_not_plausible_integers(offset: object) -> None:
    clock = WallClock()
    with pytest.raises(ValueError):
        clock.set_offset_ms(offset)
    assert clock.offset_ms == 0


@pytest.mark.parametrize("body", [{}, {"delay_ms": 0}, {"delay_ms": 0, "duplicate": 0.5}])
def test_an_empty_body_or_zero_delay_clears_link_faults(body: dict[str, object]) -> None:
    assert LinkFaults.parse(body) is None


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"delay_ms": -1},
        {"delay_ms": "10"},
        {"delay_ms": 10, "jitter_ms": 11},
        {"delay_ms": 10, "reorder": 2},
        {"delay_ms": 10, "peers": [1, "2"]},
        {"delay_ms": 10, "loss": 0.1},
        {"delay_ms": 10**9},
    ],
)
def test_bad_link_fault_bodies_are_rejected(body: object) -> None:
    with pytest.raises(ValueError):
        LinkFaults.parse(body)


def test_link_faults_limited_to_peers_leave_other_peers_alone() -> None:
    faults = LinkFaults.parse({"delay_ms": 10, "peers": [2]})
    assert faults is not None
    assert faults.applies_to(2) and not faults.applies_to(3)


def test_held_frames_wait_delay_plus_or_minus_jitter() -> None:
    faults = LinkFaults(delay_ms=100, jitter_ms=40)
    rng = random.Random(1)
    delays = [d for _ in range(500) for d in faults.send_delays_s(rng, may_duplicate=True)]
    assert len(delays) == 500  # duplicate is 0: one copy each
    assert all(0.06 <= d <= 0.14 for d in delays)
    assert max(delays) - min(delays) > 0.06  # jitter spreads them: later frames can overtake


def test_reordered_frames_skip_the_wait() -> None:
    faults = LinkFaults(delay_ms=100, reorder=1.0)
    assert faults.send_delays_s(random.Random(2), may_duplicate=False) == [0.0]


def test_duplicated_frames_are_sent_twice_unless_the_frame_may_not_be_duplicated() -> None:
    faults = LinkFaults(delay_ms=50, duplicate=1.0)
    rng = random.Random(3)
    assert len(faults.send_delays_s(rng, may_duplicate=True)) == 2
    assert len(faults.send_delays_s(rng, may_duplicate=False)) == 1


async def test_time_retention_follows_the_skewed_wall_clock(tmp_path: Path) -> None:
    (config,) = configs(tmp_path, 1)
    (broker,) = await start_all([config])
    try:
        await broker.create_topic("aged", 1, 1, {"retention.ms": "600000", "segment.bytes": "1024"})
        for i in range(12):  # ~300 bytes each: several sealed segments
            await broker.produce("aged", 0, batch_of(b"%d" % i + b"x" * 300), "all")
        group = broker.meta.state.topics["aged"].group(0)
        storage = broker.runtime.groups[group].storage
        kept = storage.retention_point()
        broker.clock.set_offset_ms(3_600_000)  # an hour on: every sealed segment is past 10 min
        assert storage.retention_point() > kept
        broker.clock.set_offset_ms(0)
        assert storage.retention_point() == kept
    finally:
        await broker.stop()
