"""bench.commit_calls: the in-process count of what one RF 3 one-message produce costs."""

from __future__ import annotations

from pathlib import Path

from bench.commit_calls import measure, measure_per_node


async def test_a_short_probe_counts_calls_and_cpu_per_message_and_names_the_costliest(
    tmp_path: Path,
) -> None:
    result = await measure(tmp_path, messages=20, size=100, top=5)
    assert result["messages"] == 20
    # A message crosses three brokers' driver, transport and storage code: hundreds of calls.
    assert result["python_calls_per_msg"] > 100
    assert result["cpu_us_per_msg"] > 0
    assert len(result["top_self_time"]) == 5
    assert all(row["calls_per_msg"] > 0 for row in result["top_self_time"])


def test_per_node_counts_the_leader_and_each_follower_apart(tmp_path: Path) -> None:
    result = measure_per_node(tmp_path, messages=20, size=100, top=5)
    # The leader proposes, replicates and commits; a follower only appends and answers.
    assert result["leader_calls_per_msg"] > max(result["follower_calls_per_msg"]) > 50
    assert len(result["follower_calls_per_msg"]) == 2
    assert result["leader_loop_cpu_us_per_msg"] > 0
    assert len(result["leader_top_self_time"]) == 5
