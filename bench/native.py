"""Runs the native load generator (bench/native, Rust) against a started system.

Owns building the generator (cargo, on demand), the mapping of a system and workload to its
command line, and its JSON answer turned into a result row like the Python runner's. The
generator publishes; topics are created and deleted through the Python driver. Also a
fixed-rate Raftline run with the generator as producer (StampedRun) and, by default, its
consume mode as consumer (NativeConsumer), so the servers are measured, not a Python client.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from bench.consumers import READY_TIMEOUT_S, RESULT_TIMEOUT_S, Consumer
from bench.drivers.base import Driver
from bench.node_procs import http_json
from bench.pacing import Window
from bench.runner import WorkloadRun
from bench.workload import Workload

CRATE = Path(__file__).parent / "native"
BINARY = CRATE / "target" / "release" / "raftline-loadgen"
MB = 1_000_000
BUILD_TIMEOUT_S = 600
PROGRESS_POLL_S = 0.05  # how often drain asks the native consumer how far it got
# The generator's name for a system and the endpoint port it talks to.
PROTOCOL = {
    "raftline": ("raftline", "http"),
    "raftline-nofsync": ("raftline", "http"),
    "nats": ("nats", "client"),
    "rabbitmq-quorum": ("rabbitmq-quorum", "amqp"),
    "rabbitmq-stream": ("rabbitmq-stream", "stream"),
    "redis": ("redis", "redis"),
}


class NativeError(RuntimeError):
    """The generator could not be built or failed to run."""


def ensure_built() -> Path:
    """Build the generator with cargo (one job: the machine may be shared) unless up to date."""
    if shutil.which("cargo") is None:
        if BINARY.exists():
            return BINARY
        raise NativeError("cargo is missing: install Rust to build bench/native")
    built = subprocess.run(
        [
            "cargo",
            "build",
            "--release",
            "-j1",
            "--quiet",
            "--manifest-path",
            str(CRATE / "Cargo.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if built.returncode != 0:
        raise NativeError(f"cargo build failed: {built.stderr[-2000:]}")
    return BINARY


def command(
    system: str,
    driver: Driver,
    topic: str,
    workload: Workload,
    rate: float,
    seconds: float,
    warmup: float,
    max_messages: int = 0,
) -> list[str]:
    protocol, port_name = PROTOCOL[system]
    endpoint = driver.endpoint
    argv = [
        str(BINARY),
        "--system", protocol,
        "--host", endpoint.host,
        "--port", str(endpoint.ports[port_name]),
        "--topic", topic,
        "--partitions", str(workload.partitions_per_topic),
        "--message-size", str(workload.message_size),
        "--batch", str(workload.batch_size),
        "--in-flight", str(workload.max_in_flight),
        "--seconds", str(seconds),
        "--warmup", str(warmup),
        "--rate", str(rate),
        "--replicas", str(endpoint.replicas),
        "--acks", workload.acks,
        "--linger-ms", str(workload.linger_ms),
    ]  # fmt: skip
    if max_messages:
        argv += ["--max-messages", str(max_messages)]
    max_entries = getattr(driver, "max_entries", None)
    if max_entries is not None and max_entries(workload.message_size):
        argv += ["--maxlen", str(max_entries(workload.message_size))]
    return argv


async def run_workload(
    system: str,
    driver: Driver,
    workload: Workload,
    rate: float,
    *,
    seconds: float | None = None,
    warmup: float | None = None,
    max_messages: int = 0,
) -> dict[str, Any]:
    """One workload through the generator: a fresh topic, the run, the topic deleted."""
    if workload.topics != 1:
        raise NativeError("the native generator drives one topic per run")
    seconds = workload.duration_seconds if seconds is None else seconds
    warmup = workload.warmup_seconds if warmup is None else warmup
    topic = f"native-{uuid.uuid4().hex[:6]}-{workload.name}"
    await driver.create_topic(topic, workload.partitions_per_topic)
    try:
        argv = command(system, driver, topic, workload, rate, seconds, warmup, max_messages)
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), seconds + warmup + 120)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        try:
            answer = json.loads(stdout)
        except json.JSONDecodeError as error:
            raise NativeError(f"generator said {stdout[-300:]!r} {stderr[-300:]!r}") from error
        if "error" in answer:
            raise NativeError(answer["error"])
    finally:
        cleanup = await _delete_topic(driver, topic, workload.partitions_per_topic)
    row = result_row(workload, rate, answer)
    if cleanup:
        row["notes"] = cleanup
    return row


async def _delete_topic(driver: Driver, topic: str, partitions: int) -> str:
    """Delete the run's topic; a failure (a peer deleting gigabytes may answer late) is noted,
    not raised, so that it cannot lose the measurement."""
    try:
        await asyncio.wait_for(driver.delete_topic(topic, partitions), 120)
    except Exception as error:
        return f"deleting the topic failed: {type(error).__name__}: {error}"[:200]
    return ""


def result_row(workload: Workload, rate: float, answer: dict[str, Any]) -> dict[str, Any]:
    """The generator's answer in the shape of bench.runner.WorkloadRun.result()."""
    publish_rate = answer["publish_msgs_per_s"]
    return {
        "workload": workload.name,
        "kind": workload.kind,
        "client": "native",
        "topics": 1,
        "partitions": workload.partitions_per_topic,
        "message_size": workload.message_size,
        "producers": 1,
        "target_rate": round(rate),
        "acks": workload.acks,
        "duration_s": answer["duration_s"],
        "publish_msgs_per_s": publish_rate,
        "publish_mb_per_s": round(publish_rate * workload.message_size / MB, 3),
        "consume_msgs_per_s": 0.0,
        "consume_mb_per_s": 0.0,
        "publish_latency_ms": answer["publish_latency_ms"],
        "e2e_latency_ms": None,
        "sent": answer["acked"],
        "acked": answer["acked"],
        "received": answer["acked"],  # no consumer: nothing is missing
        "errors": answer["errors"],
        "first_error": answer["first_error"],
        "timeline": answer["timeline"],
        "connections": answer["in_flight"],
        "batch": answer["batch"],
    }


