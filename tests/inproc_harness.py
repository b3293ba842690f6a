"""In-process brokers for tests: one broker behind aiohttp's test server, or several on one loop.

Owns their loopback ports, configs, start and readiness waits; conftest builds fixtures on them.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.ports import PORT_RETRIES, free_ports
from raftline.api.app import create_app
from raftline.api.body_intake import IntakeAppRunner
from raftline.node.broker import Broker
from raftline.node.config import NodeConfig
from raftline.raftlog.records import Record, build_batch

# Starts that lost a port to another process (EADDRINUSE) are tried again on new ports this often.


class NodeTestServer(TestServer):
    """aiohttp's test server on the node's own connection protocol (api/body_intake.py)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return IntakeAppRunner(self.app, **kwargs)


@asynccontextmanager
async def serving(
    data_dir: Path, test_hooks: bool = False
) -> AsyncIterator[tuple[TestClient, Broker]]:
    """One started broker and an HTTP test client on it, yielded once /readyz answers 200."""
    http_port, raft_port = free_ports(2)
    config = NodeConfig(
        node_id=1,
        data_dir=data_dir,
        http=f"127.0.0.1:{http_port}",
        raft=f"127.0.0.1:{raft_port}",
        fsync="never",
        test_hooks=test_hooks,
    )
    [broker] = await start_all([config])
    client = TestClient(NodeTestServer(create_app(broker, self_http=config.http)))
    await client.start_server()
    try:
        for _ in range(200):
            if (await client.get("/readyz")).status == 200:
                break
            await asyncio.sleep(0.05)
        yield client, broker
    finally:
        await client.close()
        await broker.stop()


async def call(api: TestClient, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, JSON body or None) of one request through a test client."""
    response = await api.request(method, path, json=body)
    text = await response.text()
    return response.status, (await response.json()) if text else None


async def ok(api: TestClient, method: str, path: str, body: Any = None) -> Any:
    """The body of a request that must succeed (2xx)."""
    status, answer = await call(api, method, path, body)
    assert status in (200, 201, 204), (method, path, status, answer)
    return answer


def configs(tmp_path: Path, size: int) -> list[NodeConfig]:
    ports = free_ports(2 * size)
    peers = {i + 1: f"127.0.0.1:{ports[i]}" for i in range(size)}
    return [
        NodeConfig(
            node_id=i + 1,
            data_dir=tmp_path / f"node{i + 1}",
            raft=peers[i + 1],
            http=f"127.0.0.1:{ports[size + i]}",
            peers=peers if size > 1 else {},
            leader_settle_s=3600,  # keep leadership where the tests put it
        )
        for i in range(size)
    ]


async def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def give_new_ports(cfgs: list[NodeConfig]) -> None:
    """Moves a whole cluster's configs (in place, so a caller's later restarts use them) to
    new free ports."""
    ports = free_ports(2 * len(cfgs))
    raft = {c.node_id: f"127.0.0.1:{p}" for c, p in zip(cfgs, ports[: len(cfgs)], strict=True)}
    for config, http_port in zip(cfgs, ports[len(cfgs) :], strict=True):
        config.raft, config.http = raft[config.node_id], f"127.0.0.1:{http_port}"
        config.peers = dict(raft) if config.peers else {}


async def start_all(cfgs: list[NodeConfig]) -> list[Broker]:
    """Started brokers, once all are ready. Should another process take a port between its
    pick and a broker's bind, and `cfgs` be a whole cluster (restarting part of one, the rest
    know its address), they all start again on new ports."""
    whole = all(set(c.peers) <= {d.node_id for d in cfgs} for c in cfgs)
    for attempt in range(PORT_RETRIES + 1):
        brokers = [Broker(c) for c in cfgs]
        try:
            for broker in brokers:
                await broker.start()
            break
        except OSError as error:
            for broker in brokers:
                await broker.stop()
            if error.errno != errno.EADDRINUSE or not whole or attempt == PORT_RETRIES:
                raise
            give_new_ports(cfgs)
    await wait_for(lambda: all(b.ready() for b in brokers))
    return brokers


async def short_retention_log(broker: Broker, name: str = "short") -> Any:
    """The replica of a one-partition topic with 2 KB segments and 4 KB retention, written
    past that retention (60 records of ~200 bytes, one per produce)."""
    settings = {"segment.bytes": "2048", "retention.bytes": "4096"}
    await broker.create_topic(name, 1, 1, settings)
    for i in range(60):
        batch = build_batch([Record(f"{i:04d}".encode() + b"v" * 200)])
        await broker.produce(name, 0, batch, "all")
    return next(r for r in broker.partitions.values() if r.topic == name)


class HttpCluster:
    """Started brokers, each behind an aiohttp server on its config's HTTP address."""

    def __init__(self, cfgs: list[NodeConfig], brokers: list[Broker]) -> None:
        self.brokers = brokers
        self.urls = [f"http://{c.http}" for c in cfgs]
        self.runners: list[web.AppRunner] = []
        self.live = list(range(len(brokers)))

    async def serve(self, cfgs: list[NodeConfig]) -> None:
        for broker, config in zip(self.brokers, cfgs, strict=True):
            runner = web.AppRunner(create_app(broker, self_http=config.http))
            await runner.setup()
            host, port = config.http.rsplit(":", 1)
            await web.TCPSite(runner, host, int(port)).start()
            self.runners.append(runner)

    def url_of(self, broker: Broker) -> str:
        return self.urls[self.brokers.index(broker)]

    async def stop(self, index: int) -> None:
        """Stops one node, HTTP and all."""
        self.live.remove(index)
        await self.runners[index].cleanup()
        await self.brokers[index].stop()

    async def close(self) -> None:
        for i, (runner, broker) in enumerate(zip(self.runners, self.brokers, strict=False)):
            if i in self.live:
                await runner.cleanup()
                await broker.stop()


@asynccontextmanager
async def http_cluster(tmp_path: Path, size: int) -> AsyncIterator[HttpCluster]:
    """`size` started brokers serving HTTP; the live ones stop on exit."""
    cfgs = configs(tmp_path, size)
    cluster = HttpCluster(cfgs, await start_all(cfgs))
    try:
        await cluster.serve(cfgs)
        yield cluster
    finally:
        await cluster.close()
