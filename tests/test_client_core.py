"""The client's sans-I/O core without a server: feed answers in, read requests out.

Ops are generators: each yields the Call to make and is sent the Answer (or thrown the
error). Tries say where the next try goes and how long to wait. ProducerCore decides which
batch leaves next; ConsumerCore where each fetch starts.
"""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import pytest

from raftline.api.codec import BATCH_CONTENT_TYPE
from raftline.clients.client import AsyncClient, Client, RaftlineError, RetryPolicy
from raftline.clients.consuming import ConsumerCore
from raftline.clients.core import Call, ClientCore, Op, Step
from raftline.clients.metadata import Metadata
from raftline.clients.producing import ProducerCore
from raftline.clients.routing import Nodes, Tries
from raftline.clients.wire import Answer, encode_message, parse_fetch
from raftline.raftlog.batch import parse_header
from raftline.raftlog.compression import Codec
from raftline.raftlog.records import decode_batch

TOPIC = "orders"
NODES = {"nodes": [{"id": 1, "http": "leader:1"}, {"id": 2, "http": "other:2"}]}


def _json(body: Any) -> Answer:
    return Answer({"content-type": "application/json"}, json.dumps(body).encode())


def _description(partitions: int, leader: int = 1) -> dict[str, Any]:
    parts = [{"partition": p, "leader": leader} for p in range(partitions)]
    return {"name": TOPIC, "partitions": parts}


def _unavailable(node: str = "http://leader:1") -> RaftlineError:
    return RaftlineError("leader_unavailable", "election", retryable=True, status=503, node=node)


def _core(wire: str = "batch", url: str = "http://a:1,http://b:2") -> ClientCore:
    core = ClientCore(url, retry=RetryPolicy(retries=3, backoff_ms=1), wire=wire)
    core.metadata.update(_description(2), NODES)
    return core


def _run(op: Op[Any], answers: list[Answer | BaseException]) -> tuple[list[Call], Any]:
    """Drives `op` with `answers` in order; the Calls it made and its result."""
    step, calls = Step(op), []
    while step.call is not None:
        calls.append(step.call)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            step.throw(answer)
        else:
            step.send(answer)
    assert not answers, "the op ended before taking every answer"
    return calls, step.result


# ---- calls ---------------------------------------------------------------------------------


def test_a_stale_topic_is_looked_up_then_the_fetch_goes_to_its_leader() -> None:
    core = ClientCore("http://a:1", retry=None, wire="json")
    fetched = {"messages": [], "next_offset": 7, "log_start_offset": 0, "high_watermark": 7}
    consumer = ConsumerCore(core, TOPIC, partitions=[1], offset=7, wait_ms=0)
    calls, result = _run(
        consumer.polled(values=True),
        [_json(_description(2)), _json(NODES), _json(fetched)],
    )
    assert [(c.method, c.path, c.url) for c in calls] == [
        ("GET", "/v1/topics/orders", None),
        ("GET", "/v1/cluster", None),
        ("GET", "/v1/topics/orders/partitions/1/messages", "http://leader:1"),
    ]
    assert calls[2].request.params is not None and calls[2].request.params["offset"] == "7"
    assert result == []
    assert consumer.positions is not None and consumer.positions.next == {1: 7}


def test_a_retryable_fetch_failure_drops_the_metadata_and_raises() -> None:
    core = _core(wire="json")
    consumer = ConsumerCore(core, TOPIC, partitions=[0], wait_ms=0)
    with pytest.raises(RaftlineError):
        _run(consumer.polled(values=False), [_unavailable()])
    assert not core.metadata.fresh(TOPIC)


def test_a_consumer_asks_every_partition_then_long_polls_one() -> None:
    core = _core(wire="json")
    consumer = ConsumerCore(core, TOPIC, offset=0, wait_ms=500)
    empty = {"messages": [], "next_offset": 0, "log_start_offset": 0, "high_watermark": 0}
    calls, result = _run(consumer.polled(values=False), [_json(empty), _json(empty), _json(empty)])
    assert [c.request.params["wait_ms"] for c in calls if c.request.params] == ["0", "0", "500"]
    assert result == []


def test_headers_that_are_not_utf8_go_as_headers_b64_and_come_back_as_bytes() -> None:
    message = encode_message("v", headers={"text": "é", "raw": b"\xff\x00"})
    assert message["headers"] == {"text": "é"}
    assert message["headers_b64"] == {"raw": "/wA="}
    fetched = parse_fetch(
        {
            "messages": [{"partition": 0, "offset": 0, "value": "v", **message}],
            "next_offset": 1,
            "log_start_offset": 0,
            "high_watermark": 1,
        }
    )
    assert fetched.messages[0].headers == {"text": "é", "raw": b"\xff\x00"}


# ---- tries ---------------------------------------------------------------------------------


def test_a_retryable_answer_sends_the_next_try_to_another_bootstrap_node() -> None:
    nodes = Nodes("http://a:1,http://b:2", Metadata())
    tries = Tries(RetryPolicy(retries=3, backoff_ms=1), nodes, None)
    assert nodes.base_url(tries.url) == "http://a:1"
    assert 0 < tries.failed(_unavailable("http://a:1")) <= 0.2  # a short election wait
    assert nodes.base_url(tries.url) == "http://b:2"
    tries.failed(RaftlineError("timeout", "slow", retryable=True, status=504, node="http://b:2"))
    assert nodes.base_url(tries.url) == "http://a:1"