def _leader_args(leaders: list[int], node_ports: dict[int, int]) -> list[str]:
    argv = ["--leaders", ",".join(map(str, leaders))]
    if node_ports:
        argv += ["--node-ports", ",".join(f"{n}={p}" for n, p in node_ports.items())]
    return argv


class NativeConsumer:
    """The generator's consume mode (`--consume 1`), driven as ConsumerProcess is: started
    and subscribed, told the window, followed until drained, stopped for its tally (the same
    fields and histogram buckets, so bench.consumers.merge_into folds it in). It follows every
    partition of one Raftline topic from its leader, one thread each."""

    def __init__(
        self,
        driver: Driver,
        topic: str,
        partitions: int,
        leaders: list[int],
        node_ports: dict[int, int],
    ) -> None:
        endpoint = driver.endpoint
        self.argv = [
            str(BINARY),
            "--system", "raftline",
            "--consume", "1",
            "--host", endpoint.host,
            "--port", str(endpoint.ports["http"]),
            "--topic", topic,
            "--partitions", str(partitions),
            *_leader_args(leaders, node_ports),
        ]  # fmt: skip
        self.process: asyncio.subprocess.Process | None = None
        self.received = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        line = await self._line(READY_TIMEOUT_S)
        if line != "ready":
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
            raise NativeError(f"native consumer did not subscribe: {line!r}")

    def send_window(self, window: Window) -> None:
        self._send(f"window {window.start_ns} {window.end_ns}")

    async def drain(self, target: int, timeout: float) -> None:
        """Follow progress until `target` messages arrived or time ran out."""
        deadline = time.monotonic() + timeout
        while self.received < target and (left := deadline - time.monotonic()) > 0:
            self._send("progress")
            line = await self._line(left)
            if not line.startswith("progress "):
                return
            self.received = int(line.split()[1])
            if self.received < target:
                await asyncio.sleep(PROGRESS_POLL_S)

    async def stop(self) -> dict[str, Any]:
        """Stop it and return its tally (received counts, errors, e2e histogram)."""
        if self.process is None:
            raise NativeError("native consumer never started")
        try:
            self._send("stop")
            line = await self._line(RESULT_TIMEOUT_S)
            while line.startswith("progress "):  # answers to an abandoned drain
                line = await self._line(RESULT_TIMEOUT_S)
            result = json.loads(line)
        except (json.JSONDecodeError, ConnectionError) as error:
            raise NativeError(f"native consumer ended without result: {error}") from error
        finally:
            try:
                await asyncio.wait_for(self.process.wait(), RESULT_TIMEOUT_S)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if "error" in result:
            raise NativeError(result["error"])
        self.received = result["received"]
        return result

    def _send(self, command: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(f"{command}\n".encode())

    async def _line(self, timeout: float) -> str:
        """The next line it writes ("" at its end or when none came in time)."""
        assert self.process is not None and self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            return ""
        return line.decode().strip()


class StampedRun(WorkloadRun):
    """A Raftline run whose producer is the generator (`--stamp 1`): each message carries its
    intended send time and, at a fixed rate, a batch goes out once its last message is due, as
    from the Python runner, so a consumer measures end-to-end latency alike. The consumer is
    the generator's consume mode (`consumer="native"`) or the Python consumer process. Both
    talk to each partition's leader (`node_ports`: node id -> HTTP port, to look leaders up
    and follow a forwarded answer)."""

    def __init__(
        self,
        driver: Driver,
        workload: Workload,
        run_id: str,
        rate: float,
        node_ports: dict[int, int],
        consumer: str = "native",
    ) -> None:
        super().__init__(driver, workload, run_id, rate)
        if consumer not in ("native", "python"):
            raise ValueError(f"consumer must be native or python, not {consumer!r}")
        self.node_ports = node_ports
        self.consumer = consumer
        self.producer_pid: int | None = None
        self.answer: dict[str, Any] = {}

    async def _start_consumer(self, queue: bool) -> Consumer:
        if self.consumer == "python":
            return await super()._start_consumer(queue)
        if queue or len(self.topics) != 1:
            raise NativeError("the native consumer follows the partitions of one topic")
        topic = self.topics[0]
        leaders = await asyncio.to_thread(self._leader_ports, topic)
        consumer = NativeConsumer(
            self.driver, topic, self.workload.partitions_per_topic, leaders, self.node_ports
        )
        await consumer.start()
        return consumer

    async def _produce(self, topic: str, drain_seconds: float) -> None:
        w = self.workload
        argv = command(
            "raftline", self.driver, topic, w, self.rate, w.duration_seconds, w.warmup_seconds
        )
        leaders = await asyncio.to_thread(self._leader_ports, topic)
        argv += [
            "--start-ns", str(self.start_ns),
            "--stamp", "1",
            *_leader_args(leaders, self.node_ports),
        ]  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        self.producer_pid = process.pid
        seconds = (self.tally.window.end_ns - time.monotonic_ns()) / 1e9 + drain_seconds
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), seconds + 60)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        try:
            self.answer = json.loads(stdout)
        except json.JSONDecodeError as error:
            raise NativeError(f"generator said {stdout[-300:]!r} {stderr[-300:]!r}") from error
        self.tally.sent += self.answer.get("acked", 0)
        self.tally.acked += self.answer.get("acked", 0)
        self.tally.acked_in_window += self.answer.get("acked_in_window", 0)
        if self.answer.get("error") or self.answer.get("errors"):
            error = self.answer.get("error") or self.answer.get("first_error")
            self.tally.on_error(NativeError(str(error)))

    def _leader_ports(self, topic: str) -> list[int]:
        """Each partition's leader's HTTP port (the endpoint's where none is known yet)."""
        port = self.driver.endpoint.ports["http"]
        url = f"http://{self.driver.endpoint.host}:{port}/v1/topics/{topic}"
        status, body = http_json(url)
        partitions = body.get("partitions", []) if status == 200 else []
        return [
            self.node_ports.get(int(p["leader"]), port) if p.get("leader") is not None else port
            for p in partitions
        ] or [port] * self.workload.partitions_per_topic

    def result(self) -> dict[str, Any]:
        row = super().result()
        row["client"] = "native"
        row["consumer"] = self.consumer
        row["publish_latency_ms"] = self.answer.get("publish_latency_ms")
        return row
