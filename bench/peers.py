"""Installs, starts and stops the benchmarked brokers on 127.0.0.1 with data under a temp folder.

Owns one Peer class per system: process launch, readiness probe, and stop by process id.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.drivers.base import Endpoint
from bench.ports import free_ports

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
RAFTLINE_READY_TIMEOUT_S = 30.0

# Debian packages and Python client modules each peer needs (module name -> PyPI name).
APT_PACKAGES = {"nats": ["nats-server"], "rabbitmq": ["rabbitmq-server"], "redis": ["redis-server"]}
PIP_MODULES = {
    "nats": {"nats": "nats-py"},
    "rabbitmq": {"aio_pika": "aio-pika", "rstream": "rstream"},
    "redis": {"redis": "redis", "hiredis": "hiredis"},
    "raftline": {"aiohttp": "aiohttp"},
}
BINARIES = {
    "nats": "nats-server",
    "rabbitmq": "/usr/lib/rabbitmq/bin/rabbitmq-server",
    "redis": "redis-server",
}


class PeerError(RuntimeError):
    """A peer could not be installed, did not become ready, or died."""


def free_port() -> int:
    """A loopback TCP port nobody listens on right now, below the ephemeral range."""
    [port] = free_ports(1, HOST)
    return port


def ensure_installed(peer: str) -> None:
    """apt-get and pip install what `peer` (a Peer's `system`) needs, only where it is missing."""
    binary = BINARIES.get(peer)
    if binary and shutil.which(binary) is None and not Path(binary).exists():
        if os.geteuid() != 0:
            raise PeerError(f"{binary} is missing; run: apt-get install {APT_PACKAGES[peer][0]}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", *APT_PACKAGES[peer]], check=True, env=env)
    ensure_modules(PIP_MODULES.get(peer, {}))


