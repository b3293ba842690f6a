"""Queue shards replicated over three in-process brokers: calls through any node reach the
queue's shard leader; every replica applies the same queue state; after the shard leader is
stopped, and then the data partition's leader, no acknowledged record is delivered again,
in-flight records come back with a higher delivery count, and every record ends acknowledged
exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import configs, start_all, wait_for

from raftline.node.broker import Broker, BrokerError
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(120)


async def retry(brokers: list[Broker], call: Any) -> Any:
    for _ in range(300):
        for broker in brokers:
            try:
                return await call(broker)
            except BrokerError as exc:
                if not exc.retryable:
                    raise
        await asyncio.sleep(0.05)
    raise AssertionError("never succeeded")


def shard_leader(brokers: list[Broker]) -> Broker:
    return next(
        b
        for b in brokers
        for r in b.queues.replicas.values()
        if r.serving and "q" in r.state.queues
    )


async def test_acknowledged_records_survive_shard_and_partition_leader_stops(
    tmp_path: Path,
) -> None:
    cfgs = configs(tmp_path, 3)
    brokers = await start_all(cfgs)
    live = list(brokers)
    acked: set[int] = set()
    try:
        await brokers[0].create_topic("t", 1, 3, {})
        for _ in range(2):
            batch = build_batch([Record(f"m{i}".encode()) for i in range(10)])
            await retry(live, lambda b, batch=batch: b.produce("t", 0, batch, "all"))
        create = {"topic": "t", "lock_ms": 1_500, "max_deliveries": 5, "dead_letter_topic": None}
        await retry(live, lambda b: b.queue_call("q", "queue_create", create))

        async def receive(n: int, via: list[Broker]) -> list[dict[str, Any]]:
            args = {"max_messages": n, "wait_ms": 0}
            answer = await retry(via, lambda b: b.queue_call("q", "queue_receive", args))
            return list(answer["messages"])

        async def ack(messages: list[dict[str, Any]], via: list[Broker]) -> list[Any]:
            args = {"receipts": [m["receipt"] for m in messages], "outcome": "accept"}
            answer = await retry(via, lambda b: b.queue_call("q", "queue_ack", args))
            return list(answer["results"])

        got = await receive(8, [brokers[1]])
        assert len(got) == 8
        assert all(r["ok"] for r in await ack(got, [brokers[2]]))
        acked |= {m["record"][0] for m in got}
        held = await receive(4, [brokers[0]])  # in flight when the leader goes
        assert len(held) == 4

        # every replica applies the same state
        def same() -> bool:
            states = [
                r.state
                for b in brokers
                for r in b.queues.replicas.values()
                if "q" in r.state.queues
            ]
            return len(states) == 3 and all(s == states[0] for s in states)

        await wait_for(same, 10)
        leader = shard_leader(brokers)
        await leader.stop()
        live.remove(leader)

        seen: list[tuple[int, int]] = []
        for _ in range(200):
            batch_got = await receive(5, live)
            if not batch_got:
                break
            for m in batch_got:
                offset = m["record"][0]
                assert offset not in acked, f"acknowledged {offset} delivered again"
                seen.append((offset, m["delivery_count"]))
            assert all(r["ok"] for r in await ack(batch_got[:3], live))
            acked |= {m["record"][0] for m in batch_got[:3]}
            if len(acked) >= 14:
                break
        # the records in flight at the old leader came back, counted again
        again = {o: c for o, c in seen if o in {m["record"][0] for m in held}}
        assert again and all(c == 2 for c in again.values()), seen

        # back to three nodes, then the data partition's leader goes too
        restarted = Broker(leader.config)
        await restarted.start()
        live.append(restarted)
        await wait_for(lambda: restarted.ready(), 20)
        group = brokers[0].meta.state.topics["t"].group(0)
        await wait_for(
            lambda: any(b.runtime.leader_view.leader_of(group) == b.node_id for b in live), 20
        )
        partition_leader = next(
            b for b in live if b.runtime.leader_view.leader_of(group) == b.node_id
        )
        await partition_leader.stop()
        live.remove(partition_leader)

        deadline = asyncio.get_running_loop().time() + 30
        while len(acked) < 20 and asyncio.get_running_loop().time() < deadline:
            batch_got = await receive(5, live)
            for m in batch_got:
                assert m["record"][0] not in acked, "an acknowledged record came back"
            results = await ack(batch_got, live)
            for m, r in zip(batch_got, results, strict=True):
                if r["ok"]:
                    acked.add(m["record"][0])
            if not batch_got:
                await asyncio.sleep(0.3)  # in-flight locks of the stopped leader expire
        assert len(acked) == 20
        described = await retry(live, lambda b: b.queue_call("q", "queue_describe", {}))
        assert described["acknowledged"] == 20, described
        assert described["available"] == 0 and described["locked"] == 0
        assert await receive(10, live) == []
    finally:
        for broker in live:
            await broker.stop()


async def test_checkpoints_bound_the_shard_log_and_a_restart_replays_to_the_same_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raftline.node.queues import service

    monkeypatch.setattr(service, "CHECKPOINT_EVERY", 10)
    cfgs = configs(tmp_path, 1)
    brokers = await start_all(cfgs)
    try:
        broker = brokers[0]
        await broker.create_topic("t", 1, 1, {})
        await broker.produce("t", 0, build_batch([Record(b"x")] * 60), "all")
        await broker.queue_call("q", "queue_create", {"topic": "t", "lock_ms": 60_000})
        acked = set()
        for _ in range(10):  # 10 delivers and 10 settles: two checkpoints or more
            got = await broker.queue_call("q", "queue_receive", {"max_messages": 5})
            receipts = [m["receipt"] for m in got["messages"]]
            answer = await broker.queue_call("q", "queue_ack", {"receipts": receipts})
            assert all(r["ok"] for r in answer["results"])
            acked |= {m["record"][0] for m in got["messages"]}
        replica = next(r for r in broker.queues.replicas.values() if "q" in r.state.queues)
        shard = replica.shard

        def trimmed() -> bool:
            storage = broker.runtime.groups[shard].storage
            index = replica.checkpoint_index
            return index is not None and storage.first_index() == index > 0

        await wait_for(trimmed, 20)
        storage = broker.runtime.groups[shard].storage
        assert storage.last_index() - storage.first_index() < 3 * 10
        state = replica.state
        part = state.queues["q"].partitions[0]
        assert not part.deliveries and not part.settled  # the acknowledged prefix is compacted
        await broker.stop()
        brokers[0] = broker = Broker(cfgs[0])
        await broker.start()
        await wait_for(
            lambda: any(r.serving and r.state == state for r in broker.queues.replicas.values()),
            20,
        )
        rest: set[int] = set()
        for _ in range(20):
            got = await broker.queue_call("q", "queue_receive", {"max_messages": 50})
            if not got["messages"]:
                break
            rest |= {m["record"][0] for m in got["messages"]}
        assert len(rest) == 10 and not rest & acked
    finally:
        for broker in brokers:
            await broker.stop()
