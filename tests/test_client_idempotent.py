"""The idempotent producer: its sans-I/O core without a server, then both shells on a real node.

The core numbers each batch once (producer id, epoch, sequence per partition) when it first
leaves, keeps up to 5 in flight per partition, resends the same bytes after a retryable
failure or after overtaking an earlier batch, and starts a new epoch at 0 on a partition where
a batch failed for good. On a node, an answer lost after the write is retried without writing
twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import serving

from raftline.clients import aio
from raftline.clients.client import AsyncClient, RaftlineError, RetryPolicy
from raftline.clients.core import Call, ClientCore, Pause, Step
from raftline.clients.producing import ProducerApi, ProducerCore
from raftline.clients.wire import Answer, ProducerFields
from raftline.raftlog.batch import parse_header

TOPIC = "orders"
NODES = {"nodes": [{"id": 1, "http": "leader:1"}]}

pytestmark = pytest.mark.timeout(60)


def _json(body: Any) -> Answer:
    return Answer({"content-type": "application/json"}, json.dumps(body).encode())


def _producer(wire: str = "batch", **options: Any) -> ProducerCore:
    core = ClientCore("http://a:1", retry=RetryPolicy(retries=1, backoff_ms=1), wire=wire)
    core.metadata.update({"name": TOPIC, "partitions": [{"partition": 0, "leader": 1}]}, NODES)
    settings: dict[str, Any] = {
        "acks": "all",
        "compression": "none",
        "linger_ms": 0,
        "batch_bytes": 1 << 20,
        "batch_messages": 2,
        "idempotent": True,
    }
    settings.update(options)
    producer = ProducerCore(core, TOPIC, **settings)
    step = Step(producer.identified())
    assert step.call is not None and step.call.path == "/v1/producers"
    step.send(_json({"producer_id": 7, "producer_epoch": 3}))
    assert step.call is None
    return producer


def _fields(call: Call | Pause | None) -> ProducerFields:
    assert isinstance(call, Call) and call.request.payload is not None
    header = parse_header(bytes(call.request.payload))
    return ProducerFields(header.producer_id, header.producer_epoch, header.base_sequence)


def _batches(producer: ProducerCore, count: int) -> list[Any]:
    futures = []
    for i in range(2 * count):
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if producer.add(1, f"m{i}", None, 0, None, None, future):
            producer._close(everything=False)  # a full batch waits as the shells leave it
        futures.append(future)
    return futures


def _past_metadata(step: Step[Any]) -> None:
    """Answer the metadata lookups a retry starts with, up to the produce request."""
    while isinstance(step.call, Call) and step.call.method == "GET":
        if step.call.path == "/v1/cluster":
            step.send(_json(NODES))
        else:
            step.send(_json({"name": TOPIC, "partitions": [{"partition": 0, "leader": 1}]}))


def _unavailable() -> RaftlineError:
    return RaftlineError("leader_unavailable", "moved", retryable=True, status=503)


def test_nothing_leaves_before_the_producer_id_is_known() -> None:
    core = ClientCore("http://a:1")
    core.metadata.update({"name": TOPIC, "partitions": [{"partition": 0, "leader": 1}]}, NODES)
    producer = ProducerCore(core, TOPIC, "all", "none", 0, 1 << 20, 2, idempotent=True)
    _batches(producer, 1)
    assert producer.needs_identity and producer.ready(everything=True) == []


def test_batches_are_numbered_once_and_five_fly_per_partition() -> None:
    producer = _producer()
    _batches(producer, 8)
    # the first batch flies alone: a broker takes any first sequence of a producer it does
    # not know, so nothing may overtake it
    [first] = producer.ready(everything=True)
    assert producer.ready(everything=True) == []
    step = Step(producer.sending(first))
    assert _fields(step.call) == ProducerFields(7, 3, 0)
    step.send(_json({"partition": 0, "base_offset": 10, "count": 2}))
    batches = producer.ready(everything=True)
    assert [b.producer for b in batches] == [ProducerFields(7, 3, 2 * i) for i in range(1, 6)]
    assert producer.ready(everything=True) == []  # five in flight: the rest wait
    step = Step(producer.sending(batches[0]))
    step.send(_json({"partition": 0, "base_offset": 12, "count": 2}))
    [seventh] = producer.ready(everything=True)
    assert seventh.producer == ProducerFields(7, 3, 12)


def test_a_retryable_failure_resends_the_same_bytes_and_a_later_batch_waits_its_turn() -> None:
    producer = _producer()
    futures = _batches(producer, 2)
    producer._confirmed.add(0)  # a batch of this epoch was acknowledged before
    first, second = producer.ready(everything=True)
    one, two = Step(producer.sending(first)), Step(producer.sending(second))
    assert isinstance(one.call, Call) and one.call.request.payload is not None
    sent = bytes(one.call.request.payload)
    one.throw(_unavailable())  # the answer was lost: the client's own retries gave up
    assert isinstance(one.call, Pause)
    # meanwhile the second batch reaches the leader first: out of order, so it is sent again
    two.throw(RaftlineError("out_of_order_sequence", "gap", retryable=False, status=409))
    assert isinstance(two.call, Pause) and two.call.seconds < 0.1
    one.send(None)  # type: ignore[arg-type]
    _past_metadata(one)
    assert isinstance(one.call, Call) and bytes(one.call.request.payload or b"") == sent
    one.send(_json({"partition": 0, "base_offset": 4, "count": 2, "duplicate": True}))
    two.send(None)  # type: ignore[arg-type]
    _past_metadata(two)
    assert _fields(two.call) == ProducerFields(7, 3, 2)
    two.send(_json({"partition": 0, "base_offset": 6, "count": 2}))
    assert [f.result() for f in futures] == [(0, 4), (0, 5), (0, 6), (0, 7)]
    assert producer.idle()


def test_a_batch_that_fails_for_good_starts_a_new_epoch_on_its_partition() -> None:
    producer = _producer()
    futures = _batches(producer, 1)
    [batch] = producer.ready(everything=True)
    step = Step(producer.sending(batch))
    step.throw(RaftlineError("producer_fenced", "old", retryable=False, status=409))
    assert step.call is None
    with pytest.raises(RaftlineError):
        futures[0].result()
    _batches(producer, 1)
    [after] = producer.ready(everything=True)
    assert after.producer == ProducerFields(7, 4, 0)


def test_an_out_of_order_answer_to_the_oldest_batch_renumbers_all_in_flight_in_a_new_epoch() -> (
    None
):
    """KIP-360: the broker lost the producer's sequence (expired, or rebuilt without it)."""
    producer = _producer()
    futures = _batches(producer, 2)
    producer._confirmed.add(0)
    first, second = producer.ready(everything=True)
    one, two = Step(producer.sending(first)), Step(producer.sending(second))
    assert _fields(one.call) == ProducerFields(7, 3, 0)
    one.throw(RaftlineError("out_of_order_sequence", "gap", retryable=False, status=409))
    assert isinstance(one.call, Pause) and one.call.seconds < 0.1
    assert (first.producer, second.producer) == (ProducerFields(7, 4, 0), ProducerFields(7, 4, 2))
    # the second one's request, sent with its old numbers, is refused: it goes again renumbered
    two.throw(RaftlineError("producer_fenced", "old epoch", retryable=False, status=409))
    assert isinstance(two.call, Pause)
    one.send(None)  # type: ignore[arg-type]
    _past_metadata(one)
    assert _fields(one.call) == ProducerFields(7, 4, 0)
    one.send(_json({"partition": 0, "base_offset": 0, "count": 2}))
    two.send(None)  # type: ignore[arg-type]
    _past_metadata(two)
    assert _fields(two.call) == ProducerFields(7, 4, 2)
    two.send(_json({"partition": 0, "base_offset": 2, "count": 2}))
    assert [f.result() for f in futures] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    _batches(producer, 1)
    [after] = producer.ready(everything=True)
    assert after.producer == ProducerFields(7, 4, 4)


