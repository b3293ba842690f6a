"""Specification of availability accounting: fault windows, success shares and recovery time."""

from __future__ import annotations

import pytest

from raftline.chaos.availability import (
    BASELINE_S,
    BASELINE_SKIP_S,
    GRACE_S,
    NS,
    FaultWindow,
    availability,
    fault_windows,
    majority_connected,
    throughput_ratios,
    timeline,
)
from raftline.chaos.history import NEMESIS, Op, index_ops
from raftline.chaos.linearizability import check_topics
from raftline.chaos.report import summary_text


def nemesis(f: str, at_s: float, fault: str = "partition") -> list[Op]:
    value = {"fault": fault}
    t = int(at_s * NS)
    return [Op(NEMESIS, "invoke", f, value, time=t), Op(NEMESIS, "ok", f, value, time=t)]


def send(
    process: int, at_s: float, outcome: str, took_s: float = 0.1, key: str = "t/0"
) -> list[Op]:
    start, end = int(at_s * NS), int((at_s + took_s) * NS)
    value = {"key": key, "value": process}
    return [
        Op(process, "invoke", "send", value, time=start),
        Op(process, outcome, "send", value, time=end),
    ]  # type: ignore[arg-type]


def faulty_run() -> list[Op]:
    return index_ops(
        send(1, 0.0, "ok")
        + nemesis("start", 1.0)
        + send(1, 2.0, "fail")
        + send(2, 3.0, "info")
        + nemesis("stop", 4.0)
        + send(1, 4.5, "fail")
        + send(1, 5.0, "ok", took_s=0.5)
    )


def test_start_and_stop_of_a_fault_make_one_window() -> None:
    (window,) = fault_windows(faulty_run())
    assert (window.fault, window.start, window.end) == ("partition", 1 * NS, 4 * NS)


def test_success_share_is_split_by_fault_window() -> None:
    result = availability(faulty_run())
    assert result["during_faults"] == {"ops": 2, "ok": 0, "ok_share": 0.0}
    assert result["after_faults"] == {"ops": 2, "ok": 1, "ok_share": 0.5}
    assert result["overall"]["ops"] == 5


def test_recovery_time_runs_from_heal_to_success_invoked_after_it() -> None:
    (fault,) = availability(faulty_run())["faults"]
    assert fault["recovery_s"] == 1.5


def test_recovery_waits_for_the_slowest_partition() -> None:
    ops = index_ops(
        nemesis("start", 1.0)
        + nemesis("stop", 2.0)
        + send(1, 2.0, "ok", took_s=0.5, key="t/0")
        + send(2, 2.0, "fail", key="t/1")
        + send(2, 3.0, "ok", took_s=1.0, key="t/1")
    )
    assert availability(ops)["faults"][0]["recovery_s"] == 2.0


def test_partition_without_success_after_heal_means_not_recovered() -> None:
    ops = index_ops(
        nemesis("start", 1.0)
        + nemesis("stop", 2.0)
        + send(1, 2.0, "ok", key="t/0")
        + send(2, 2.0, "fail", key="t/1")
    )
    assert availability(ops)["faults"][0]["recovery_s"] is None


def test_fault_never_healed_has_no_recovery_time() -> None:
    ops = index_ops(nemesis("start", 1.0) + send(1, 2.0, "ok"))
    assert availability(ops)["faults"][0]["recovery_s"] is None


def test_timeline_counts_outcomes_and_latency_per_second() -> None:
    rows = {row["t"]: row for row in timeline(faulty_run())}
    assert rows[5.0]["ok"] == 1
    assert rows[5.0]["p50_ms"] == 500.0
    assert rows[2.0]["fail"] == 1


def test_fault_that_failed_to_inject_is_counted_not_windowed() -> None:
    failed = [
        Op(NEMESIS, "invoke", "start", {"fault": "clock"}, time=1),
        Op(NEMESIS, "fail", "start", {"fault": "clock"}, time=2, error="404"),
    ]
    result = availability(index_ops(failed))
    assert result["not_injected"] == {"clock": 1}
    assert result["faults"] == []


