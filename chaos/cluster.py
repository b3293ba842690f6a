"""The cluster under test as the harness drives it: the docker compose cluster of this repository.

Owns finding the compose tool, bringing nodes up and down, and the process and network controls
(SIGKILL/restart, pause, nftables rules inside each container's network namespace) of the nodes
and of the cluster's object storage (the `seaweedfs` service).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Every command the harness runs is bounded; a hung docker call must not hang the run.
COMMAND_TIMEOUT_S = 120
NFT_TABLE = "raftline_chaos"
STORAGE_SERVICE = "seaweedfs"  # docker-compose.yml's S3 server
STORAGE_URL = "http://127.0.0.1:18333"


class ClusterError(RuntimeError):
    """The cluster could not be started, reached or controlled."""


def compose_command() -> list[str]:
    """The compose tool this machine has: the `docker compose` plugin, else `docker-compose`."""
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise ClusterError("neither `docker compose` nor `docker-compose` is installed")


def run(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"timed out after {timeout}s: {' '.join(argv)}") from None
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class Node:
    """One broker node: its id, its compose service, and its HTTP API as the host reaches it."""

    node_id: int
    service: str
    http_url: str
    container: str = ""
    ip: str = ""


class Cluster(Protocol):
    """What a run needs from any cluster; fault injection needs a `ComposeCluster`."""

    nodes: list[Node]

    def up(self) -> None: ...

    def down(self) -> None: ...

    def refresh(self) -> None: ...

    def wait_ready(self, timeout_s: float = 120.0, nodes: Iterable[Node] | None = None) -> bool: ...

    def is_running(self, node: Node) -> bool: ...

    def start(self, node: Node) -> None: ...

    def heal_all(self) -> None: ...

    def save_logs(self, folder: Path) -> list[Path]: ...


def _wait_ready(nodes: Iterable[Node], timeout_s: float) -> bool:
    """Polls /readyz until every node answers 200, for at most `timeout_s`."""
    pending = list(nodes)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending if not http_ok(n.http_url + "/readyz")]
        if pending:
            time.sleep(1.0)
    return not pending


@dataclass
class StaticCluster:
    """Nodes someone else runs (e.g. `raftline serve` on loopback): workload only, no faults."""

    urls: list[str]
    nodes: list[Node] = field(init=False)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("a static cluster needs at least one URL")
        self.nodes = [Node(i, f"node{i}", u.rstrip("/")) for i, u in enumerate(self.urls, 1)]

    def up(self) -> None:
        """Nothing to start: the nodes are already running."""

    def down(self) -> None:
        """Nothing to stop: the nodes belong to whoever started them."""

    def refresh(self) -> None:
        """Nothing to look up: the URLs are all there is."""

    def wait_ready(self, timeout_s: float = 120.0, nodes: Iterable[Node] | None = None) -> bool:
        return _wait_ready(nodes or self.nodes, timeout_s)

    def is_running(self, node: Node) -> bool:
        return True

    def start(self, node: Node) -> None:
        """Never stopped by this harness."""

    def heal_all(self) -> None:
        """No faults to heal."""

    def save_logs(self, folder: Path) -> list[Path]:
        """Nothing to save: the nodes' logs are with whoever runs them."""
        return []