def test_a_transactional_batch_out_of_order_is_not_renumbered() -> None:
    producer = _producer(transactional_id="tx")
    futures = _batches(producer, 1)
    [batch] = producer.ready(everything=True)
    step = Step(producer.sending(batch))
    step.throw(RaftlineError("out_of_order_sequence", "gap", retryable=False, status=409))
    assert step.call is None
    with pytest.raises(RaftlineError):
        futures[0].result()
    assert producer.txn_error is not None


@pytest.mark.parametrize(
    ("options", "idempotent"),
    [({}, True), ({"acks": "leader"}, False), ({"idempotent": False}, False)],
)
def test_idempotence_is_on_by_default_with_acks_all(options: dict, idempotent: bool) -> None:
    core = ClientCore("http://a:1")
    assert ProducerApi(core, TOPIC, **options)._core.idempotent is idempotent


def test_idempotence_asked_with_acks_leader_is_refused() -> None:
    with pytest.raises(ValueError, match="acks"):
        ProducerApi(ClientCore("http://a:1"), TOPIC, acks="leader", idempotent=True)


def test_the_json_wire_carries_the_numbers_in_the_body() -> None:
    producer = _producer(wire="json")
    _batches(producer, 1)
    [batch] = producer.ready(everything=True)
    step = Step(producer.sending(batch))
    assert isinstance(step.call, Call) and step.call.request.payload is not None
    body = json.loads(step.call.request.payload)
    assert (body["producer_id"], body["producer_epoch"], body["sequence"]) == (7, 3, 0)


