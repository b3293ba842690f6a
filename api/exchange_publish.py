"""Writing an exchange's messages to the topics their routing keys match.

Owns routing a publish (routing table, alternate, dropped messages and their counts), its split
into one batch per (topic, partition), and how atomic the writes are: a publish that writes one
partition is a plain produce (one batch: all or nothing); one that writes several partitions
runs as a transaction of a transactional producer this node owns (`RoutingProducers`), so a
read_committed reader sees all of its messages or none. Read_uncommitted readers (the default
fetch, queues) read each partition's messages once they are written, before the commit, and
may read those of a publish that then aborts: that is the one limit of the atomicity.

A failed write aborts the transaction: the answer is the write's error at once (retryable
where it was), the abort runs on in the background. A commit that fails (the coordinator or a
partition lost its leader while the markers were written) answers 503 like a produce whose
outcome is unknown: the decision, if it was made, completes on every partition (the
coordinator resends markers), else the node's next init of that producer aborts it; never
half. A client that retries such a publish may write it twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftline.api import codec
from raftline.api.app import _assign_partitions, _produce_partition
from raftline.api.validation import ProduceMessage, ProducerFields
from raftline.node.errors import BrokerError
from raftline.node.exchanges.model import Exchange

if TYPE_CHECKING:
    from raftline.api.app import ApiState

ROUTING_PRODUCERS = 8  # transactions a node runs at once for multi-destination publishes
TRANSACTION_TIMEOUT_MS = 10_000  # a routing node that dies mid-publish: aborted after this
INIT_TRIES = 20  # a producer whose last commit is still being completed: try init again
INIT_PAUSE_S = 0.1


class _Aborting(Exception):
    """A write of the transaction failed with `error`: the transaction is to be aborted."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class _Producer:
    transactional_id: str
    producer_id: int | None = None  # None: (re)initialise before the next transaction
    epoch: int = 0


