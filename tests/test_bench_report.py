"""The comparison report states Raftline/peer ratios and every run in its table."""

from pathlib import Path
from typing import Any

from bench.report import markdown, ratios, write


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
