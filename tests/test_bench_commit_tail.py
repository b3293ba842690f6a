"""bench.commit_tail: the low-rate RF 3 commit probe's figures."""

from __future__ import annotations

from pathlib import Path

from bench.commit_tail import COUNTERS, quantiles_ms, run


def test_quantiles_are_taken_at_their_rank_in_milliseconds() -> None:
    samples = [i / 1000 for i in range(1, 1001)]  # 1..1000 ms, given in reverse below
    assert quantiles_ms(list(reversed(samples))) == {
        "p50": 501.0,
        "p99": 991.0,
        "p999": 1000.0,
        "max": 1000.0,
    }


def test_a_short_run_times_every_message_and_reads_the_stages_and_counters(
    tmp_path: Path,
) -> None:
    result = run(rate=50, seconds=1, partitions=2, size=100, flags={}, root=tmp_path)
    assert result["messages"] == 50
    assert 0 < result["ack_ms"]["p50"] <= result["ack_ms"]["max"]
    assert result["stages_ms"]["produce"]["count"] == 50  # leaders timed each acks=all write
    assert set(COUNTERS) <= set(result)
    assert result["fsyncs"] > 0


def test_one_at_a_time_gives_each_message_its_own_write_and_takes_off_the_idle_cpu(
    tmp_path: Path,
) -> None:
    result = run(
        rate=50, seconds=1, partitions=2, size=100, flags={}, root=tmp_path, one_at_a_time=True
    )
    assert result["rate"] == "one at a time"
    assert result["messages"] > 0
    assert result["fsyncs"] >= result["messages"]  # no message shared a write with another
    assert result["idle_node_cpu_pct"] > 0
    assert result["node_cpu_us_per_msg_net"] < result["node_cpu_us_per_msg"]