@dataclass
class ComposeCluster:
    """The nodes of docker-compose.yml, `raftline1..N`, published on 127.0.0.1:18081.. ."""

    size: int = 5
    project: str = "raftline-chaos"
    compose_file: Path = Path("docker-compose.yml")
    base_port: int = 18080
    env: dict[str, str] = field(default_factory=lambda: {"RAFTLINE_TEST_HOOKS": "1"})
    nodes: list[Node] = field(init=False)
    # The object storage container (node id 0), once `refresh` found it running.
    storage: Node | None = field(init=False, default=None)
    _compose: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.size <= 5:
            raise ValueError("docker-compose.yml defines 5 nodes; --nodes must be 1..5")
        self.nodes = [
            Node(i, f"raftline{i}", f"http://127.0.0.1:{self.base_port + i}")
            for i in range(1, self.size + 1)
        ]

    def _compose_run(self, *args: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
        if not self._compose:
            self._compose = compose_command()
        argv = [*self._compose, "-f", str(self.compose_file), "-p", self.project, *args]
        env_prefix = ["env", *(f"{k}={v}" for k, v in self.env.items())]
        return run(env_prefix + argv, timeout=timeout)

    def up(self) -> None:
        self._compose_run("up", "-d", "--no-build", *(n.service for n in self.nodes), timeout=300)
        self.refresh()

    def down(self) -> None:
        self._compose_run("down", "-v", "--timeout", "10", timeout=300)

    def save_logs(self, folder: Path) -> list[Path]:
        """Writes each node's log, timestamped, to `folder/<service>.log` (before `down`
        removes the containers): what a node did in a window that missed is read there."""
        folder.mkdir(parents=True, exist_ok=True)
        saved = []
        for node in self.nodes:
            text = self._compose_run(
                "logs", "--no-color", "--timestamps", node.service, timeout=120
            )
            path = folder / f"{node.service}.log"
            path.write_text(text, encoding="utf-8")
            saved.append(path)
        return saved

    def refresh(self) -> None:
        """Looks up each node's container id and its address on the compose network, and the
        object storage's container when the compose file has one."""
        for node in self.nodes:
            node.container = self._compose_run("ps", "-q", node.service).strip()
            if not node.container:
                raise ClusterError(f"no container for {node.service}")
            self.refresh_address(node)
        services = self._compose_run("config", "--services").split()
        if STORAGE_SERVICE in services:
            container = self._compose_run("ps", "-q", STORAGE_SERVICE).strip()
            if container:
                self.storage = Node(0, STORAGE_SERVICE, STORAGE_URL, container)
                self.refresh_address(self.storage)

    def refresh_address(self, node: Node) -> None:
        """Re-reads one container's address (a restart may change it; its id stays)."""
        info = json.loads(run(["docker", "inspect", node.container]))[0]
        networks = info["NetworkSettings"]["Networks"]
        node.ip = next(iter(networks.values()))["IPAddress"] if networks else ""

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id - 1]

    def wait_ready(self, timeout_s: float = 120.0, nodes: Iterable[Node] | None = None) -> bool:
        return _wait_ready(nodes or self.nodes, timeout_s)

    def pid(self, node: Node) -> int:
        return int(run(["docker", "inspect", "-f", "{{.State.Pid}}", node.container]).strip())

    # Process faults.
    def kill(self, node: Node) -> None:
        run(["docker", "kill", "--signal", "KILL", node.container], check=False)

    def start(self, node: Node) -> None:
        run(["docker", "start", node.container])

    def pause(self, node: Node) -> None:
        # The freezer cgroup stops every thread at once, like SIGSTOP to the whole process tree.
        run(["docker", "pause", node.container])

    def resume(self, node: Node) -> None:
        run(["docker", "unpause", node.container], check=False)

    def is_running(self, node: Node) -> bool:
        out = run(["docker", "inspect", "-f", "{{.State.Status}}", node.container], check=False)
        return out.strip() == "running"

    # Network faults: nftables inside the node's own network namespace (entered from the host).
    def _in_netns(self, node: Node, argv: list[str], script: str = "", check: bool = True) -> None:
        """Runs a host tool (nft, tc) inside the node's network namespace."""
        if not self.is_running(node):
            return  # a killed node has no namespace; it comes back with no rules anyway
        entered = ["nsenter", "-t", str(self.pid(node)), "-n", *argv]
        done = subprocess.run(entered, input=script, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise ClusterError(f"{argv[0]} in {node.service} failed: {done.stderr.strip()}")

    def _nft(self, node: Node, script: str) -> None:
        self._in_netns(node, ["nft", "-f", "-"], script)

    def slow_down(self, node: Node, rate_kbit: int, queue_ms: int = 400) -> None:
        """Limits what `node` sends to `rate_kbit`; queueing then delays its messages by up to
        `queue_ms` (this kernel has no netem, but the token bucket filter works)."""
        tbf = ["tbf", "rate", f"{rate_kbit}kbit", "burst", "32kbit", "latency", f"{queue_ms}ms"]
        self._in_netns(node, ["tc", "qdisc", "replace", "dev", "eth0", "root", *tbf])

    def drop_from(self, node: Node, peers: Iterable[Node], loss_percent: int = 100) -> None:
        """Drops packets arriving at `node` from `peers` (all of them, or a random share)."""
        script = _drop_script(peers, loss_percent)
        if script:
            self._nft(node, script)

    def isolate(self, victim: Node) -> None:
        """Cuts `victim` off from every other node with one nft call in its own namespace: what
        it receives from them and what it sends to them is dropped (clients on the host still
        reach it). One call, so the cut lands at one moment even on a loaded machine, where
        installing a rule per node took seconds."""
        addrs = ", ".join(n.ip for n in self.nodes if n is not victim and n.ip)
        if not addrs:
            return
        self._nft(
            victim,
            f"table inet {NFT_TABLE} {{\n"
            f" chain input {{\n  type filter hook input priority 0;\n"
            f"  ip saddr {{ {addrs} }} drop\n }}\n"
            f" chain output {{\n  type filter hook output priority 0;\n"
            f"  ip daddr {{ {addrs} }} drop\n }}\n}}\n",
        )

    def heal(self, node: Node) -> None:
        self._nft(node, f"table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n")
        # Fails harmlessly when no shaping is installed.
        self._in_netns(node, ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)

    def heal_all(self) -> None:
        """Thaws paused nodes and lifts every network rule (killed nodes stay down); the object
        storage comes back whole (started again if it was stopped)."""
        for node in self.nodes:
            self._thaw_and_heal(node)
        if self.storage is not None:
            if not self.is_running(self.storage) and not self._paused(self.storage):
                self.start(self.storage)
                self.refresh_address(self.storage)
            self._thaw_and_heal(self.storage)

    def _paused(self, node: Node) -> bool:
        status = run(["docker", "inspect", "-f", "{{.State.Status}}", node.container], check=False)
        return status.strip() == "paused"

    def _thaw_and_heal(self, node: Node) -> None:
        if self._paused(node):
            self.resume(node)
        self.heal(node)


def _drop_script(peers: Iterable[Node], loss_percent: int = 100) -> str:
    """The nftables script that drops packets from `peers` (all, or a random share); "" when
    none of them has an address."""
    addrs = ", ".join(p.ip for p in peers if p.ip)
    if not addrs:
        return ""
    match = f"ip saddr {{ {addrs} }}"
    verdict = "drop" if loss_percent >= 100 else f"numgen random mod 100 < {loss_percent} drop"
    return (
        f"table inet {NFT_TABLE} {{\n chain input {{\n  type filter hook input priority 0;\n"
        f"  {match} {verdict}\n }}\n}}\n"
    )


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return 200 <= reply.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
