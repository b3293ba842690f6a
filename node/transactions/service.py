"""The transaction coordinator duties of a node, on the shards of `__transactions` it leads.

Owns the calls of producers (init with a transactional id, add partitions on behalf of a
partition leader verifying a first transactional write, end a transaction), writing the markers
of every decided transaction to its partitions and then logging markers_written, resending the
markers a previous leader left pending, aborting transactions past their timeout, checkpoints,
and the producer id blocks a shard draws from the metadata allocator.

Invariants: a decision (Prepare*) is applied before any of its markers is written; a producer's
end call is answered only after markers_written has applied (so read_committed readers of every
partition see the outcome once the producer does); markers carry the shard's Raft term as the
coordinator epoch; at most one task per transactional id writes markers at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from raftline.node.eos.txn_coordinator import shard_for
from raftline.node.errors import BrokerError
from raftline.node.shard import ShardLeadership, ShardReplica
from raftline.node.transactions.state import TxnShardState, marker_dict

if TYPE_CHECKING:
    from raftline.node.broker import Broker

log = logging.getLogger(__name__)

TXN_TOPIC = "__transactions"
SHARDS = 4
TXN_TOPIC_CONFIG = {"segment.bytes": str(1 << 20), "retention.ms": "-1"}
TICK_S = 0.2  # how often a leader looks for expired transactions and pending markers
ID_BLOCK = 100  # producer ids a shard asks the metadata allocator for at a time
CHECKPOINT_EVERY = 1_000  # commands between checkpoints of a shard's log
MAX_TIMEOUT_MS = 15 * 60 * 1000

# coordinator error -> (API code, HTTP status, retryable)
ERRORS: dict[str, tuple[str, int, bool]] = {
    "producer_fenced": ("producer_fenced", 409, False),
    "invalid_producer_epoch": ("producer_fenced", 409, False),
    "invalid_producer_id_mapping": ("producer_fenced", 409, False),
    "unknown_transactional_id": ("unknown_transactional_id", 404, False),
    "concurrent_transactions": ("concurrent_transactions", 409, True),
    "invalid_txn_state": ("invalid_txn_state", 409, False),
    "epoch_exhausted": ("producer_fenced", 409, False),
    "producer_ids_exhausted": ("internal_error", 500, True),
}


def shard_of(transactional_id: str) -> int:
    return shard_for(transactional_id, SHARDS)


def txn_error(code: str) -> BrokerError:
    api_code, status, retryable = ERRORS.get(code, (code, 409, False))
    return BrokerError(
        api_code, f"transaction coordinator: {code}", status=status, retryable=retryable
    )


class TxnService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.shards: ShardLeadership[ShardReplica, None] = ShardLeadership(lambda term: None)
        self._completing: dict[tuple[str, str], asyncio.Task[None]] = {}  # (shard, tid) -> task
        self._ids_lock = asyncio.Lock()

    @property
    def _timeout(self) -> float:
        return self.broker.config.request_timeout_s

    # replicas come and go with the metadata

    def new_replica(self, shard: str) -> ShardReplica:
        replica = ShardReplica(
            self.broker.runtime, shard, TxnShardState(), (), "transaction", CHECKPOINT_EVERY
        )
        return self.shards.add(shard, replica)

    def drop_replica(self, shard: str) -> None:
        self.shards.drop(shard)

    def close(self) -> None:
        for task in list(self._completing.values()):
            task.cancel()
        self.shards.drop_all()

    @property
    def replicas(self) -> dict[str, ShardReplica]:
        """This node's replicas of the shards, by Raft group name."""
        return self.shards.replicas

    def _lead(self, shard: str) -> ShardReplica:
        return self.shards.serving(shard)

    def _state(self, shard: str) -> TxnShardState:
        state: TxnShardState = self._lead(shard).state
        return state

    async def _propose(self, shard: str, command: dict[str, Any]) -> dict[str, Any]:
        replica = self._lead(shard)
        command = {**command, "now_ms": self.broker.clock.now_ms()}
        return await replica.propose(command, self._timeout)

    # background: expiry, pending markers, checkpoints

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            for shard in list(self.replicas):
                try:
                    await self._tick(shard)
                except (TimeoutError, BrokerError) as exc:
                    log.debug("%s: transaction round: %s", shard, exc)
                except Exception:
                    log.exception("%s: transaction round failed", shard)

    async def _tick(self, shard: str) -> None:
        replica = self.replicas.get(shard)
        if replica is None or not replica.serving:
            return
        state: TxnShardState = replica.state
        for markers in state.coordinator.pending_markers():
            self._complete(shard, marker_dict(markers))
        now = self.broker.clock.now_ms()
        for tid, pid, epoch in state.coordinator.expire(now):
            command = {
                "op": "abort_expired",
                "transactional_id": tid,
                "producer_id": pid,
                "producer_epoch": epoch,
            }
            result = await self._propose(shard, command)
            if result.get("markers"):
                log.info("%s: transaction %r timed out: aborting", shard, tid)
                self._complete(shard, result["markers"])
        await replica.maybe_checkpoint(self._timeout)

    def _complete(self, shard: str, markers: dict[str, Any]) -> asyncio.Task[None]:
        """The task writing a decided transaction's markers, then markers_written (one per
        transactional id at a time)."""
        key = (shard, markers["transactional_id"])
        task = self._completing.get(key)
        if task is None or task.done():
            task = asyncio.ensure_future(self._write_markers(shard, markers))
            self._completing[key] = task
            task.add_done_callback(lambda done: _forget(self._completing, key, done))
        return task

    async def _write_markers(self, shard: str, markers: dict[str, Any]) -> None:
        coordinator_epoch = self._lead(shard).term
        await asyncio.gather(
            *(
                self.broker.write_marker(
                    str(topic),
                    int(partition),
                    producer_id=int(markers["producer_id"]),
                    producer_epoch=int(markers["producer_epoch"]),
                    commit=bool(markers["commit"]),
                    coordinator_epoch=coordinator_epoch,
                )
                for topic, partition in markers["partitions"]
            )
        )
        by_group: dict[str, list[list[Any]]] = {}
        for group, topic, partition, offset in markers.get("offsets", ()):
            by_group.setdefault(str(group), []).append([str(topic), int(partition), int(offset)])
        for group, offsets in by_group.items():  # a commit's offsets, once its markers are in
            await self.broker.group_call(group, "group_txn_offsets", {"offsets": offsets})
        command = {
            "op": "markers_written",
            "transactional_id": markers["transactional_id"],
            "producer_epoch": markers["producer_epoch"],
        }
        await self._propose(shard, command)

    # calls, run on the shard's leader (Router.on_leader_of brings them here)

    async def handle(self, method: str, args: Any) -> Any:
        if not isinstance(args, dict):
            raise BrokerError("invalid_request", f"bad transaction call {method!r}")
        shard = str(args.get("shard"))
        tid = str(args.get("transactional_id"))
        if method == "txn_init":
            return await self._init(shard, tid, int(args.get("timeout_ms", 60_000)))
        if method == "txn_add_partitions":
            command = {
                "op": "add_partitions",
                "transactional_id": tid,
                "producer_id": int(args["producer_id"]),
                "producer_epoch": int(args["producer_epoch"]),
                "partitions": [[str(t), int(p)] for t, p in args["partitions"]],
            }
            return self._answer(await self._propose(shard, command))
        if method == "txn_add_offsets":
            if args.get("member_id") is not None:  # KIP-447: fenced by the group's generation
                check = {k: args[k] for k in ("group", "member_id", "generation", "offsets")}
                await self.broker.group_call(str(args["group"]), "group_check_commit", check)
            command = {
                "op": "add_offsets",
                "transactional_id": tid,
                "producer_id": int(args["producer_id"]),
                "producer_epoch": int(args["producer_epoch"]),
                "group": str(args["group"]),
                "offsets": [[str(t), int(p), int(o)] for t, p, o in args["offsets"]],
            }
            return self._answer(await self._propose(shard, command))
        if method == "txn_end":
            command = {
                "op": "end_txn",
                "transactional_id": tid,
                "producer_id": int(args["producer_id"]),
                "producer_epoch": int(args["producer_epoch"]),
                "commit": bool(args["commit"]),
            }
            return await self._decided(shard, tid, await self._propose(shard, command))
        raise BrokerError("invalid_request", f"unknown transaction call {method!r}")

    async def _init(self, shard: str, tid: str, timeout_ms: int) -> dict[str, Any]:
        async with self._ids_lock:
            if self._state(shard).coordinator.ids.remaining() == 0:
                block = await self.broker.allocate_producer_ids(ID_BLOCK)
                await self._propose(shard, {"op": "producer_ids", **block})
        command = {"op": "init_producer", "transactional_id": tid, "timeout_ms": timeout_ms}
        result = await self._propose(shard, command)
        if result.get("error") == "concurrent_transactions":
            # an earlier decision's markers are still being written: finish them, then again
            await self._finish_pending(shard, tid)
            result = await self._propose(shard, command)
        return await self._decided(shard, tid, result)

    async def _finish_pending(self, shard: str, tid: str) -> None:
        for markers in self._state(shard).coordinator.pending_markers():
            if markers.transactional_id == tid:
                await self._complete(shard, marker_dict(markers))

    async def _decided(self, shard: str, tid: str, result: dict[str, Any]) -> dict[str, Any]:
        """Answer a call whose command may have made a decision: its markers written first."""
        if result.get("markers"):
            await asyncio.shield(self._complete(shard, result["markers"]))
        elif result.get("error") is None:
            # a retried end: the first try's markers may still be on their way
            task = self._completing.get((shard, tid))
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)
        return self._answer(result)

    @staticmethod
    def _answer(result: dict[str, Any]) -> dict[str, Any]:
        if result.get("error") is not None:
            raise txn_error(str(result["error"]))
        return {"producer_id": result["producer_id"], "producer_epoch": result["producer_epoch"]}

    def metrics_lines(self) -> list[str]:
        """Per shard this node leads: that it does, and its transactions by state."""
        lines = [
            "# TYPE raftline_txn_shard_leading gauge",
            "# TYPE raftline_txn_transactions gauge",
        ]
        node = self.broker.node_id
        for name, replica in sorted(self.replicas.items()):
            if not replica.serving:
                continue
            shard = name.rsplit("~", 1)[-1]
            lines.append(f'raftline_txn_shard_leading{{node="{node}",shard="{shard}"}} 1')
            counts: dict[str, int] = {}
            for meta in replica.state.coordinator.txns.values():
                counts[meta.state.value] = counts.get(meta.state.value, 0) + 1
            for state, count in sorted(counts.items()):
                labels = f'node="{node}",shard="{shard}",state="{state}"'
                lines.append(f"raftline_txn_transactions{{{labels}}} {count}")
        return lines


def _forget(
    tasks: dict[tuple[str, str], asyncio.Task[None]],
    key: tuple[str, str],
    done: asyncio.Task[None],
) -> None:
    if tasks.get(key) is done:
        del tasks[key]
    if not done.cancelled() and (error := done.exception()) is not None:
        log.info("writing the markers of %s failed (resent later): %s", key, error)
