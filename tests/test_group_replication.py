"""Coordinator shards replicated over three in-process brokers: every replica applies the same
state; checkpoints bound the log (it always starts with one), a follower that was down past a
trim point catches up from the checkpoint, and restarts replay to the same state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from inproc_harness import configs, start_all, wait_for

from raftline.node.broker import Broker, BrokerError
from raftline.node.coordinator import replica as replica_module
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(120)


async def group_call(brokers: list[Broker], method: str, args: dict) -> dict:
    for _ in range(200):
        for broker in brokers:
            try:
                return await broker.group_call("g", method, args)
            except BrokerError as exc:
                if not exc.retryable:
                    raise
        await asyncio.sleep(0.05)
    raise AssertionError(f"{method} never succeeded")


def shard_replicas(brokers: list[Broker]) -> list:
    found = []
    for broker in brokers:
        found += [r for r in broker.coordinator.replicas.values() if "g" in r.state.groups]
    return found


async def test_checkpoints_trim_every_replica_and_a_lagging_one_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_module, "CHECKPOINT_EVERY", 20)
    cfgs = configs(tmp_path, 3)
    brokers = await start_all(cfgs)
    try:
        await brokers[0].create_topic("t", 1, 3, {})
        for broker in brokers:
            try:
                await broker.produce("t", 0, build_batch([Record(b"x")] * 50), "all")
                break
            except BrokerError:
                continue
        join = {"member_id": "m", "topics": ["t"], "session_timeout_ms": 60_000}
        joined = await group_call(brokers, "group_join", join)
        await wait_for(lambda: len(shard_replicas(brokers)) == 3)
        # Stop a follower of the shard: it will miss several checkpoints.
        shard = shard_replicas(brokers)[0].shard
        follower = next(b for b in brokers if b.coordinator.replicas[shard].role != "leader")
        index = brokers.index(follower)
        await follower.stop()
        live = [b for b in brokers if b is not follower]
        for first in range(1, 51, 5):  # five at a time: checkpoints must wait for in-flight ones
            await asyncio.gather(
                *(
                    group_call(
                        live,
                        "group_commit",
                        {
                            "member_id": "m",
                            "generation": joined["generation"],
                            "offsets": [["t", 0, offset]],
                        },
                    )
                    for offset in range(first, first + 5)
                )
            )

        def trimmed(broker: Broker) -> bool:
            rep = broker.coordinator.replicas.get(shard)
            if rep is None or rep.checkpoint_index is None:
                return False
            storage = broker.runtime.groups[shard].storage
            return storage.first_index() == rep.checkpoint_index > 0

        await wait_for(lambda: all(trimmed(b) for b in live), timeout=20)
        restarted = Broker(cfgs[index])
        await restarted.start()
        brokers[index] = restarted
        await wait_for(lambda: trimmed(restarted), timeout=30)
        states = [b.coordinator.replicas[shard].state for b in brokers]
        await wait_for(
            lambda: all(
                b.coordinator.replicas[shard].state.groups["g"].offsets == {("t", 0): 50}
                for b in brokers
            ),
            timeout=20,
        )
        states = [b.coordinator.replicas[shard].state for b in brokers]
        assert states[0] == states[1] == states[2]
        # Every log holds at most about CHECKPOINT_EVERY commands after its checkpoint.
        for broker in brokers:
            storage = broker.runtime.groups[shard].storage
            assert storage.last_index() - storage.first_index() < 3 * 20
        # A restart replays from the checkpoint to the same state.
        await brokers[0].stop()
        brokers[0] = Broker(cfgs[0])
        await brokers[0].start()
        await wait_for(
            lambda: (
                shard in brokers[0].coordinator.replicas
                and brokers[0].coordinator.replicas[shard].state == states[1]
            ),
            timeout=20,
        )
    finally:
        for broker in brokers:
            await broker.stop()


async def test_calls_on_a_leader_that_loses_its_quorum_fail_fast_and_retryable(
    tmp_path: Path,
) -> None:
    brokers = await start_all(configs(tmp_path, 3))
    stopped: list[Broker] = []
    try:
        await brokers[0].create_topic("t", 1, 3, {})
        join = {"member_id": "m", "topics": ["t"], "session_timeout_ms": 60_000}
        joined = await group_call(brokers, "group_join", join)
        await wait_for(lambda: len(shard_replicas(brokers)) == 3)
        shard = shard_replicas(brokers)[0].shard
        leader = next(b for b in brokers if b.coordinator.replicas[shard].role == "leader")
        stopped = [b for b in brokers if b is not leader]
        for broker in stopped:
            await broker.stop()
        started = asyncio.get_running_loop().time()
        with pytest.raises(BrokerError) as failure:
            await leader.group_call(
                "g",
                "group_commit",
                {"member_id": "m", "generation": joined["generation"], "offsets": [["t", 0, 0]]},
            )
        elapsed = asyncio.get_running_loop().time() - started
        assert failure.value.code == "leader_unavailable" and failure.value.retryable
        # Check-quorum steps the leader down within an election timeout or two; the pending
        # commit fails then, long before the 10 s request timeout.
        print(f"\npending commit failed {elapsed:.2f} s after the quorum was lost")
        assert elapsed < 3.0, elapsed
    finally:
        for broker in brokers:
            if broker not in stopped:
                await broker.stop()
