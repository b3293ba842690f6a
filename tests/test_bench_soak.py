"""Sustained runs: the per-second timeline, the sustained-max rule, the byte cap that ends a
soak, the plain-file yardstick and the host sampler."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.__main__ import parser
from bench.host_samples import HostSampler, YardstickPlan, plain_file_writer
from bench.pacing import NS_PER_S, Window
from bench.soak import TimelineTally, default_workload, quick_rate, sustained_rate
from bench.soak_report import MB, server_cpu


def _points(rates: list[int]) -> list[dict[str, float]]:
    return [{"t": t, "msgs_per_s": r} for t, r in enumerate(rates)]


def test_sustained_rate_is_the_mean_of_the_second_half() -> None:
    assert sustained_rate(_points([900, 800, 300, 310, 290, 300])) == 300


def test_quick_rate_is_what_a_quick_window_on_a_fresh_node_sees() -> None:
    assert quick_rate(_points([100, 900, 800, 700, 300, 300])) == 800


def test_the_timeline_counts_acknowledgements_and_latency_per_second() -> None:
    tally = TimelineTally(Window(0, 3 * NS_PER_S))
    tally.on_acked([(0, 10)], 500_000_000)  # 0.5 s after it was due
    tally.on_acked([(1_000_000_000, 5)], 1_001_000_000)  # 1 ms
    points = tally.timeline(message_size=1000)
    assert [p["msgs_per_s"] for p in points] == [10, 5]
    assert points[0]["p99_ms"] >= 499 and points[1]["p50_ms"] <= 1.1
    assert points[0]["mb_per_s"] == 0.01


def test_reaching_the_byte_cap_ends_the_window_and_so_the_producers() -> None:
    tally = TimelineTally(Window(0, 300 * NS_PER_S), cap_messages=20)
    tally.on_acked([(0, 10)], NS_PER_S)
    assert tally.window.end_ns == 300 * NS_PER_S
    tally.on_acked([(0, 10)], 2 * NS_PER_S)
    assert tally.window.end_ns == 2 * NS_PER_S


def test_the_yardstick_writes_rolls_and_removes_its_files(tmp_path: Path) -> None:
    plan = YardstickPlan(
        seconds=30, max_bytes=12 << 20, write_bytes=1 << 20, file_bytes=4 << 20, keep_files=2
    )
    directory = tmp_path / "yardstick"
    per_second = plain_file_writer(directory, plan)
    assert sum(per_second) > 0
    assert not directory.exists()


def test_the_sampler_reports_page_cache_and_the_servers_memory() -> None:
    sampler = HostSampler({os.getsid(0)}, interval_s=0.05).start()
    time.sleep(0.3)
    samples = sampler.stop()
    assert len(samples) >= 2
    assert {"Dirty", "Writeback", "server_rss_mb", "load_1m"} <= set(samples[-1])
    assert samples[-1]["server_rss_mb"] > 0  # this test's own session holds this process


def test_the_soak_defaults_are_five_minutes_and_both_fixed_rates() -> None:
    args = parser().parse_args(["soak"])
    assert args.seconds >= 300
    assert [float(f) for f in args.fractions] == [0.5, 0.8]
    assert args.client == "native"
    assert default_workload().warmup_seconds == 0


def test_server_cpu_is_the_second_half_mean_and_its_cost_per_mb() -> None:
    run = {"started_s": 10.0, "duration_s": 20.0, "sustained_msgs_per_s": 50, "message_size": MB}
    host = [
        {"t": 12.0, "server_cpu_pct": 90.0},  # first half: not counted
        {"t": 21.0, "server_cpu_pct": 20.0},
        {"t": 29.0, "server_cpu_pct": 30.0},
        {"t": 31.0, "server_cpu_pct": 90.0},  # after the run
        {"t": 25.0},  # the sampler's first sample has no CPU figure
    ]
    assert server_cpu(run, host) == (25.0, 5.0)  # 25% of a core for 50 MB/s: 5 ms per MB
    assert server_cpu(run, []) is None
