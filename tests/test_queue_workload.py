"""A queue workload on three in-process brokers, checked by chaos/share_checker.py: receivers
that accept, release, reject or forget (their locks expire) what they receive, through random
nodes, while the queue shard's leader is stopped mid-run; then a drain. The history must show
no loss, no double acknowledgement, no redelivery after an acknowledgement, delivery counts
that only grow and stay within max_deliveries, and exactly justified dead letters."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import configs, start_all

from raftline.chaos.history import Op, index_ops
from raftline.chaos.share_checker import check
from raftline.node.broker import Broker, BrokerError, NotLeader
from raftline.raftlog.batch import parse_header
from raftline.raftlog.records import Record, build_batch, decode_batch

pytestmark = pytest.mark.timeout(180)

MAX_DELIVERIES = 3
RECORDS = 100  # at least; the producer sends all through the run


class Recorder:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.started = time.monotonic_ns()

    def add(self, process: int, kind: str, f: str, value: Any) -> None:
        now = time.monotonic_ns() - self.started
        self.ops.append(Op(process, kind, f, value, time=now))  # type: ignore[arg-type]


async def any_node(live: list[Broker], call: Any, tries: int = 200) -> Any:
    for attempt in range(tries):
        broker = live[attempt % len(live)]
        try:
            return await call(broker)
        except BrokerError as exc:
            if not exc.retryable:
                raise
        await asyncio.sleep(0.05)
    raise AssertionError("no node answered")


def dead_letters(batches: list[Any]) -> list[dict[str, Any]]:
    dead = []
    for raw in batches:
        if parse_header(raw).is_control:
            continue
        for record in decode_batch(bytes(raw)).records:
            headers = {k: (v or b"").decode() for k, v in record.headers}
            dead.append(
                {
                    "partition": int(headers["x-raftline-source-partition"]),
                    "offset": int(headers["x-raftline-source-offset"]),
                    "value": (record.value or b"").decode(),
                    "delivery_count": int(headers["x-raftline-delivery-count"]),
                    "reason": headers["x-raftline-death-reason"],
                }
            )
    return dead


async def test_receivers_with_a_shard_leader_stop_leave_a_clean_history(tmp_path: Path) -> None:
    brokers = await start_all(configs(tmp_path, 3))
    live = list(brokers)
    history = Recorder()
    rng = random.Random(11)
    try:
        await brokers[0].create_topic("t", 2, 3, {})
        await brokers[0].create_topic("t.dlq", 1, 3, {})
        create = {
            "topic": "t",
            "lock_ms": 300,
            "max_deliveries": MAX_DELIVERIES,
            "dead_letter_topic": "t.dlq",
        }
        await any_node(live, lambda b: b.queue_call("q", "queue_create", create))

        async def settle(process: int, outcome: str, messages: list[dict[str, Any]]) -> None:
            records = [[m["partition"], m["record"][0], m["delivery_count"]] for m in messages]
            invoke = {"outcome": outcome, "records": records}
            history.add(process, "invoke", "settle", invoke)
            args = {"receipts": [m["receipt"] for m in messages], "outcome": outcome}
            try:
                answer = await rng.choice(live).queue_call("q", "queue_ack", args)
            except BrokerError:
                history.add(process, "info", "settle", invoke)
                return
            results = [r["ok"] for r in answer["results"]]
            history.add(process, "ok", "settle", {**invoke, "results": results})

        async def receive(process: int, wait_ms: int) -> list[dict[str, Any]]:
            history.add(process, "invoke", "receive", {})
            args = {"max_messages": 4, "wait_ms": wait_ms}
            try:
                answer = await rng.choice(live).queue_call("q", "queue_receive", args)
            except BrokerError:
                history.add(process, "fail", "receive", {})
                await asyncio.sleep(0.05)
                return []
            messages = answer["messages"]
            seen = [
                {
                    "partition": m["partition"],
                    "offset": m["record"][0],
                    "value": m["record"][3].decode(),
                    "delivery_count": m["delivery_count"],
                }
                for m in messages
            ]
            history.add(process, "ok", "receive", {"messages": seen})
            return list(messages)

        async def receiver(process: int, until: float) -> None:
            while time.monotonic() < until:
                for m in await receive(process, 200):
                    action = rng.choices(
                        ["accept", "release", "reject", "forget"], [55, 20, 5, 20]
                    )[0]
                    if action != "forget":
                        await settle(process, action, [m])

        stopped_at: list[int] = []

        async def stop_shard_leader() -> None:
            await asyncio.sleep(1.5)
            leader = next(
                b
                for b in live
                for r in b.queues.replicas.values()
                if r.serving and "q" in r.state.queues
            )
            live.remove(leader)
            stopped_at.append(time.monotonic_ns() - history.started)
            await leader.stop()

        async def produce(partition: int, batch: bytes) -> int:
            for _ in range(100):
                for broker in list(live):
                    try:
                        return await broker.produce("t", partition, batch, "all")
                    except NotLeader:
                        continue  # nothing written: try the next node
                await asyncio.sleep(0.05)
            raise BrokerError("leader_unavailable", "no leader took the send")

        async def producer(until: float) -> None:
            """Sends all along, so that receivers have work before and after the stop."""
            i = 0
            while time.monotonic() < until or i < RECORDS:
                partition = i % 2
                value = f"v{i}"
                history.add(0, "invoke", "send", {"value": value})
                batch = build_batch([Record(value.encode())])
                try:
                    offset = await produce(partition, batch)
                except BrokerError:
                    history.add(0, "info", "send", {"value": value})
                    await asyncio.sleep(0.05)
                else:
                    done = {"value": value, "partition": partition, "offset": offset}
                    history.add(0, "ok", "send", done)
                i += 1
                await asyncio.sleep(0.01)

        until = time.monotonic() + 4
        await asyncio.gather(
            producer(until), *(receiver(p, until) for p in range(1, 5)), stop_shard_leader()
        )
        # drain: accept everything until nothing is available or locked
        for _ in range(200):
            got = await receive(9, 500)
            if got:
                await settle(9, "accept", got)
                continue
            described = await any_node(live, lambda b: b.queue_call("q", "queue_describe", {}))
            if described["available"] == 0 and described["locked"] == 0:
                break
            await asyncio.sleep(0.2)
        batches, _, _ = await any_node(live, lambda b: b.fetch("t.dlq", 0, 0, 1 << 20, 0))
        history.add(10, "invoke", "final", {})
        history.add(10, "ok", "final", {"dead": dead_letters(batches)})
        result = check(index_ops(history.ops), MAX_DELIVERIES)
        late = sum(1 for o in history.ops if o.f == "settle" and o.time > stopped_at[0])
        print(f"\nqueue workload: {result.stats}, {len(history.ops)} ops, {late} after the stop")

        assert result.valid, result.anomalies
        assert result.stats["sent"] >= RECORDS
        assert result.stats["acknowledged"] + result.stats["dead_lettered"] >= RECORDS
        assert result.stats["dead_lettered"] > 0 and result.stats["deliveries"] > RECORDS
        after = [o for o in history.ops if o.f == "settle" and o.time > stopped_at[0]]
        assert len(after) > 20, "the workload ended before the shard leader stopped"
    finally:
        for broker in live:
            await broker.stop()
