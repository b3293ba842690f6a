"""In-process brokers for benchmarks: N Broker objects on one event loop, loopback ports.

Owns their configs (ports from a given base, or a free base), start and readiness wait, and
the leader lookup.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path

from bench.ports import pick_span
from raftline.node.broker import Broker
from raftline.node.config import NodeConfig

READY_TIMEOUT_S = 30.0


def configs(root: Path, size: int, port_base: int) -> list[NodeConfig]:
    """Node i gets Raft port port_base+50+i and HTTP port port_base+i (not served here)."""
    peers = {i: f"127.0.0.1:{port_base + 50 + i}" for i in range(1, size + 1)}
    return [
        NodeConfig(
            node_id=i,
            data_dir=root / f"node{i}",
            raft=peers[i],
            http=f"127.0.0.1:{port_base + i}",
            peers=peers if size > 1 else {},
        )
        for i in peers
    ]


def free_port_base() -> int:
    """A base whose HTTP (base+1..3) and Raft (base+51..53) ports are all free now: other
    benchmarks on this machine use fixed ranges. Below the ephemeral range (bench/ports.py), so
    no outgoing connection takes one before the brokers bind them."""
    low, high = pick_span()
    while True:
        base = random.randrange(low, high - 100, 100)
        try:
            for port in [base + i for i in (1, 2, 3, 51, 52, 53)]:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue


async def start_all(cfgs: list[NodeConfig]) -> list[Broker]:
    brokers = [Broker(c) for c in cfgs]
    for broker in brokers:
        await broker.start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(b.ready() for b in brokers):
        if time.monotonic() > deadline:
            raise TimeoutError("brokers did not become ready")
        await asyncio.sleep(0.02)
    return brokers


def leading(brokers: list[Broker], topic: str, partition: int = 0) -> Broker | None:
    """The broker whose replica of the partition currently leads, if any."""
    group = brokers[0].meta.state.topics[topic].group(partition)
    return next(
        (
            b
            for b in brokers
            if group in b.runtime.groups and b.runtime.groups[group].role == "leader"
        ),
        None,
    )
