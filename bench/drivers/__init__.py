"""One driver per benchmarked system, all behind the interface in bench.drivers.base.

Owns the registry from system name to driver class.
"""

from __future__ import annotations

import importlib

from bench.drivers.base import Driver

# Imported lazily so that a missing client library only disables its own system.
DRIVERS: dict[str, str] = {
    "raftline": "bench.drivers.raftline:RaftlineDriver",
    # The same client; only the node's --fsync flag differs (bench.peers.RaftlineNoFsyncPeer).
    "raftline-nofsync": "bench.drivers.raftline:RaftlineDriver",
    # The same nodes as raftline; the client's default, idempotent producer.
    "raftline-idempotent": "bench.drivers.raftline:IdempotentRaftlineDriver",
    # The same nodes as raftline; the queue workloads' producer by POST, not produce streams.
    "raftline-post": "bench.drivers.raftline:PostRaftlineDriver",
    "nats": "bench.drivers.nats_js:NatsDriver",
    "rabbitmq-quorum": "bench.drivers.rabbitmq:QuorumQueueDriver",
    "rabbitmq-stream": "bench.drivers.rabbitmq_stream:StreamDriver",
    "redis": "bench.drivers.redis_streams:RedisStreamsDriver",
}


def driver_class(system: str) -> type[Driver]:
    """The driver class for a system name in DRIVERS."""
    if system not in DRIVERS:
        raise ValueError(f"unknown system {system!r}; known: {sorted(DRIVERS)}")
    module_name, class_name = DRIVERS[system].split(":")
    return getattr(importlib.import_module(module_name), class_name)