def partition_window(sees: dict[int, list[int]]) -> FaultWindow:
    return FaultWindow("partition", 0, NS, {"fault": "partition", "sees": sees})


def test_a_partition_into_halves_leaves_a_connected_majority() -> None:
    three, two = [1, 2, 3], [4, 5]
    sees = {n: three for n in three} | {n: two for n in two}
    assert majority_connected(partition_window(sees))


def test_a_ring_partition_leaves_no_connected_majority() -> None:
    ring = [1, 2, 3, 4, 5]
    sees = {n: [ring[(i + d) % 5] for d in (-1, 0, 1)] for i, n in enumerate(ring)}
    assert not majority_connected(partition_window(sees))


def acked_writes(f: str, from_s: float, to_s: float, per_s: int) -> list[Op]:
    ops: list[Op] = []
    for i in range(int((to_s - from_s) * per_s)):
        t = int((from_s + i / per_s) * NS)
        ops += [Op(1, "invoke", f, {}, time=t), Op(1, "ok", f, {}, time=t + 1)]
    return ops


def acked_sends(from_s: float, to_s: float, per_s: int) -> list[Op]:
    return acked_writes("send", from_s, to_s, per_s)


def test_throughput_ratio_compares_acked_sends_after_the_grace_period_with_before() -> None:
    # 100/s before; nothing for the grace period after the fault at 10 s; then 60/s.
    ops = index_ops(
        acked_sends(0.0, 10.0, 100)
        + nemesis("start", 10.0)
        + acked_sends(10.0 + GRACE_S, 20.0, 60)
        + nemesis("stop", 20.0)
    )
    (row,) = throughput_ratios(ops)
    assert row["before_per_s"] == pytest.approx(100, rel=0.02)
    assert row["during_per_s"] == pytest.approx(60, rel=0.02)
    assert row["meets_target"] is False
    assert availability(ops)["throughput_target_met"] is False


def test_throughput_within_target_when_the_rate_holds_after_the_grace_period() -> None:
    ops = index_ops(
        acked_sends(0.0, 10.0, 100)
        + nemesis("start", 10.0)
        + acked_sends(10.0 + GRACE_S, 20.0, 80)
        + nemesis("stop", 20.0)
    )
    assert throughput_ratios(ops)[0]["meets_target"] is True
    assert availability(ops)["throughput_target_met"] is True


def test_a_placebo_window_is_measured_as_a_control_but_never_judged() -> None:
    ops = index_ops(
        acked_sends(0.0, 10.0, 100)
        + nemesis("start", 10.0, fault="none")
        + acked_sends(10.0 + GRACE_S, 20.0, 30)
        + nemesis("stop", 20.0, fault="none")
    )
    (row,) = throughput_ratios(ops)
    assert row["control"] is True
    assert row["ratio"] == pytest.approx(0.3, rel=0.05)
    assert row["meets_target"] is None
    summary = availability(ops)
    assert summary["throughput_target_met"] is True
    assert summary["control_ratio_min"] == row["ratio"]


@pytest.mark.parametrize("f", ["txn-send", "publish"])
def test_the_transactions_and_route_workloads_acknowledged_writes_make_the_throughput(
    f: str,
) -> None:
    ops = index_ops(
        acked_writes(f, 0.0, 10.0, 50)
        + nemesis("start", 10.0)
        + acked_writes(f, 10.0 + GRACE_S, 20.0, 40)
        + nemesis("stop", 20.0)
    )
    (row,) = throughput_ratios(ops)
    assert row["before_per_s"] == pytest.approx(50, rel=0.02)
    assert row["during_per_s"] == pytest.approx(40, rel=0.02)
    assert row["meets_target"] is True
    assert sum(r["writes_ok"] for r in timeline(ops)) == 50 * 10 + 40 * 8


def test_reads_and_transaction_ends_are_no_acknowledged_writes() -> None:
    ops = index_ops(acked_writes("txn-end", 0.0, 2.0, 10) + acked_writes("poll", 0.0, 2.0, 10))
    assert sum(r["writes_ok"] for r in timeline(ops)) == 0