def test_after_a_failed_leader_the_next_try_avoids_that_node_among_the_bootstrap_ones() -> None:
    metadata = Metadata()
    nodes = Nodes("http://a:1,http://b:2", metadata)
    tries = Tries(RetryPolicy(backoff_ms=1), nodes, "http://a:1")
    tries.failed(RaftlineError("connection_failed", "x", retryable=True, node="http://a:1"))
    assert (tries.url, nodes.base_url(None)) == (None, "http://b:2")
    assert metadata.unreachable == {"http://a:1"}


def test_errors_that_are_not_retryable_or_past_the_last_retry_end_the_request() -> None:
    tries = Tries(RetryPolicy(retries=1, backoff_ms=1), Nodes("http://a:1", Metadata()), None)
    with pytest.raises(RaftlineError):
        tries.failed(RaftlineError("unknown_topic", "no", retryable=False, status=404))
    tries.failed(_unavailable())
    with pytest.raises(RaftlineError):
        tries.failed(_unavailable())


# ---- producer ------------------------------------------------------------------------------


def _producer(**options: Any) -> ProducerCore:
    settings: dict[str, Any] = {
        "acks": "all",
        "compression": "none",
        "linger_ms": 60_000,
        "batch_bytes": 1 << 20,
        "batch_messages": 2,
    }
    settings.update(options)
    return ProducerCore(_core(), TOPIC, **settings)


def _acked(partition: int, base: int, count: int) -> Answer:
    return _json({"partition": partition, "base_offset": base, "count": count})


def test_a_full_batch_becomes_one_batch_request_to_the_leader() -> None:
    producer = _producer()
    futures = [concurrent.futures.Future() for _ in range(2)]
    for i, future in enumerate(futures):
        producer.add(2, f"m{i}", None, 1, None, None, future)
    [batch] = producer.ready(everything=False)
    calls, _ = _run(producer.sending(batch), [_acked(1, 40, 2)])
    [call] = calls
    assert (call.method, call.path, call.url) == (
        "POST",
        "/v1/topics/orders/messages",
        "http://leader:1",
    )
    assert call.request.headers["Content-Type"] == BATCH_CONTENT_TYPE
    assert call.request.params == {"partition": "1", "acks": "all"}
    assert call.request.payload is not None
    assert [r.value for r in decode_batch(bytes(call.request.payload)).records] == [b"m0", b"m1"]
    assert [f.result() for f in futures] == [(1, 40), (1, 41)]
    assert producer.idle()


def test_only_one_batch_per_partition_is_in_flight() -> None:
    producer = _producer(batch_messages=1)
    futures = [concurrent.futures.Future() for _ in range(3)]
    producer.add(2, "m0", None, 0, None, None, futures[0])
    [zero] = producer.ready(everything=False)
    producer.add(2, "m1", None, 0, None, None, futures[1])
    producer.add(2, "m2", None, 1, None, None, futures[2])
    [one] = producer.ready(everything=False)  # the second batch of partition 0 waits
    assert (zero.partition, one.partition) == (0, 1)
    assert producer.ready(everything=True) == []
    _run(producer.sending(zero), [_unavailable()])  # fails its future, frees partition 0
    with pytest.raises(RaftlineError):
        futures[0].result(timeout=0)
    [second] = producer.ready(everything=False)
    assert second.partition == 0 and second is not zero
    assert not producer.idle()


def test_a_failed_batch_fails_its_futures_and_frees_its_partition() -> None:
    producer = _producer(batch_messages=1)
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    producer.add(2, "x", None, 0, None, None, future)
    [batch] = producer.ready(everything=False)
    _run(producer.sending(batch), [_unavailable()])
    assert isinstance(future.exception(timeout=0), RaftlineError)
    assert producer.idle()
    assert not producer.client.metadata.fresh(TOPIC)  # the leader is looked up again


def test_a_whole_batch_leaves_after_the_messages_queued_before_it() -> None:
    producer = _producer(batch_messages=100)
    single: concurrent.futures.Future[Any] = concurrent.futures.Future()
    whole: concurrent.futures.Future[Any] = concurrent.futures.Future()
    producer.add(2, "first", None, 0, None, None, single)
    producer.add_values(2, [b"second"], None, 0, whole)
    [batch] = producer.ready(everything=False)
    _run(producer.sending(batch), [_acked(0, 0, 1)])
    [after] = producer.ready(everything=False)
    calls, _ = _run(producer.sending(after), [_acked(0, 1, 1)])
    assert calls[0].request.payload is not None
    assert [r.value for r in decode_batch(bytes(calls[0].request.payload)).records] == [b"second"]
    assert (single.result(), whole.result().base_offset) == ((0, 0), 1)


@pytest.mark.parametrize("name", ["gzip", "snappy", "lz4", "zstd"])
def test_a_compressing_producer_builds_batches_with_its_codec(name: str) -> None:
    producer = _producer(compression=name, batch_messages=1)
    producer.add(2, b"x" * 1000, None, 0, None, None, concurrent.futures.Future())
    [batch] = producer.ready(everything=False)
    calls, _ = _run(producer.sending(batch), [_acked(0, 0, 1)])
    payload = bytes(calls[0].request.payload or b"")
    assert parse_header(payload).codec == Codec[name.upper()]
    assert len(payload) < 1000
    assert decode_batch(payload).records[0].value == b"x" * 1000


@pytest.mark.parametrize("bad", ["brotli", "", "GZIP"])
def test_an_unknown_compression_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        _producer(compression=bad)
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1").producer(TOPIC, compression=bad)


def test_compression_with_the_json_wire_is_refused() -> None:
    with pytest.raises(ValueError):
        ProducerCore(_core(wire="json"), TOPIC, "all", "gzip", 5, 1 << 20, 10)


def test_both_shells_offer_the_same_calls() -> None:
    public = {name for name in dir(Client) if not name.startswith("_")}
    assert public <= set(dir(AsyncClient))
