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
        await wait_for(lambda: any(b.runtime.leader_of(group) == b.node_id for b in live), 20)
        partition_leader = next(b for b in live if b.runtime.leader_of(group) == b.node_id)
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
