"""The comparison report states Raftline/peer ratios, also at like-for-like durability, and
every run in its table."""

import json
from pathlib import Path
from typing import Any

from bench.compare import SYSTEMS
from bench.report import DURABILITY_CLASS, like_for_like_ratios, markdown, ratios, write


def _run(system: str, rate: float, p99: float) -> dict[str, Any]:
    summary = {"p50": p99 / 2, "p99": p99, "p99.9": p99, "max": p99, "mean": p99, "count": 10}
    return {
        "workload": "1-topic-1-partition-100b",
        "system": system,
        "replicas": 1,
        "target_rate": 0,
        "publish_msgs_per_s": rate,
        "publish_mb_per_s": rate / 10_000,
        "consume_msgs_per_s": rate,
        "publish_latency_ms": summary,
        "e2e_latency_ms": summary,
        "acked": 100,
        "received": 100,
        "errors": 0,
        "first_error": "",
    }


def _results(*runs: dict[str, Any]) -> dict[str, Any]:
    return {
        "runs": list(runs),
        "skipped": [{"system": "rabbitmq-quorum", "replicas": 3, "reason": "not set up"}],
        "peers": {},
        "durability": {"nats r1": "R1"},
        "started": "2026-11-21 23:00 UTC",
        "quick": True,
        "machine": {"cpu": "cpu", "cores": 2, "memory_gib": 1, "kernel": "k", "python": "3"},
    }


def test_ratio_is_raftline_over_peer() -> None:
    entries = ratios(_results(_run("raftline", 30_000, 5.0), _run("nats", 10_000, 10.0)))
    assert entries == [
        {
            "workload": "1-topic-1-partition-100b",
            "peer": "nats",
            "replicas": 1,
            "publish_ratio": 3.0,
            "e2e_p99_ratio": 0.5,
        }
    ]


def test_without_raftline_there_are_no_ratios_and_the_report_says_so() -> None:
    results = _results(_run("nats", 10_000, 10.0))
    assert ratios(results) == []
    assert "Raftline was not measured" in markdown(results)


def test_table_lists_each_run_and_each_skip() -> None:
    text = markdown(_results(_run("raftline", 30_000, 5.0), _run("redis", 20_000, 8.0)))
    assert "| 1-topic-1-partition-100b | raftline | 1 | max | 30,000 |" in text
    assert "| 1-topic-1-partition-100b | redis | 1 | max | 20,000 |" in text
    assert "rabbitmq-quorum (RF 3): not set up" in text


def test_write_produces_json_and_markdown(tmp_path: Path) -> None:
    paths = write(_results(_run("nats", 10_000, 10.0)), tmp_path)
    assert paths["json"].exists()
    assert paths["markdown"].read_text().startswith("Run 2026-11-21")


def test_fsync_always_ratios_leave_out_the_raftline_variant() -> None:
    entries = ratios(
        _results(
            _run("raftline", 30_000, 5.0),
            _run("raftline-nofsync", 60_000, 4.0),
            _run("nats", 10_000, 10.0),
        )
    )
    assert [(e["peer"], e["publish_ratio"]) for e in entries] == [("nats", 3.0)]


def test_a_peer_that_fsyncs_before_acking_is_compared_with_raftline_fsync_always() -> None:
    entries = like_for_like_ratios(
        _results(
            _run("raftline", 30_000, 5.0),
            _run("raftline-nofsync", 60_000, 4.0),
            _run("redis", 10_000, 10.0),
        )
    )
    assert entries == [
        {
            "workload": "1-topic-1-partition-100b",
            "peer": "redis",
            "replicas": 1,
            "publish_ratio": 3.0,
            "e2e_p99_ratio": 0.5,
            "durability_class": "fsync before ack",
            "raftline": "raftline",
        }
    ]


def test_a_peer_that_acks_before_any_fsync_is_compared_with_raftline_nofsync() -> None:
    entries = like_for_like_ratios(
        _results(
            _run("raftline", 30_000, 5.0),
            _run("raftline-nofsync", 60_000, 4.0),
            _run("rabbitmq-stream", 20_000, 8.0),
        )
    )
    assert [(e["peer"], e["raftline"], e["publish_ratio"]) for e in entries] == [
        ("rabbitmq-stream", "raftline-nofsync", 3.0)
    ]
    assert entries[0]["durability_class"] == "no fsync before ack"


