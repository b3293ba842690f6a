"""A follower that catches up from a Raft snapshot gets the producer state of what it skipped.

Three in-process brokers; a follower is stopped while an idempotent producer writes, a
transaction opens, and retention trims every live replica's log past all of it. Restarted, the
follower installs the leader's trim point as a snapshot (its log starts after those batches),
then is made the leader: it must still answer a retry with the original offsets, refuse a gap,
hold the last stable offset at the open transaction and accept its commit marker.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import configs, start_all, wait_for

from raftline.node.broker import Broker, BrokerError
from raftline.raftlog.records import Record, build_batch

pytestmark = pytest.mark.timeout(120)

TOPIC_CONFIG = {"segment.bytes": "2048", "retention.bytes": "4096"}


def group_of(brokers: list[Broker]) -> str:
    return brokers[0].meta.state.topics["t"].group(0)


def leader_of(brokers: list[Broker]) -> Broker:
    for broker in brokers:
        replica = broker.partitions.get(group_of(brokers))
        if replica is not None and replica._role == "leader":
            return broker
    raise LookupError("no leader")


async def on_leader(brokers: list[Broker], call: Any) -> Any:
    """`call(broker)` on the partition's leader, retried while leadership settles."""
    for _ in range(200):
        try:
            return await call(leader_of(brokers))
        except (LookupError, BrokerError) as exc:
            if isinstance(exc, BrokerError) and not exc.retryable:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("no leader answered")


async def retrying(call: Any) -> Any:
    """`call()` until it is not refused retryably (an election, e.g. of the metadata group
    whose leader was the stopped node)."""
    for _ in range(400):
        try:
            return await call()
        except BrokerError as exc:
            if not exc.retryable:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("still refused")


def idempotent(pid: int, seq: int) -> bytes:
    return build_batch(
        [Record(value=b"i%d" % seq)], producer_id=pid, producer_epoch=0, base_sequence=seq
    )


async def test_a_leader_that_caught_up_from_a_snapshot_dedups_and_knows_open_transactions(
    tmp_path: Path,
) -> None:
    cfgs = [dataclasses.replace(c, retention_check_s=0.1) for c in configs(tmp_path, 3)]
    brokers = await start_all(cfgs)
    try:
        await brokers[0].create_topic("t", 1, 3, TOPIC_CONFIG)
        group = group_of(brokers)
        await wait_for(lambda: all(group in b.partitions for b in brokers))
        await on_leader(brokers, lambda b: b.produce("t", 0, build_batch([Record(b"x")]), "all"))
        leader = leader_of(brokers)
        follower = next(b for b in brokers if b is not leader)
        index = brokers.index(follower)
        await follower.stop()
        live = [b for b in brokers if b is not follower]

        pid, _ = await retrying(leader.new_producer)
        offsets = []
        for seq in range(5):
            offsets.append(
                await on_leader(live, lambda b, s=seq: b.produce("t", 0, idempotent(pid, s), "all"))
            )
        txn = await retrying(lambda: leader.txn_call("tx", "txn_init", {"timeout_ms": 600_000}))
        tpid, tepoch = txn["producer_id"], txn["producer_epoch"]
        open_batch = build_batch(
            [Record(value=b"open")],
            producer_id=tpid,
            producer_epoch=tepoch,
            base_sequence=0,
            transactional=True,
        )
        txn_first, _ = await on_leader(
            live, lambda b: b.append("t", 0, open_batch, "all", transactional_id="tx")
        )
        filler = build_batch([Record(value=b"f" * 400)])
        trimmed_past = max(offsets[-1], txn_first)
        while min(b.runtime.groups[group].storage.first_index() for b in live) <= trimmed_past:
            await on_leader(live, lambda b: b.produce("t", 0, filler, "all"))
        hwm = leader.partitions[group].high_watermark

        restarted = Broker(cfgs[index])
        await restarted.start()
        brokers[index] = restarted
        await wait_for(lambda: group in restarted.partitions, timeout=30)
        storage = lambda: restarted.runtime.groups[group].storage  # noqa: E731
        await wait_for(
            lambda: (
                storage().first_index() > trimmed_past
                and restarted.partitions[group].high_watermark >= hwm
            ),
            timeout=30,
        )
        assert storage().first_index() > 0, "caught up from a snapshot, not from the log"

        leader = leader_of(brokers)
        leader.runtime.transfer_leadership(group, cfgs[index].node_id)
        await wait_for(lambda: restarted.partitions[group]._role == "leader", timeout=20)
        replica = restarted.partitions[group]

        retry, duplicate = await restarted.append("t", 0, idempotent(pid, 4), "all")
        assert (retry, duplicate) == (offsets[4], True)
        with pytest.raises(BrokerError) as gap:
            await restarted.append("t", 0, idempotent(pid, 7), "all")
        assert gap.value.code == "out_of_order_sequence"
        assert (await restarted.append("t", 0, idempotent(pid, 5), "all"))[1] is False

        lso = replica.producers.state.last_stable_offset(replica.high_watermark)
        assert lso == txn_first, "the open transaction holds the last stable offset"
        end = {"producer_id": tpid, "producer_epoch": tepoch, "commit": True}
        ended = await retrying(lambda: restarted.txn_call("tx", "txn_end", end))
        assert ended["producer_epoch"] > tepoch
        await wait_for(
            lambda: (
                replica.producers.state.last_stable_offset(replica.high_watermark)
                == replica.high_watermark
            )
        )
    finally:
        for broker in brokers:
            await broker.stop()