@pytest.mark.parametrize("wire", ["batch", "json"])
async def test_a_lost_answer_is_retried_without_writing_twice(
    tmp_path: Path, wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(tmp_path / "d") as (api, _):
        assert (await api.post("/v1/topics", json={"name": TOPIC, "partitions": 2})).status == 201
        url = str(api.make_url("")).rstrip("/")
        real_once = aio.AsyncClient._once
        lost = {"answers": 0}

        async def losing_once(self: Any, method: str, path: str, request: Any, url: Any) -> Any:
            answer = await real_once(self, method, path, request, url)
            if path.endswith("/messages") and method == "POST" and lost["answers"] < 3:
                lost["answers"] += 1  # written, but the producer never hears of it
                raise RaftlineError("connection_failed", "lost", retryable=True)
            return answer

        monkeypatch.setattr(aio.AsyncClient, "_once", losing_once)
        async with AsyncClient(url, wire=wire, retry=RetryPolicy(backoff_ms=1)) as client:
            producer = client.producer(TOPIC, idempotent=True, linger_ms=1, batch_messages=4)
            futures = [await producer.send(f"v{i}", partition=i % 2) for i in range(20)]
            await producer.flush()
            acked = [f.result() for f in futures]
        assert lost["answers"] == 3
        for partition in (0, 1):
            response = await api.get(f"/v1/topics/{TOPIC}/partitions/{partition}/messages")
            messages = (await response.json())["messages"]
            assert [m["value"] for m in messages] == [f"v{i}" for i in range(partition, 20, 2)]
            offsets = {m["value"]: m["offset"] for m in messages}
            for i in range(partition, 20, 2):
                assert acked[i] == (partition, offsets[f"v{i}"])
        assert asyncio.get_running_loop() is not None


@pytest.mark.cluster
def test_the_blocking_producer_is_idempotent_on_a_real_node(
    client: Any, new_topic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raftline.clients import blocking

    topic = new_topic(3)
    real_once = blocking.Client._once
    lost = {"answers": 0}

    def losing_once(self: Any, method: str, path: str, request: Any, url: Any) -> Any:
        answer = real_once(self, method, path, request, url)
        if path.endswith("/messages") and method == "POST" and lost["answers"] < 2:
            lost["answers"] += 1
            raise RaftlineError("connection_failed", "lost", retryable=True)
        return answer

    monkeypatch.setattr(blocking.Client, "_once", losing_once)
    with client.producer(topic, idempotent=True, batch_messages=5) as producer:
        futures = [producer.send(f"v{i}", partition=i % 3) for i in range(30)]
        producer.flush()
        acked = [f.result() for f in futures]
    monkeypatch.undo()
    assert lost["answers"] == 2
    for partition in range(3):
        fetched = client.fetch(topic, partition, max_messages=100)
        stored = [m.value for m in fetched.messages]
        assert stored == [f"v{i}".encode() for i in range(partition, 30, 3)]
        for i, message in zip(range(partition, 30, 3), fetched.messages, strict=True):
            assert acked[i] == (partition, message.offset)


@pytest.mark.cluster
def test_the_transactional_producer_and_a_read_committed_consumer(
    client: Any, new_topic: Any
) -> None:
    topic = new_topic(2)
    with client.producer(topic, transactional_id=f"{topic}-tx") as producer:
        producer.begin()
        for i in range(6):
            producer.send(f"c{i}", partition=i % 2)
        producer.commit()
        producer.begin()
        for i in range(4):
            producer.send(f"a{i}", partition=i % 2)
        producer.abort()
        producer.begin()
        producer.send("last", partition=0)
        producer.send_offsets_to_transaction({(topic, 0): 3}, group=f"{topic}-g")
        producer.commit()

    def read(isolation: str) -> list[str]:
        consumer = client.consumer(topic, isolation=isolation, wait_ms=0)
        values: list[str] = []
        for _ in range(10):
            got = [m.value.decode() for m in consumer.poll()]
            if not got:
                break
            values += got
        return sorted(values)

    committed = sorted([f"c{i}" for i in range(6)] + ["last"])
    assert read("read_committed") == committed
    assert read("read_uncommitted") == sorted(committed + [f"a{i}" for i in range(4)])
    offsets = client.call("GET", f"/v1/groups/{topic}-g/offsets")["offsets"]
    assert [(o["topic"], o["partition"], o["offset"]) for o in offsets] == [(topic, 0, 3)]
