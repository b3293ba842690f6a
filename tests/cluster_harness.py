"""Real `raftline serve` processes on loopback for cluster tests: start, wait, SIGKILL, restart.

Owns free-port allocation, per-node temp data dirs and logs, readiness waits, certain cleanup
and the failure report (event timeline, producer history, every node's log).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.node_procs import NodeProcess, http_json
from bench.ports import PORT_RETRIES, free_ports, lost_a_port

READY_TIMEOUT_S = 30.0
FETCH_RETRY_S = 20.0  # a fetch answered "retry" (e.g. leader_unavailable) is retried this long
REPLICA_CATCH_UP_S = 30.0  # followers copy what was acknowledged; generous for loaded machines
# A node that dies with one of these at start met a half-edited working tree, not a broker bug.
IMPORT_ERRORS = ("ImportError:", "ModuleNotFoundError:", "SyntaxError:", "IndentationError:")
REPORT_LOG_LINES = 400  # per node in a failure report
REPORT_NAME = "failure-report.txt"  # written next to the nodes' data when a cluster test fails
# Starts that lost a port to another process (EADDRINUSE) are tried again this often: a fresh
# cluster on new ports, a restarted node (whose Raft address its peers know) on the same ones.
PORT_RETRY_PAUSE_S = 0.5


class Timeline:
    """What the harness did and saw, in seconds since the cluster was created."""

    def __init__(self) -> None:
        self.origin = time.monotonic()
        self.events: list[tuple[float, str]] = []

    def at(self, moment: float) -> float:
        return moment - self.origin

    def note(self, text: str) -> None:
        self.events.append((time.monotonic(), text))

    def render(self) -> str:
        return "\n".join(f"{self.at(moment):9.3f} s  {text}" for moment, text in self.events)


class Node(NodeProcess):
    """A node process whose starts and kills go on the test's timeline."""

    def __init__(
        self,
        node_id: int,
        root: Path,
        peers: str,
        timeline: Timeline | None = None,
        addresses: tuple[str, str] | None = None,
    ) -> None:
        """`addresses`: (HTTP, Raft), both on free ports if not given."""
        http, raft = addresses or tuple(f"127.0.0.1:{port}" for port in free_ports(2))
        super().__init__(node_id, http, raft, peers, root)
        self.timeline = timeline or Timeline()
        self.fsync = "always"
        self._log_start = 0  # where this start's output begins in the (appended) log

    def start(self, fsync: str = "always") -> None:
        self.fsync = fsync
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        super().start(fsync)
        self.timeline.note(f"node {self.node_id} started (pid {self.pid})")

    def lost_a_port(self) -> bool:
        """Whether this start's output says another process held one of the node's ports."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_start)
                return lost_a_port(log.read().decode(errors="replace"))
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        if self.running:
            super().kill()
            self.timeline.note(f"node {self.node_id} SIGKILLed")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait for a clean exit (SIGKILL if it does not come)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
            self.timeline.note(f"node {self.node_id} stopped (exit {self.process.returncode})")
        except subprocess.TimeoutExpired:
            self.timeline.note(f"node {self.node_id} ignored SIGTERM for {timeout} s")
            self.kill()

    def exit_cause(self) -> str:
        """Why the process ended, with a hint when it could not even load Raftline's code."""
        code = self.process.poll() if self.process is not None else None
        if any(error in self.log_tail() for error in IMPORT_ERRORS):
            return (
                f"exited ({code}) loading Raftline's code: the source tree was probably edited "
                "while the test ran (every node start imports the working tree)"
            )
        return f"exited ({code})"

    def report(self) -> str:
        state = "running" if self.running else self.exit_cause()
        return (
            f"--- node {self.node_id} ({state}; http {self.http}, raft {self.raft}, "
            f"data {self.data_dir}) log, last {REPORT_LOG_LINES} lines ---\n"
            f"{self.log_tail(REPORT_LOG_LINES)}"
        )


