"""Loopback ports for the nodes tests and benchmarks start, and how to tell that a node's start
lost one of its ports to another process.

Owns picking free ports outside the kernel's ephemeral range. A port picked by binding port 0
comes from that range, which every outgoing connection on the machine draws from too: between
the pick and the node's own bind, any connection (another test's client, another node's dial)
could take it. Below the range only an explicit bind can take a port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_LOW_DEFAULT = 32768  # Linux's default when the range cannot be read
# Picked from the span below the ephemeral range, above the well-known and common service
# ports (databases, brokers, 8080s) that benchmarks' peers listen on.
PICK_SPAN = 12_000
PICK_FLOOR = 10_000
PICK_ATTEMPTS = 1000
# A start that lost a port to another process is tried again on new ports this many times.
PORT_RETRIES = 3
# Random, not sequential, so concurrent test runs on one machine rarely pick the same port;
# a generator of its own so tests that seed `random` do not make every run pick alike.
_choice = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT


def pick_span() -> tuple[int, int]:
    """The ports [low, high) picked from: below the ephemeral range (empty if none is left)."""
    high = _ephemeral_low()
    return max(PICK_FLOOR, high - PICK_SPAN), high


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports on `host`, each free when picked, below the ephemeral range when
    that leaves room (else any the kernel hands out). A port can still be taken before its
    user binds it: callers retry the start (see `lost_a_port`)."""
    low, high = pick_span()
    held: list[socket.socket] = []
    try:
        for _ in range(PICK_ATTEMPTS):
            if len(held) == count:
                break
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # No SO_REUSEADDR: a port with connections still in TIME_WAIT is passed over.
            try:
                probe.bind((host, _choice.randrange(low, high) if high - low >= count else 0))
            except OSError:
                probe.close()
                continue
            held.append(probe)  # held until every port is picked: no port is picked twice
        if len(held) < count:
            raise RuntimeError(f"no {count} free ports in {low}-{high - 1} on {host}")
        return [probe.getsockname()[1] for probe in held]
    finally:
        for probe in held:
            probe.close()


def lost_a_port(log_text: str) -> bool:
    """Whether a node's output says it could not bind an address (EADDRINUSE), in the words of
    asyncio, uvloop and the OS alike."""
    return "address already in use" in log_text.lower()