def keyed_sends(key: str, from_s: float, to_s: float, per_s: int) -> list[Op]:
    ops: list[Op] = []
    for i in range(int((to_s - from_s) * per_s)):
        t = int((from_s + i / per_s) * NS)
        value = {"key": key, "value": i}
        ops += [Op(1, "invoke", "send", value, time=t), Op(1, "ok", "send", value, time=t + 1)]
    return ops


def one_partition_slowed() -> list[Op]:
    # t/0 falls from 50/s to 5/s after the fault at 10 s, t/1 keeps its 50/s: 55 of 100 is 0.55.
    return index_ops(
        keyed_sends("t/0", 0.0, 10.0, 50)
        + keyed_sends("t/1", 0.0, 20.0, 50)
        + nemesis("start", 10.0)
        + keyed_sends("t/0", 10.0 + GRACE_S, 20.0, 5)
        + nemesis("stop", 20.0)
    )


def test_each_window_gives_every_partitions_own_rates() -> None:
    (row,) = throughput_ratios(one_partition_slowed())
    before_0, during_0 = row["by_partition_per_s"]["t/0"]
    before_1, during_1 = row["by_partition_per_s"]["t/1"]
    assert (before_0, during_0) == (pytest.approx(50, rel=0.02), pytest.approx(5, rel=0.05))
    assert (before_1, during_1) == (pytest.approx(50, rel=0.02), pytest.approx(50, rel=0.02))


def test_each_window_gives_the_spans_its_rates_are_taken_over() -> None:
    (row,) = throughput_ratios(one_partition_slowed())
    # The baseline starts BASELINE_SKIP_S after the first acknowledged send, as after a heal.
    assert (row["baseline_s"], row["judged_s"]) == (10.0 - BASELINE_SKIP_S, 10.0 - GRACE_S)


def test_the_summary_prints_every_window_and_the_partitions_of_a_miss() -> None:
    ops = one_partition_slowed()
    text = summary_text(
        {
            "valid": True,
            "metadata_linearizability": check_topics(ops),
            "availability": availability(ops),
        }
    )
    assert "ratio 0.55" in text and "over 8.0 s against" in text
    assert "per partition, before -> during (/s): t/0 50.0 -> 5.0, t/1 50.0 -> 50.0" in text


def test_the_baseline_is_the_quiet_time_of_the_seconds_before_the_fault() -> None:
    # 100/s throughout but for a burst of 300/s in the 4 s before fault B. The quiet gap since
    # fault A's heal alone (35-40 s) gave 260/s and a ratio of 0.38; the quiet time of the 30 s
    # before B (10-30 s and 35-40 s: not A, nor the 2 s after its heal) gives 132/s.
    ops = index_ops(
        acked_sends(0.0, 36.0, 100)
        + acked_sends(36.0, 40.0, 300)
        + nemesis("start", 30.0)
        + nemesis("stop", 33.0)
        + nemesis("start", 40.0)
        + acked_sends(40.0, 50.0, 100)
        + nemesis("stop", 50.0)
    )
    row = throughput_ratios(ops)[1]
    assert BASELINE_S == 30.0
    assert row["baseline_s"] == pytest.approx(25.0)
    assert row["before_per_s"] == pytest.approx((20 * 100 + 1 * 100 + 4 * 300) / 25, rel=0.02)
    assert row["meets_target"] is True


def test_fault_time_and_the_recovery_after_a_heal_are_no_baseline() -> None:
    # 100/s when quiet, 10/s during fault A and the 2 s after its heal: B's baseline is 100/s.
    ops = index_ops(
        acked_sends(0.0, 10.0, 100)
        + nemesis("start", 10.0)
        + acked_sends(10.0, 20.0 + BASELINE_SKIP_S, 10)
        + nemesis("stop", 20.0)
        + acked_sends(20.0 + BASELINE_SKIP_S, 30.0, 100)
        + nemesis("start", 30.0)
        + acked_sends(30.0, 40.0, 100)
        + nemesis("stop", 40.0)
    )
    row = throughput_ratios(ops)[1]
    assert row["before_per_s"] == pytest.approx(100, rel=0.02)
    assert row["baseline_s"] == pytest.approx(8.0 + 8.0)
