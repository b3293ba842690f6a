"""Real `raftline serve` processes for benchmarks and cluster tests: ports, data dir, readiness.

Owns starting N nodes that list each other as peers, waiting until they answer /readyz, creating
a topic, finding a partition's leader over HTTP, and killing every node (always) at the end.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 30.0


def http_json(url: str, method: str = "GET", body: Any = None, timeout: float = 5.0) -> Any:
    """One request; returns (status, parsed body). Connection failures raise OSError, and so
    does an answer cut short (a node killed mid-response)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except http.client.HTTPException as error:
        raise ConnectionError(f"torn HTTP exchange with {url}: {error!r}") from error
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw) if raw else {}
        except ValueError:
            return error.code, {"raw": raw.decode("utf-8", "replace")}


def serve_command() -> list[str]:
    """The installed console script when present, else the same entry point through python."""
    script = Path(sys.executable).parent / "raftline"
    if script.exists():
        return [str(script), "serve"]
    return [sys.executable, "-c", "from raftline.clients.cli import main; main()", "serve"]


class NodeProcess:
    def __init__(self, node_id: int, http: str, raft: str, peers: str, root: Path) -> None:
        self.node_id = node_id
        self.http = http
        self.raft = raft
        self.peers = peers
        self.data_dir = root / f"node-{node_id}"
        self.log_path = root / f"node-{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.http}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, fsync: str = "always", flags: dict[str, str] | None = None) -> None:
        """Start `raftline serve`; `flags` are more of its flags: {"switch-interval-us": "500"}."""
        command = [
            *serve_command(),
            "--node-id", str(self.node_id),
            "--data-dir", str(self.data_dir),
            "--http", self.http,
            "--raft", self.raft,
            "--peers", self.peers,
            "--fsync", fsync,
        ]  # fmt: skip
        for flag, value in (flags or {}).items():
            command += [f"--{flag}", value]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the node's process group: no flush, no goodbye."""
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the node falls silent with its connections open, as when it is cut off."""
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGCONT)

    def ready(self) -> bool:
        try:
            status, _ = http_json(f"{self.url}/readyz", timeout=1.0)
        except OSError:
            return False
        return status == 200

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class NodeCluster:
    """`size` nodes on ports port_base+1.. (HTTP) and port_base+51.. (Raft)."""

    def __init__(self, root: Path, size: int, port_base: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        ids = range(1, size + 1)
        raft = {i: f"127.0.0.1:{port_base + 50 + i}" for i in ids}
        peers = ",".join(f"{i}={address}" for i, address in raft.items())
        self.nodes = [
            NodeProcess(i, f"127.0.0.1:{port_base + i}", raft[i], peers, root) for i in ids
        ]

    def node(self, node_id: int) -> NodeProcess:
        return next(n for n in self.nodes if n.node_id == node_id)

    def live(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.running]

    def start(self, fsync: str = "always", flags: dict[str, str] | None = None) -> None:
        for node in self.nodes:
            node.start(fsync, flags)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for node in self.nodes:
            while not node.ready():
                if not node.running or time.monotonic() > deadline:
                    raise RuntimeError(f"node {node.node_id} did not start:\n{node.log_tail()}")
                time.sleep(0.1)

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3) -> None:
        status, body = http_json(
            f"{self.nodes[0].url}/v1/topics",
            "POST",
            {"name": name, "partitions": partitions, "replication_factor": replication_factor},
            timeout=15,
        )
        if status != 201:
            raise RuntimeError(f"creating topic {name} failed: {status} {body}")

    def leader(self, topic: str, partition: int = 0, timeout: float = 20.0) -> NodeProcess:
        """The live node that leads the partition, as the live nodes describe it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.live():
                try:
                    status, body = http_json(f"{node.url}/v1/topics/{topic}")
                except OSError:
                    continue
                leader = body["partitions"][partition].get("leader") if status == 200 else None
                if leader is not None and self.node(int(leader)).running:
                    return self.node(int(leader))
            time.sleep(0.1)
        raise TimeoutError(f"no leader for {topic}/{partition}")

    def controller(self, timeout: float = 20.0) -> NodeProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.live():
                try:
                    status, body = http_json(f"{node.url}/v1/cluster")
                except OSError:
                    continue
                found = body.get("controller") if status == 200 else None
                if found is not None and self.node(int(found)).running:
                    return self.node(int(found))
            time.sleep(0.1)
        raise TimeoutError("no live controller")

    def kill_all(self) -> None:
        for node in self.nodes:
            node.kill()


@contextmanager
def running_nodes(
    root: Path,
    size: int,
    port_base: int,
    fsync: str = "always",
    flags: dict[str, str] | None = None,
) -> Iterator[NodeCluster]:
    """A started cluster whose processes are always killed when the block ends."""
    cluster = NodeCluster(root, size, port_base)
    try:
        cluster.start(fsync, flags)
        yield cluster
    finally:
        cluster.kill_all()
