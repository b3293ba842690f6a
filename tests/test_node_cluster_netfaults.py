"""An in-process 3-node cluster whose node-to-node frames are delayed, reordered and duplicated.

Acked writes must all be in the committed log, once each, at their acked offsets, in order.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from inproc_harness import wait_for
from test_node_cluster import batch_of, leader_of

from raftline.node.broker import Broker, BrokerError, NotLeader
from raftline.node.netfaults import LinkFaults
from raftline.raftlog.records import iter_batches

pytestmark = pytest.mark.timeout(120)

PRODUCERS = 4
WRITES_EACH = 12


async def produce_once_acked(brokers: list[Broker], topic: str, value: bytes) -> int | None:
    """One attempt on whichever node takes it; None when no node acked it (an indefinite write)."""
    for broker in brokers:
        try:
            return await asyncio.wait_for(broker.produce(topic, 0, batch_of(value), "all"), 5)
        except NotLeader:
            continue
        except (BrokerError, TimeoutError):
            return None
    return None


async def producer(brokers: list[Broker], topic: str, name: int) -> list[tuple[bytes, int]]:
    """Writes WRITES_EACH values one after another; each retry is a new value, so a value in the
    log can only come from one attempt. Returns the acked (value, offset) pairs in ack order."""
    acked: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + 60
    for i in range(WRITES_EACH):
        attempt = 0
        while True:
            value = b"p%d-w%d-a%d" % (name, i, attempt)
            offset = await produce_once_acked(brokers, topic, value)
            if offset is not None:
                acked.append((value, offset))
                break
            assert time.monotonic() < deadline, "no node acked a write within 60 s"
            attempt += 1
            await asyncio.sleep(0.05)
    return acked


async def test_acked_writes_survive_delayed_reordered_and_duplicated_messages(
    cluster: list[Broker],
) -> None:
    await cluster[0].create_topic("delayed", 1, 3, {})
    faults = LinkFaults(delay_ms=40, jitter_ms=40, reorder=0.3, duplicate=0.3)
    for broker in cluster:
        broker.runtime.transport.link_faults = faults
    runs = await asyncio.gather(*(producer(cluster, "delayed", n) for n in range(PRODUCERS)))
    for broker in cluster:
        broker.runtime.transport.link_faults = None

    transports = [b.runtime.transport for b in cluster]
    assert sum(t.frames_held for t in transports) > 0
    assert sum(t.frames_duplicated for t in transports) > 0
    await wait_for(lambda: leader_of(cluster, "delayed") is not None)
    batches, _, _ = await leader_of(cluster, "delayed").fetch("delayed", 0, 0, 1 << 24, 0)
    log = [
        (record.offset, record.value)
        for decoded in iter_batches(b"".join(batches))
        if not decoded.header.is_control
        for record in decoded.records
    ]
    at_offset = dict(log)
    assert len(at_offset) == len(log) == len({value for _, value in log}), "a value appended twice"
    for acked in runs:
        assert len(acked) == WRITES_EACH
        for value, offset in acked:
            assert at_offset.get(offset) == value, f"acked {value!r} is not at offset {offset}"
        offsets = [offset for _, offset in acked]
        assert offsets == sorted(offsets), "one producer's acked writes are out of order"