class RoutingProducers:
    """The transactional producers of one node (transactional ids `__exchange.n<node>.<i>`:
    the same after a restart, so the restarted node's first init fences and aborts what its
    previous life left open)."""

    def __init__(self, node_id: int, size: int = ROUTING_PRODUCERS) -> None:
        self._ids = [f"__exchange.n{node_id}.{i}" for i in range(size)]
        self._idle: asyncio.Queue[_Producer] | None = None

    def _queue(self) -> asyncio.Queue[_Producer]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            for tid in self._ids:
                self._idle.put_nowait(_Producer(tid))
        return self._idle

    async def write(
        self, state: ApiState, writes: dict[tuple[str, int], list[ProduceMessage]]
    ) -> dict[tuple[str, int], int]:
        """Write every (topic, partition)'s messages in one transaction; base offsets."""
        idle = self._queue()
        producer = await idle.get()
        try:
            bases = await self._transaction(state, producer, writes)
        except _Aborting as aborting:
            # Answer now; the abort (markers to every partition, one of which may be waiting
            # for a new leader) finishes in the background before the producer is used again.
            task = asyncio.ensure_future(self._abort(state, producer))
            state.background.add(task)
            task.add_done_callback(state.background.discard)
            raise aborting.error from None
        except BaseException:
            producer.producer_id = None  # the commit's outcome is unknown: the next init fences
            idle.put_nowait(producer)
            raise
        idle.put_nowait(producer)
        return bases

    async def _abort(self, state: ApiState, producer: _Producer) -> None:
        try:
            await self._end(state, producer, commit=False)
        except Exception:  # the next init fences the transaction and aborts it
            producer.producer_id = None
        finally:
            self._queue().put_nowait(producer)

    async def _transaction(
        self,
        state: ApiState,
        producer: _Producer,
        writes: dict[tuple[str, int], list[ProduceMessage]],
    ) -> dict[tuple[str, int], int]:
        broker = state.broker
        tid = producer.transactional_id
        if producer.producer_id is None:
            await self._init(state, producer)
        assert producer.producer_id is not None
        fields = ProducerFields(producer.producer_id, producer.epoch, 0, transactional_id=tid)
        now_ms = broker.clock.now_ms()
        work = []
        for (topic, partition), messages in writes.items():
            meta = await state.topic_meta(topic)
            batch = codec.encode_batch(messages, meta.compression, now_ms, fields)
            work.append(_produce_partition(state, topic, partition, batch, "all", tid))
        results = await asyncio.gather(*work, return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            raise _Aborting(failure)
        await self._end(state, producer, commit=True)
        broker.counters["exchange_transactions"] += 1
        return {
            target: base
            for target, (base, _) in zip(writes, results, strict=True)  # type: ignore[misc]
        }

    async def _init(self, state: ApiState, producer: _Producer) -> None:
        args = {"timeout_ms": TRANSACTION_TIMEOUT_MS}
        for attempt in range(INIT_TRIES):
            try:
                answer = await state.broker.txn_call(producer.transactional_id, "txn_init", args)
                break
            except BrokerError as exc:
                if exc.code != "concurrent_transactions" or attempt == INIT_TRIES - 1:
                    raise
                await asyncio.sleep(INIT_PAUSE_S)
        producer.producer_id = int(answer["producer_id"])
        producer.epoch = int(answer["producer_epoch"])

    async def _end(self, state: ApiState, producer: _Producer, commit: bool) -> None:
        args = {"producer_id": producer.producer_id, "producer_epoch": producer.epoch}
        answer = await state.broker.txn_call(
            producer.transactional_id, "txn_end", {**args, "commit": commit}
        )
        producer.producer_id = int(answer["producer_id"])
        producer.epoch = int(answer["producer_epoch"])


async def publish(
    state: ApiState,
    producers: RoutingProducers,
    exchange: Exchange,
    routing_keys: Sequence[str],
    messages: Sequence[ProduceMessage],
) -> dict[str, Any]:
    """Route and write `messages` (one routing key each); the answer of
    `POST /v1/exchanges/{x}/messages`."""
    broker = state.broker
    table = broker.exchanges.table(exchange)
    results: list[dict[str, Any]] = []
    by_topic: dict[str, list[int]] = {}
    for index, key in enumerate(routing_keys):
        topics = table.route(key)
        result: dict[str, Any] = {"routed": []}
        if not topics and exchange.alternate is not None:
            topics = frozenset((exchange.alternate.topic,))
            result["alternate"] = True
        elif not topics:
            result["dropped"] = True
        results.append(result)
        for topic in sorted(topics):
            by_topic.setdefault(topic, []).append(index)
    writes: dict[tuple[str, int], list[int]] = {}
    for topic, indexes in by_topic.items():
        meta = await state.topic_meta(topic)
        chosen = [messages[i] for i in indexes]
        for partition, local in _assign_partitions(state, topic, meta, chosen).items():
            writes[(topic, partition)] = [indexes[j] for j in local]
    batched = {target: [messages[i] for i in idx] for target, idx in writes.items()}
    if len(writes) > 1:
        bases = await producers.write(state, batched)
    else:
        bases = {}
        for (topic, partition), chunk in batched.items():
            meta = await state.topic_meta(topic)
            batch = codec.encode_batch(chunk, meta.compression, broker.clock.now_ms())
            bases[(topic, partition)], _ = await _produce_partition(
                state, topic, partition, batch, "all"
            )
    for (topic, partition), indexes in writes.items():
        for delta, index in enumerate(indexes):
            where = {"topic": topic, "partition": partition, "offset": bases[(topic, partition)]}
            where["offset"] += delta
            results[index]["routed"].append(where)
    dropped = sum(1 for r in results if r.get("dropped"))
    alternate = sum(1 for r in results if r.get("alternate"))
    broker.counters["exchange_messages_unroutable"] += dropped
    broker.counters["exchange_messages_alternate"] += alternate
    broker.counters["exchange_messages_routed"] += len(results) - dropped
    return {
        "results": results,
        "routed": len(results) - dropped,
        "dropped": dropped,
        "transaction": len(writes) > 1,
    }
