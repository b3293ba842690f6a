"""A node pair's link across a network partition's heal, with the kernel's own TCP behaviour.

Packets are dropped by nftables in a network namespace of the test's own (needs root, `ip` and
`nft`), so retransmissions back off as they do in the compose cluster's partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from raftline.node.transport import Transport

CLONE_NEWNET = 0x40000000
PORTS = {1: 7101, 2: 7102}  # free: the namespace is new
TICK_S = 0.05
DEAD_AFTER_S = 1.0
# Far below the retransmission timeout the cut lets Linux's default backoff reach (over 5 s),
# generous for a loaded machine.
HEALED_WITHIN_S = 3.0

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid")
    or os.geteuid() != 0
    or not (shutil.which("nft") and shutil.which("ip")),
    reason="needs root, nft and ip for a network namespace of its own",
)


def in_own_network(scenario: Callable[[], Awaitable[float]]) -> float:
    """Runs `scenario` on an event loop in a thread that moved into a new network namespace
    (a namespace belongs to a thread; the tools it starts inherit it)."""
    outcome: dict[str, Any] = {}

    def thread() -> None:
        try:
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                outcome["skip"] = os.strerror(ctypes.get_errno())
                return
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            outcome["value"] = asyncio.run(scenario())
        except BaseException as exc:  # handed to the test's own thread
            outcome["error"] = exc

    runner = threading.Thread(target=thread)
    runner.start()
    runner.join()
    if "skip" in outcome:
        pytest.skip(f"no network namespace: {outcome['skip']}")
    if "error" in outcome:
        raise outcome["error"]
    return float(outcome["value"])


def cut() -> None:
    """Drops every packet to and from node 2's port, as a partition between the two does,
    counting the SYNs of node 1's dials."""
    port = PORTS[2]
    script = (
        "table inet cut {\n chain input {\n  type filter hook input priority 0;\n"
        f"  tcp dport {port} tcp flags & (syn | ack) == syn counter\n"
        f"  tcp dport {port} drop\n  tcp sport {port} drop\n }}\n}}\n"
    )
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)


def syns_dropped() -> int:
    listed = subprocess.run(
        ["nft", "list", "chain", "inet", "cut", "input"], capture_output=True, text=True, check=True
    )
    counted = re.search(r"counter packets (\d+)", listed.stdout)
    assert counted is not None, listed.stdout
    return int(counted.group(1))


def heal() -> None:
    subprocess.run(["nft", "delete", "table", "inet", "cut"], check=True)


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[tuple[Transport, Transport]]:
    """Nodes 1 (the dialer) and 2, ticking as a node does."""
    peers = {n: f"127.0.0.1:{port}" for n, port in PORTS.items()}

    async def no_rpc(peer: int, method: str, args: Any) -> Any:
        return None

    nodes = [
        Transport(
            n,
            peers[n],
            peers,
            lambda peer, msgs, notices: None,
            no_rpc,
            lambda peer, up, revived: None,
            lambda peer: None,
            DEAD_AFTER_S,
            TICK_S,
        )
        for n in PORTS
    ]

    async def tick() -> None:
        while True:
            for node in nodes:
                node.tick()
            await asyncio.sleep(TICK_S)

    for node in nodes:
        await node.start()
    ticking = asyncio.ensure_future(tick())
    try:
        yield nodes[0], nodes[1]
    finally:
        ticking.cancel()
        for node in nodes:
            await node.stop()


async def until_linked(one: Transport, two: Transport, timeout_s: float) -> float:
    """Seconds until both nodes count the link alive."""
    started = time.monotonic()
    while not (one.alive(2) and two.alive(1)):
        assert time.monotonic() - started < timeout_s, "the link did not come back"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def backoffs(one: Transport) -> int:
    """tcp_info's tcpi_backoff of node 1's socket to node 2: how often its retransmission
    timeout doubled."""
    sock = one._links[2].transport.get_extra_info("socket")
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[4]


async def cut_kept_link_and_heal() -> float:
    async with pair() as (one, two):
        await until_linked(one, two, 10.0)
        cut()
        await asyncio.sleep(12.0)
        # Heal just after a retransmission: the next one is a whole timeout away.
        seen = backoffs(one)
        while backoffs(one) == seen:
            await asyncio.sleep(0.005)
        heal()
        return await until_linked(one, two, 30.0)


async def dial_into_cut_and_heal() -> float:
    cut()
    async with pair() as (one, two):
        # Past Linux's first SYN retries, a second apart (tcp_syn_linear_timeouts), then heal
        # just after a SYN: with the default backoff the next one is 8 s away.
        await asyncio.sleep(9.0)
        seen = syns_dropped()
        while syns_dropped() == seen:
            await asyncio.sleep(0.02)
        heal()
        return await until_linked(one, two, 30.0)


def test_a_link_cut_by_a_partition_carries_frames_again_soon_after_the_heal() -> None:
    assert in_own_network(cut_kept_link_and_heal) < HEALED_WITHIN_S


def test_a_node_dialing_into_a_partition_connects_soon_after_the_heal() -> None:
    assert in_own_network(dial_into_cut_and_heal) < HEALED_WITHIN_S
