"""A queue shard's checkpoint is placed while commands are still on their way: proposals made
meanwhile are not held, and the checkpoint still holds exactly the state it follows, so a
replica replaying from it reaches the live state."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import configs, start_all

from raftline.node.broker import Broker
from raftline.node.controller import decode_command
from raftline.node.queues.state import QueueState
from raftline.node.shard import ShardReplica

pytestmark = pytest.mark.timeout(60)


def create(queue: str, at_ms: int) -> dict[str, Any]:
    return {
        "op": "create",
        "queue": queue,
        "topic": "t",
        "dead_letter_topic": None,
        "incarnation": queue,
        "at_ms": at_ms,
    }


async def queue_shard(broker: Broker) -> ShardReplica:
    await broker.create_topic("t", 1, 1, {})
    await broker.queue_call("q", "queue_create", {"topic": "t"})
    replica = next(r for r in broker.queues.replicas.values() if "q" in r.state.queues)
    replica._checkpoint_every = 0  # due at once
    return replica


async def test_proposals_made_while_a_checkpoint_is_placed_are_not_held(tmp_path: Path) -> None:
    (broker,) = await start_all(configs(tmp_path, 1))
    try:
        replica = await queue_shard(broker)
        group = broker.runtime.groups[replica.shard]
        earlier = asyncio.ensure_future(replica.propose(create("a", 1), 5.0))
        await asyncio.sleep(0)  # queued in the runtime, not applied
        placing = asyncio.ensure_future(replica.maybe_checkpoint(5.0))
        await asyncio.sleep(0)
        later = asyncio.ensure_future(replica.propose(create("b", 2), 5.0))
        await asyncio.sleep(0)
        queued = [decode_command(p.data).get("queue") for p in group.proposals]
        assert queued[-1] == "b"  # handed to Raft at once, not waiting for the checkpoint
        await asyncio.gather(earlier, later)
        assert await placing
    finally:
        await broker.stop()


async def test_a_checkpoint_placed_with_commands_in_flight_holds_their_effect(
    tmp_path: Path,
) -> None:
    (broker,) = await start_all(configs(tmp_path, 1))
    try:
        replica = await queue_shard(broker)
        group = broker.runtime.groups[replica.shard]
        in_flight = [
            asyncio.ensure_future(replica.propose(create(f"q{i}", i), 5.0)) for i in range(5)
        ]
        await asyncio.sleep(0)
        assert len(group.proposals) == 5  # appended or queued, none applied yet
        assert await replica.maybe_checkpoint(5.0)
        await asyncio.gather(*in_flight)
        index = replica.checkpoint_index
        assert index is not None
        (entry,) = group.core.entries(index, index)
        checkpoint = decode_command(entry.data)
        restored = QueueState.restore(checkpoint["snapshot"])
        assert checkpoint["after"] == index - 1
        assert {f"q{i}" for i in range(5)} <= set(restored.queues)
        assert restored == replica.state
    finally:
        await broker.stop()
