"""bench.fsync_tail: the plain fsync probe replays a node's write pattern, the stage summary reads
the nodes' histograms, and the wake-up ring times idle hand-offs."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from bench.fsync_tail import WritePattern, _probe_writer, stage_summary
from bench.wakeup_ring import ring_tail
from raftline.node.stages import BUCKETS_S, STAGES


def test_bytes_per_fsync_is_bytes_appended_over_fsyncs() -> None:
    assert WritePattern(fsyncs_per_s=100, bytes_per_s=50_000_000).bytes_per_fsync == 500_000


def test_probe_syncs_at_the_given_rate_and_leaves_no_files(tmp_path: Path) -> None:
    sync_us, late_us = _probe_writer(str(tmp_path), 4, 200.0, 4096, 0.5)
    assert 80 <= len(sync_us) <= 110  # 200 fsyncs/s for 0.5 s, spread over 4 threads
    assert len(late_us) == len(sync_us)
    # from the intended start is never shorter than the fdatasync alone
    assert sum(late_us) >= sum(sync_us)
    assert list(tmp_path.iterdir()) == []


def test_stage_summary_gives_the_bucket_bounds_of_p50_and_p99_within_the_window() -> None:
    empty = {stage: [0] * (len(BUCKETS_S) + 1) for stage in STAGES}
    before = {stage: list(counts) for stage, counts in empty.items()}
    before["commit"] = [5] * (len(BUCKETS_S) + 1)  # observed before the window: left out
    after = {stage: list(counts) for stage, counts in before.items()}
    # 100 commits in the window: 98 under 2 ms, 2 between 0.2 and 0.3 s (cumulative counts)
    two_ms, three_tenths = BUCKETS_S.index(0.002), BUCKETS_S.index(0.3)
    window = [
        0 if i < two_ms else 98 if i < three_tenths else 100 for i in range(len(BUCKETS_S) + 1)
    ]
    after["commit"] = [b + w for b, w in zip(before["commit"], window, strict=True)]
    summary = stage_summary(before, after)
    assert summary == {"commit": {"count": 100, "p50": 2.0, "p99": 300.0}}


def test_the_wake_up_ring_times_every_lap_and_leaves_no_relay_running() -> None:
    result = ring_tail(laps_per_s=100, seconds=0.5, hops=3)
    assert 40 <= result["lap_ms"]["count"] <= 51
    assert result["lap_ms"]["p50"] > 0
    assert multiprocessing.active_children() == []