def test_each_peer_is_in_the_class_its_acknowledgement_implies() -> None:
    fsynced = {s for s, c in DURABILITY_CLASS.items() if c == "fsync before ack"}
    assert fsynced == {
        "raftline",
        "raftline-idempotent",
        "raftline-post",
        "rabbitmq-quorum",
        "redis",
    }
    assert {"nats", "rabbitmq-stream", "raftline-nofsync"} == set(DURABILITY_CLASS) - fsynced


def test_every_compared_system_has_a_durability_class() -> None:
    assert set(SYSTEMS) <= set(DURABILITY_CLASS)


def test_a_peer_whose_raftline_counterpart_did_not_run_has_no_like_for_like_row() -> None:
    results = _results(_run("raftline", 30_000, 5.0), _run("nats", 10_000, 10.0))
    assert like_for_like_ratios(results) == []
    assert "like-for-like durability: none" in markdown(results)


def test_markdown_states_each_peers_class_in_the_like_for_like_table() -> None:
    text = markdown(
        _results(
            _run("raftline", 30_000, 5.0),
            _run("raftline-nofsync", 60_000, 4.0),
            _run("nats", 20_000, 10.0),
        )
    )
    assert "| 1-topic-1-partition-100b | 1 | nats | 1.50 | 0.50 |" in text
    assert (
        "| 1-topic-1-partition-100b | 1 | nats | no fsync before ack | raftline-nofsync "
        "| 3.00 | 0.40 |"
    ) in text


def test_results_json_holds_both_ratio_tables(tmp_path: Path) -> None:
    results = _results(
        _run("raftline", 30_000, 5.0),
        _run("raftline-nofsync", 60_000, 4.0),
        _run("nats", 20_000, 8.0),
    )
    saved = json.loads(write(results, tmp_path)["json"].read_text())
    assert [e["publish_ratio"] for e in saved["ratios"]] == [1.5]
    assert [e["publish_ratio"] for e in saved["like_for_like_ratios"]] == [3.0]


def test_idempotent_produce_is_reported_against_plain_and_left_out_of_peer_ratios() -> None:
    results = _results(
        _run("raftline", 30_000, 5.0),
        _run("raftline-idempotent", 28_500, 5.0),
        _run("nats", 10_000, 10.0),
    )
    assert [e["peer"] for e in ratios(results)] == ["nats"]
    text = markdown(results)
    assert "| 1-topic-1-partition-100b | 1 | 30000 | 28500 | 0.95 |" in text


def test_queue_runs_report_latency_to_receipt_and_to_ack_sent_beside_the_counted_ack() -> None:
    def queue_run(system: str, received_p99: float, sent_p99: float, acked_p99: float) -> Any:
        run = {**_run(system, 500, acked_p99), "workload": "queue-ack-500", "kind": "queue-ack"}
        received = {**run["e2e_latency_ms"], "p50": received_p99 / 4, "p99": received_p99}
        ack_sent = {**run["e2e_latency_ms"], "p50": sent_p99 / 4, "p99": sent_p99}
        return {**run, "received_latency_ms": received, "ack_sent_latency_ms": ack_sent}

    results = _results(
        queue_run("raftline", 8.0, 9.0, 30.0), queue_run("rabbitmq-quorum", 12.0, 14.0, 14.0)
    )
    (entry,) = ratios(results)
    assert entry["received_latency_ms"][0]["p99"] == 8.0
    assert entry["received_latency_ms"][1]["p99"] == 12.0
    assert entry["ack_sent_latency_ms"][0]["p99"] == 9.0
    row = next(line for line in markdown(results).splitlines() if "| 1.00 | 2.00 / 8.00 |" in line)
    assert row.endswith(
        "| 2.00 / 8.00 | 3.00 / 12.0 | 2.25 / 9.00 | 3.50 / 14.0 | 15.0 / 30.0 | 7.00 / 14.0 |"
    )
