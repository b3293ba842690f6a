"""The native load generator (bench/native) builds with cargo, publishes record batches a
Raftline node accepts and counts exactly what the node acknowledged; its answer becomes a
result row of the native table, which the report keeps apart from the Python-client one. Its
consume mode counts exactly what was produced and times each message from its stamp."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from bench import native, report
from bench.consumers import merge_into
from bench.drivers.raftline import RaftlineDriver
from bench.pacing import FixedRateSchedule, Window, encode, intended_ns_of
from bench.peers import RaftlinePeer
from bench.tally import Tally
from bench.workload import workload_from_dict

pytestmark = pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo")

WORKLOAD = workload_from_dict(
    {"name": "w", "message_size": 100, "batch_size": 200, "max_in_flight": 2, "acks": "all"}
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> object:
    native.ensure_built()
    peer = RaftlinePeer(1, tmp_path_factory.mktemp("native-node"))
    try:
        yield peer.start()
    finally:
        peer.stop()


async def _high_watermark(driver: RaftlineDriver, topic: str) -> int:
    answer = await driver.client.fetch(topic, 0, offset="latest", max_messages=1)
    return answer.high_watermark


def test_the_generator_publishes_batches_the_node_counts_exactly(node: object) -> None:
    async def scenario() -> tuple[dict, int]:
        driver = RaftlineDriver(node)  # type: ignore[arg-type]
        await driver.connect()
        await driver.create_topic("native-t", 1)
        before = await _high_watermark(driver, "native-t")  # a new leader's entry may be there
        argv = native.command("raftline", driver, "native-t", WORKLOAD, 0.0, 1.0, 0.0)
        out = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=60)
        answer = json.loads(out.stdout)
        stored = await _high_watermark(driver, "native-t") - before
        await driver.delete_topic("native-t", 1)
        await driver.close()
        return answer, stored

    answer, stored = asyncio.run(scenario())
    assert answer["errors"] == 0, answer["first_error"]
    assert answer["acked"] > 0
    assert stored == answer["acked"]


def test_a_fixed_rate_run_holds_its_rate_and_is_capped_by_max_messages(node: object) -> None:
    async def scenario() -> dict:
        driver = RaftlineDriver(node)  # type: ignore[arg-type]
        await driver.connect()
        try:
            return await native.run_workload(
                "raftline", driver, WORKLOAD, 2000.0, seconds=5.0, warmup=0.0, max_messages=2000
            )
        finally:
            await driver.close()

    row = asyncio.run(scenario())
    assert row["client"] == "native"
    assert row["acked"] == 2000
    # Paced: 2,000 messages at 2,000/s cannot take much under a second. Capped: the run ended
    # at its 2,000th message, well before its 5 s window (a busy machine only slows it).
    assert 0.8 <= row["duration_s"] < 5.0


def test_a_stamped_run_carries_each_messages_intended_send_time(node: object) -> None:
    """As the Python runner stamps them (bench/pacing.py), so a consumer measures end-to-end
    latency from them: message i of the schedule carries start + i / rate, rounded down."""
    rate, start_ns = 2000.0, time.monotonic_ns() + 300_000_000

    async def scenario() -> tuple[dict, list[bytes]]:
        driver = RaftlineDriver(node)  # type: ignore[arg-type]
        await driver.connect()
        await driver.create_topic("native-s", 1)
        argv = native.command("raftline", driver, "native-s", WORKLOAD, rate, 0.5, 0.0)
        argv += ["--start-ns", str(start_ns), "--stamp", "1"]
        out = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=60)
        answer = json.loads(out.stdout)
        fetched = await driver.client.fetch_values(
            "native-s", 0, offset=0, max_messages=10_000, max_bytes=8 << 20
        )
        await driver.delete_topic("native-s", 1)
        await driver.close()
        return answer, [v for v in fetched.values if v is not None]

    answer, values = asyncio.run(scenario())
    assert answer["errors"] == 0, answer["first_error"]
    schedule = FixedRateSchedule(start_ns, rate)
    groups = schedule.stamp_groups(0, answer["acked"])
    expected = Counter(stamp for stamp, count in groups for _ in range(count))
    assert Counter(intended_ns_of(v) for v in values) == expected


def _consume_while_publishing(
    node: object, topic: str, window: Window, batches: list[list[bytes]]
) -> dict:
    """The native consumer's tally of a 2-partition topic while the Python driver publishes
    `batches` (alternating partitions) after the consumer was told `window`."""

    async def scenario() -> dict:
        driver = RaftlineDriver(node)  # type: ignore[arg-type]
        await driver.connect()
        await driver.create_topic(topic, 2)
        port = driver.endpoint.ports["http"]
        consumer = native.NativeConsumer(driver, topic, 2, [port, port], {})
        try:
            await consumer.start()
            consumer.send_window(window)
            for i, batch in enumerate(batches):
                await driver.publish(topic, i % 2, batch, "all")
            await consumer.drain(sum(map(len, batches)), timeout=10)
        finally:
            result = await consumer.stop()
            await driver.delete_topic(topic, 2)
            await driver.close()
        return result

    return asyncio.run(scenario())


def test_the_native_consumer_counts_exactly_the_messages_produced(node: object) -> None:
    now = time.monotonic_ns()
    batches = [[encode(now, bytes(100))] * size for size in (1, 500, 37, 1000, 3)]
    result = _consume_while_publishing(node, "native-c", Window(now, now + 60 * 10**9), batches)
    assert result["errors"] == 0, result["first_error"]
    assert result["received"] == 1541
    assert result["received_in_window"] == 1541
    tally = Tally(Window(0, 0))
    merge_into(tally, result)  # the Python side reads its histogram as its own
    assert tally.e2e_latency.total == 1541
    assert 0 < tally.e2e_latency.percentile(50) < 60 * 10**6


def test_the_native_consumer_times_only_messages_stamped_inside_the_window(
    node: object,
) -> None:
    now = time.monotonic_ns()
    window = Window(now, now + 60 * 10**9)
    before, inside = encode(now - 1, bytes(100)), encode(now, bytes(100))
    batches = [[before] * 10, [inside] * 20, [before, inside] * 5]
    result = _consume_while_publishing(node, "native-w", window, batches)
    assert result["errors"] == 0, result["first_error"]
    assert result["received"] == 40
    assert result["e2e_latency"]["total"] == 25


def test_a_stamped_run_with_the_native_consumer_receives_every_acknowledged_message(
    node: object,
) -> None:
    workload = workload_from_dict(
        {
            "name": "s",
            "message_size": 100,
            "batch_size": 50,
            "partitions_per_topic": 2,
            "duration_seconds": 1.0,
            "warmup_seconds": 0.0,
        }
    )

    async def scenario() -> dict:
        driver = RaftlineDriver(node)  # type: ignore[arg-type]
        await driver.connect()
        try:
            node_ports = {1: driver.endpoint.ports["http"]}
            run = native.StampedRun(driver, workload, "nc", 2000.0, node_ports)
            return await run.run(drain_seconds=5.0)
        finally:
            await driver.close()

    row = asyncio.run(scenario())
    assert row["errors"] == 0, row["first_error"]
    assert row["consumer"] == "native"
    assert row["acked"] > 0
    assert row["received"] == row["acked"]
    assert row["e2e_latency_ms"]["count"] == row["acked"]


def test_the_report_keeps_native_and_python_tables_apart() -> None:
    run = {
        "workload": "w",
        "system": "raftline",
        "replicas": 1,
        "target_rate": 0,
        "publish_msgs_per_s": 10.0,
        "publish_mb_per_s": 0.001,
        "consume_msgs_per_s": 10.0,
        "publish_latency_ms": None,
        "e2e_latency_ms": None,
        "errors": 0,
        "first_error": "",
        "acked": 1,
        "received": 1,
    }
    results = {
        "started": "now",
        "quick": True,
        "machine": report.machine(),
        "durability": {},
        "peers": {},
        "skipped": [],
        "runs": [run],
        "native_runs": [{**run, "client": "native", "publish_msgs_per_s": 99.0}],
    }
    text = report.markdown(results)
    python_part, native_part = text.split("### Native clients")
    assert "### Python-client drivers" in python_part
    assert "| 10 |" in python_part and "| 99 |" not in python_part
    assert "| 99 |" in native_part


def test_the_crate_has_no_dependencies_to_fetch() -> None:
    manifest = (Path(native.CRATE) / "Cargo.toml").read_text()
    dependencies = manifest.split("[dependencies]", 1)[1].split("[", 1)[0]
    assert not [line for line in dependencies.splitlines() if line.strip() and "#" not in line]