class Cluster:
    """N nodes listing each other in --peers; every node's data and log under `root`."""

    def __init__(self, root: Path, size: int = 3) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.timeline = Timeline()
        # Parts of the failure report registered by helpers (e.g. a producer's history).
        self.reporters: list[Callable[[], str]] = []
        self.nodes = self._new_nodes(size)

    def _new_nodes(self, size: int) -> list[Node]:
        """`size` nodes on ports free now, listing each other's Raft addresses as peers."""
        addresses = [f"127.0.0.1:{port}" for port in free_ports(2 * size)]
        http, raft = addresses[:size], addresses[size:]
        peers = ",".join(f"{i}={address}" for i, address in enumerate(raft, 1))
        return [
            Node(i, self.root, peers, self.timeline, (http[i - 1], raft[i - 1]))
            for i in range(1, size + 1)
        ]

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    @property
    def urls(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def start(self) -> None:
        """Starts every node and waits until all are ready. Should another process take one of
        the ports between their pick and the node's bind, the attempt's nodes are stopped and
        their data removed, and a fresh cluster starts on new ports."""
        for attempt in range(PORT_RETRIES + 1):
            for node in self.nodes:
                node.start()
            lost = self._wait_ready(self.nodes, READY_TIMEOUT_S, restart_lost=False)
            if lost is None:
                return
            self.timeline.note(f"node {lost.node_id} lost a port to another process")
            if attempt == PORT_RETRIES:
                break
            self.close()
            for node in self.nodes:
                shutil.rmtree(node.data_dir, ignore_errors=True)
            self.nodes = self._new_nodes(len(self.nodes))
        raise RuntimeError(
            f"node {lost.node_id} lost a port in {PORT_RETRIES + 1} starts:\n{lost.log_tail()}"
        )

    def wait_ready(self, nodes: list[Node] | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        """Waits until `nodes` (all by default) answer ready. A node whose start lost one of
        its ports to another process is started again on the same ports (its peers know its
        Raft address) after a pause, a few times."""
        self._wait_ready(nodes or self.nodes, timeout, restart_lost=True)

    def _wait_ready(self, nodes: list[Node], timeout: float, restart_lost: bool) -> Node | None:
        """None once every node is ready; with `restart_lost` false, the first node found to
        have lost a port instead. All are watched at once: a 3-node cluster missing two cannot
        elect, and the others' readiness waits on them."""
        deadline = time.monotonic() + timeout
        restarts = dict.fromkeys((node.node_id for node in nodes), 0)
        pending = list(nodes)
        while pending:
            for node in pending:
                if node.running:
                    continue
                if not node.lost_a_port():
                    raise RuntimeError(
                        f"node {node.node_id} {node.exit_cause()}:\n{node.log_tail()}"
                    )
                if not restart_lost:
                    return node
                if restarts[node.node_id] == PORT_RETRIES:
                    raise RuntimeError(
                        f"node {node.node_id} lost a port in {PORT_RETRIES + 1} starts:\n"
                        f"{node.log_tail()}"
                    )
                restarts[node.node_id] += 1
                self.timeline.note(f"node {node.node_id} lost a port; starting it again")
                time.sleep(PORT_RETRY_PAUSE_S)
                node.start(node.fsync)
            pending = [node for node in pending if not node.ready()]
            if pending and time.monotonic() > deadline:
                node = pending[0]
                raise TimeoutError(f"node {node.node_id} not ready:\n{node.log_tail()}")
            if pending:
                time.sleep(0.1)
        return None

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.running]

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3) -> None:
        """Creates the topic through the first node; anything but 201 fails the caller."""
        status, body = http_json(
            f"{self.nodes[0].url}/v1/topics",
            "POST",
            {"name": name, "partitions": partitions, "replication_factor": replication_factor},
            timeout=15,
        )
        assert status == 201, body

    def describe(self, topic: str) -> dict[str, Any]:
        """The topic as any live node describes it."""
        last: Any = None
        for node in self.live():
            try:
                status, body = http_json(f"{node.url}/v1/topics/{topic}")
            except OSError as error:
                last = error
                continue
            if status == 200:
                return body
            last = body
        raise RuntimeError(f"no live node describes {topic}: {last}")

    def wait_for_leader(self, topic: str, partition: int, timeout: float = 20.0) -> int:
        """The id of a live node that currently leads the partition."""
        deadline = time.monotonic() + timeout
        live_ids = {n.node_id for n in self.live()}
        while time.monotonic() < deadline:
            with_errors = None
            try:
                leader = self.describe(topic)["partitions"][partition].get("leader")
            except RuntimeError as error:
                with_errors, leader = error, None
            if leader in live_ids:
                return int(leader)
            time.sleep(0.1)
        raise TimeoutError(f"no leader for {topic}/{partition}: {with_errors}")

    def controller(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        live_ids = {n.node_id for n in self.live()}
        while time.monotonic() < deadline:
            for node in self.live():
                try:
                    status, body = http_json(f"{node.url}/v1/cluster")
                except OSError:
                    continue
                if status == 200 and body.get("controller") in live_ids:
                    return int(body["controller"])
            time.sleep(0.1)
        raise TimeoutError("no live controller")

    def close(self) -> None:
        for node in self.nodes:
            node.stop(timeout=10)

    def failure_report(self) -> str:
        """Timeline, registered reporters' histories and every node's log."""
        parts = [f"=== cluster under {self.root}: timeline ===", self.timeline.render()]
        parts += [reporter() for reporter in self.reporters]
        parts += [node.report() for node in self.nodes]
        return "\n".join(parts) + "\n"


@contextmanager
def paused(*nodes: Node) -> Iterator[None]:
    """SIGSTOPped `nodes` (connections open, nothing answered: as a node cut off), resumed
    on exit."""
    for node in nodes:
        node.pause()
    try:
        yield
    finally:
        for node in nodes:
            node.resume()


@contextmanager
def running_cluster(root: Path, size: int = 3) -> Iterator[Cluster]:
    """A started cluster that is always torn down, logs shown when the body failed."""
    cluster = Cluster(root, size)
    try:
        cluster.start()
        yield cluster
    except BaseException:
        cluster.timeline.note("test body failed")
        cluster.close()  # logs then hold the clean-stop lines too
        report = cluster.failure_report()
        sys.stderr.write(report)
        with contextlib.suppress(OSError):
            (root / REPORT_NAME).write_text(report)
        raise
    finally:
        cluster.close()
        for node in cluster.nodes:
            if node.running:
                os.killpg(node.process.pid, signal.SIGKILL)  # type: ignore[union-attr]


def call_retrying(
    node: Node, method: str, path: str, body: Any = None, retry_s: float = 20.0
) -> tuple[int, Any]:
    """One HTTP call to `node`, tried again while its answer is retryable (or the node cannot
    be reached) for up to `retry_s`: the last (status, body)."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            status, answer = http_json(f"{node.url}{path}", method, body, timeout=15.0)
        except OSError as error:
            status, answer = 0, {"error": {"retryable": True, "message": str(error)}}
        retryable = status == 0 or (
            status >= 500 and isinstance(answer, dict) and answer["error"].get("retryable")
        )
        if not retryable or time.monotonic() > deadline:
            return status, answer
        time.sleep(0.1)


def call_until_done(
    node: Node, method: str, path: str, body: Any = None, retry_s: float = 20.0
) -> Any:
    """`call_retrying` that must end in a 2xx, whose body is returned."""
    status, answer = call_retrying(node, method, path, body, retry_s)
    assert status in (200, 201, 204), (method, path, status, answer)
    return answer


class ContinuousProducer:
    """Sends one uniquely numbered message per request (acks=all) from a thread, to any live
    node, never resending a message: every acknowledged message must then be stored once."""

    def __init__(self, cluster: Cluster, topic: str, partition: int = 0) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        # (value, offset, sent at, acknowledged at), monotonic seconds
        self.acked: list[tuple[str, int, float, float]] = []
        self.failures: list[tuple[float, str]] = []
        self.crash: str | None = None  # the traceback that ended the thread early, if any
        self._stop = False
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="continuous-producer", daemon=True)
        cluster.reporters.append(self.report)

    def start(self) -> ContinuousProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop = True
        self._thread.join(30)

    def _run(self) -> None:
        try:
            self._produce_until_stopped()
        except BaseException:
            self.crash = traceback.format_exc()
            raise

    def _check_alive(self) -> None:
        if self.crash is not None:
            raise RuntimeError(f"the producer thread died:\n{self.crash}")

    def _produce_until_stopped(self) -> None:
        turn = 0
        while not self._stop:
            live = self.cluster.live()
            if not live:
                time.sleep(0.05)
                continue
            node = live[turn % len(live)]
            value = f"m-{self._sequence:08d}"
            self._sequence += 1
            body = {
                "acks": "all",
                "messages": [{"value": value, "partition": self.partition}],
            }
            sent_at = time.monotonic()
            try:
                status, answer = http_json(
                    f"{node.url}/v1/topics/{self.topic}/messages", "POST", body, timeout=10.0
                )
            except OSError as error:
                self.failures.append((time.monotonic(), f"node {node.node_id}: {error}"))
                turn += 1
                time.sleep(0.02)
                continue
            if status == 200:
                offset = int(answer["offsets"][0]["offset"])
                self.acked.append((value, offset, sent_at, time.monotonic()))
            else:
                self.failures.append((time.monotonic(), f"node {node.node_id}: {status} {answer}"))
                turn += 1
                time.sleep(0.02)

    def report(self) -> str:
        """Every failed request and the acknowledged offsets, as runs of consecutive offsets."""
        at = self.cluster.timeline.at
        lines = [f"=== producer to {self.topic}/{self.partition}: {len(self.acked)} acked ==="]
        if self.crash is not None:
            lines.append(f"the producer thread died:\n{self.crash}")
        lines += [f"{at(moment):9.3f} s  failed: {text}" for moment, text in self.failures]
        run: list[tuple[str, int, float, float]] = []
        for ack in [*self.acked, None]:
            if run and (ack is None or ack[1] != run[-1][1] + 1):
                (first, low, sent, _), (last, high, _, acked) = run[0], run[-1]
                lines.append(
                    f"{at(sent):9.3f} s  acked {first}..{last} at offsets {low}..{high} "
                    f"(last ack at {at(acked):.3f} s)"
                )
                run = []
            if ack is not None:
                run.append(ack)
        return "\n".join(lines)

    def wait_for_acks(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.acked)} acks; failures {self.failures[-3:]}")
            time.sleep(0.02)

    def first_ack_after(self, moment: float, timeout: float = 20.0) -> float:
        """Seconds from `moment` to the first acknowledgement of a message sent after it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            later = [acked_at for _, _, sent_at, acked_at in self.acked if sent_at > moment]
            if later:
                return min(later) - moment
            time.sleep(0.01)
        raise TimeoutError(f"no ack after the kill; failures {self.failures[-3:]}")


def read_partition(node: Node, topic: str, partition: int, wait_ms: int = 0) -> list[Any]:
    """Every committed message of a partition through `node`'s API (forwarded to the leader).
    Retryable errors (an election under way) are retried, as a client would, for a while."""
    messages: list[Any] = []
    offset: int | str = "earliest"
    deadline = time.monotonic() + FETCH_RETRY_S
    while True:
        status, body = http_json(
            f"{node.url}/v1/topics/{topic}/partitions/{partition}/messages"
            f"?offset={offset}&max_messages=5000&wait_ms={wait_ms}",
            timeout=10.0,
        )
        retryable = status != 200 and body.get("error", {}).get("retryable") is True
        if retryable and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        if status != 200:
            raise RuntimeError(f"fetch failed: {status} {body}")
        messages.extend(body["messages"])
        if body["next_offset"] >= body["high_watermark"] or body["next_offset"] == offset:
            return messages
        offset = body["next_offset"]


def replica_values(node: Node, topic: str, partition: int) -> list[str]:
    """Values of the data records in one node's copy of a partition, read from its segment
    files. The tail may hold entries that never committed; on a running node a batch still
    being written ends the read."""
    from raftline.raftlog.batch import CorruptBatchError, batch_size_at
    from raftline.raftlog.records import decode_batch

    [directory] = (node.data_dir / "partitions").glob(f"{topic}~*~{partition}")
    values: list[str] = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while (size := batch_size_at(data, position)) is not None and size > 0:
            try:
                decoded = decode_batch(data[position : position + size])
            except CorruptBatchError:
                return values
            if not decoded.header.is_control:
                values.extend((r.value or b"").decode() for r in decoded.records)
            position += size
    return values


def wait_for_replicas(
    cluster: Cluster,
    topic: str,
    partition: int,
    values: list[str],
    timeout: float = REPLICA_CATCH_UP_S,
) -> None:
    """Wait (bounded) until every node's copy holds `values`: followers catch up after acks.
    A copy still lacking some when the time is up fails, naming the node and what it lacks."""
    wanted = set(values)
    deadline = time.monotonic() + timeout
    while True:
        lacking = {
            n.node_id: wanted - set(replica_values(n, topic, partition)) for n in cluster.nodes
        }
        if not any(lacking.values()):
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    cluster.timeline.note(f"replicas still lacking acknowledged messages after {timeout} s")
    raise AssertionError(
        "; ".join(
            f"node {node_id}'s copy lacks {len(lost)} acknowledged messages: {sorted(lost)[:3]}"
            for node_id, lost in lacking.items()
            if lost
        )
    )


def check_acked_once_in_order(acked_values: list[str], stored: list[str], where: str = "") -> None:
    """Every acknowledged value appears exactly once, and in acknowledgement order.
    `where` names the copy checked (e.g. "node 2's disk") in the failure message."""
    wanted = frozenset(acked_values)
    label = f"{where}: " if where else ""
    positions: dict[str, int] = {}
    for index, value in enumerate(stored):
        if value in wanted:
            assert value not in positions, (
                f"{label}{value} stored twice, at positions {positions[value]} and {index} "
                f"of {len(stored)} stored values"
            )
            positions[value] = index
    missing = [v for v in acked_values if v not in positions]
    assert not missing, (
        f"{label}{len(missing)} of {len(acked_values)} acknowledged messages lost, "
        f"first {missing[:3]}; {len(stored)} values stored, last {stored[-3:]}"
    )
    order = [positions[v] for v in acked_values]
    inversions = [
        (acked_values[i], acked_values[i + 1])
        for i in range(len(order) - 1)
        if order[i] > order[i + 1]
    ]
    assert not inversions, f"{label}acknowledged messages out of order, e.g. {inversions[:3]}"