def ensure_modules(modules: dict[str, str]) -> None:
    """pip install the PyPI package of every module (name -> package) that does not import."""
    missing = []
    for module, package in modules.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def _wait_for(
    probe_name: str, probe: object, timeout: float, processes: list[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise PeerError(
                    f"{probe_name}: process {process.pid} exited with {process.returncode}"
                )
        if probe():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise PeerError(f"{probe_name}: not ready after {timeout:.0f} s")


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


def _http_json(url: str) -> object | None:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return json.loads(response.read() or b"null")
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class Peer:
    """A set of server processes of one system; subclasses say how to launch and probe them."""

    system = ""

    def __init__(self, replicas: int = 1, workdir: Path | None = None) -> None:
        self.replicas = replicas
        self.own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"raftline-bench-{self.system}-"))
        self.processes: list[subprocess.Popen[bytes]] = []
        self.version = ""

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "wb") as log:
            # Own session: the stop below may signal the whole group these processes made.
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def start(self) -> Endpoint:
        raise NotImplementedError

    def stop(self) -> None:
        """SIGTERM every process we started, SIGKILL what outlives the timeout, remove the data."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
            # Children such as beam's erl_child_setup live in the session we created for them.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        self.processes.clear()
        if self.own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        text = []
        for path in sorted((self.workdir / "logs").glob("*.log")):
            text.append(
                f"--- {path.name}\n"
                + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            )
        return "\n".join(text)


class NatsPeer(Peer):
    """nats-server with JetStream; three replicas form a cluster of three on loopback ports."""

    system = "nats"

    def start(self) -> Endpoint:
        self.version = _first_line(["nats-server", "--version"])
        client_ports = [free_port() for _ in range(self.replicas)]
        monitor_ports = [free_port() for _ in range(self.replicas)]
        route_ports = [free_port() for _ in range(self.replicas)]
        for i in range(self.replicas):
            config = [
                f"server_name: n{i + 1}",
                f"listen: {HOST}:{client_ports[i]}",
                f"http: {HOST}:{monitor_ports[i]}",
                f'jetstream {{ store_dir: "{self.workdir / f"n{i + 1}"}" }}',
            ]
            if self.replicas > 1:
                routes = ", ".join(f"nats-route://{HOST}:{p}" for p in route_ports)
                listen = f"{HOST}:{route_ports[i]}"
                config.append(f"cluster {{ name: bench, listen: {listen}, routes: [{routes}] }}")
            path = self.workdir / f"n{i + 1}.conf"
            path.write_text("\n".join(config) + "\n")
            self._spawn(f"nats-n{i + 1}", ["nats-server", "-c", str(path)])

        def ready() -> bool:
            if not all(_http_ok(f"http://{HOST}:{p}/healthz") for p in monitor_ports):
                return False
            if self.replicas == 1:
                return True
            jsz = _http_json(f"http://{HOST}:{monitor_ports[0]}/jsz")
            return isinstance(jsz, dict) and bool((jsz.get("meta_cluster") or {}).get("leader"))

        _wait_for("nats", ready, READY_TIMEOUT_S, self.processes)
        return Endpoint(HOST, {"client": client_ports[0]}, self.replicas)


class RabbitPeer(Peer):
    """RabbitMQ nodes with the stream plugin and a private epmd; nodes 2..n join node 1."""

    system = "rabbitmq"

    def start(self) -> Endpoint:
        epmd = free_port()
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex())
        cookie.chmod(0o400)
        names = [f"rabbit-bench-{i + 1}@localhost" for i in range(self.replicas)]
        ports = [{"amqp": free_port(), "stream": free_port()} for _ in names]
        common = {
            "HOME": str(home),
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "ERL_EPMD_ADDRESS": HOST,
            "ERL_EPMD_PORT": str(epmd),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "PATH": "/usr/lib/rabbitmq/bin:" + os.environ.get("PATH", ""),
        }
        self._spawn("epmd", ["epmd", "-port", str(epmd), "-address", HOST], common)
        subprocess.run(
            ["rabbitmq-plugins", "enable", "--offline", "rabbitmq_stream"],
            env={**os.environ, **common, "RABBITMQ_NODENAME": names[0]},
            check=True,
            capture_output=True,
            timeout=120,
        )
        for i, name in enumerate(names):
            config = [
                f"listeners.tcp.default = {HOST}:{ports[i]['amqp']}",
                f"stream.listeners.tcp.default = {HOST}:{ports[i]['stream']}",
                "stream.advertised_host = localhost",
                f"stream.advertised_port = {ports[i]['stream']}",
                "loopback_users = none",
            ]
            if i > 0:  # the later nodes discover and join the first one at their first boot
                config += [
                    "cluster_formation.peer_discovery_backend = classic_config",
                    f"cluster_formation.classic_config.nodes.1 = {names[0]}",
                ]
            (self.workdir / f"rabbitmq{i + 1}.conf").write_text("\n".join(config) + "\n")
            env = {
                **common,
                "RABBITMQ_NODENAME": name,
                "RABBITMQ_DIST_PORT": str(free_port()),
                "RABBITMQ_MNESIA_BASE": str(self.workdir / f"mnesia{i + 1}"),
                "RABBITMQ_LOG_BASE": str(self.workdir / f"log{i + 1}"),
                "RABBITMQ_CONFIG_FILE": str(self.workdir / f"rabbitmq{i + 1}"),
                "RABBITMQ_PID_FILE": str(self.workdir / f"rabbit{i + 1}.pid"),
            }
            self._spawn(f"rabbitmq-{i + 1}", ["rabbitmq-server"], env)
            _wait_for(
                f"rabbitmq node {i + 1}",
                lambda p=ports[i]: _port_open(p["amqp"]) and _port_open(p["stream"]),
                READY_TIMEOUT_S,
                self.processes,
            )
        if self.replicas > 1:
            _wait_for(
                "rabbitmq cluster",
                lambda: _rabbit_running_nodes({**os.environ, **common}, names[0]) >= len(names),
                READY_TIMEOUT_S,
                self.processes,
            )
        self.version = "rabbitmq-server " + _dpkg_version("rabbitmq-server")
        return Endpoint(HOST, ports[0], self.replicas)


def _rabbit_running_nodes(env: dict[str, str], node: str) -> int:
    try:
        out = subprocess.run(
            ["rabbitmqctl", "-n", node, "cluster_status", "--formatter", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return len(json.loads(out.stdout).get("running_nodes", []))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


class RedisPeer(Peer):
    """redis-server with the AOF fsynced on every write; replicas follow the first server."""

    system = "redis"
    appendfsync = "always"

    def start(self) -> Endpoint:
        import redis

        self.version = _first_line(["redis-server", "--version"])
        ports = [free_port() for _ in range(self.replicas)]
        for i, port in enumerate(ports):
            data = self.workdir / f"r{i + 1}"
            data.mkdir(parents=True, exist_ok=True)
            argv = [
                "redis-server",
                "--bind",
                HOST,
                "--port",
                str(port),
                "--dir",
                str(data),
                "--appendonly",
                "yes",
                "--appendfsync",
                self.appendfsync,
                "--save",
                "",
            ]
            if i > 0:
                argv += ["--replicaof", HOST, str(ports[0])]
            self._spawn(f"redis-r{i + 1}", argv)

        def ready() -> bool:
            try:
                for i, port in enumerate(ports):
                    client = redis.Redis(host=HOST, port=port, socket_timeout=1)
                    info = client.info("replication")
                    client.close()
                    if i > 0 and info.get("master_link_status") != "up":
                        return False
                return True
            except redis.RedisError:
                return False

        _wait_for("redis", ready, READY_TIMEOUT_S, self.processes)
        return Endpoint(HOST, {"redis": ports[0]}, self.replicas, {"appendfsync": self.appendfsync})


class RaftlinePeer(Peer):
    """`raftline serve` nodes from this repository's virtualenv, one Raft group per partition."""

    system = "raftline"
    fsync = "always"  # the node's default, stated here so results say what was measured

    def start(self) -> Endpoint:
        binary = Path(sys.executable).parent / "raftline"
        if not binary.exists():
            raise PeerError(f"{binary} is missing; run `make install` first")
        http_ports = [free_port() for _ in range(self.replicas)]
        raft_ports = [free_port() for _ in range(self.replicas)]
        peers = ",".join(f"{i + 1}={HOST}:{p}" for i, p in enumerate(raft_ports))
        for i in range(self.replicas):
            self._spawn(
                f"raftline-n{i + 1}",
                [
                    str(binary),
                    "serve",
                    "--node-id",
                    str(i + 1),
                    "--data-dir",
                    str(self.workdir / f"n{i + 1}"),
                    "--http",
                    f"{HOST}:{http_ports[i]}",
                    "--raft",
                    f"{HOST}:{raft_ports[i]}",
                    "--peers",
                    peers,
                    "--fsync",
                    self.fsync,
                ],
            )
        _wait_for(
            "raftline",
            lambda: all(_http_ok(f"http://{HOST}:{p}/readyz") for p in http_ports),
            RAFTLINE_READY_TIMEOUT_S,
            self.processes,
        )
        self.version = "raftline (this tree)"
        return Endpoint(HOST, {"http": http_ports[0]}, self.replicas, {"fsync": self.fsync})


class RaftlineNoFsyncPeer(RaftlinePeer):
    """The same nodes with `--fsync never`: the durability class of NATS 2.9 and RabbitMQ streams.

    A node then writes every round of entries to its segment files (one write, page cache) and
    counts them as stored without an fsync; the driver's durability statement says what that keeps.
    """

    fsync = "never"


PEERS: dict[str, type[Peer]] = {
    "nats": NatsPeer,
    "rabbitmq": RabbitPeer,
    "redis": RedisPeer,
    "raftline": RaftlinePeer,
    "raftline-nofsync": RaftlineNoFsyncPeer,
}


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except OSError:
        return "unknown"
    return (
        (out.stdout or out.stderr).strip().splitlines()[0]
        if (out.stdout or out.stderr)
        else "unknown"
    )


def _dpkg_version(package: str) -> str:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"
