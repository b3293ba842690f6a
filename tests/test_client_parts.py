"""The client's pure parts: message encoding, error parsing, partition choice and batching."""

import base64
import json
import time

from raftline.api.partitioner import partition_for_key
from raftline.clients.client import (
    _Accumulator,
    _error_from,
    _Partitioner,
    _Pending,
    encode_message,
    parse_fetch,
)


def _pending(size: int = 10) -> _Pending:
    return _Pending({"value": "x"}, size, None)


def test_text_values_are_sent_as_value_and_binary_as_value_b64() -> None:
    assert encode_message("hi", key="k") == {"value": "hi", "key": "k"}
    assert encode_message(b"\xff") == {"value_b64": base64.b64encode(b"\xff").decode()}


def test_error_bodies_become_exceptions_with_the_code() -> None:
    raw = json.dumps(
        {"error": {"code": "leader_unavailable", "message": "m", "retryable": True}}
    ).encode()
    error = _error_from(503, raw)
    assert (error.code, error.retryable, error.status) == ("leader_unavailable", True, 503)


def test_answers_without_an_error_body_still_raise_with_the_status() -> None:
    error = _error_from(502, b"<html>bad gateway</html>")
    assert error.code == "http_error"
    assert error.retryable


def test_fetched_messages_decode_text_and_base64() -> None:
    result = parse_fetch(
        {
            "messages": [
                {"partition": 0, "offset": 4, "timestamp": 1, "key": None, "value": "a"},
                {"partition": 0, "offset": 5, "timestamp": 2, "key": "k", "value_b64": "/w=="},
            ],
            "next_offset": 6,
            "log_start_offset": 0,
            "high_watermark": 6,
        }
    )
    assert [m.value for m in result.messages] == [b"a", b"\xff"]
    assert result.messages[1].key == b"k"
    assert result.next_offset == 6


def test_keyed_messages_use_the_kafka_partition() -> None:
    assert _Partitioner().choose("t", 6, "user-9", None) == partition_for_key(b"user-9", 6)


def test_explicit_partition_wins_over_the_key() -> None:
    assert _Partitioner().choose("t", 6, "user-9", 4) == 4


def test_keyless_messages_stick_to_one_partition_until_its_batch_is_sent() -> None:
    partitioner = _Partitioner()
    first = partitioner.choose("t", 1000, None, None)
    assert partitioner.choose("t", 1000, None, None) == first
    partitioner.batch_sent("t")
    assert partitioner.choose("t", 1000, None, None) == (first + 1) % 1000


def test_a_batch_is_ready_once_it_holds_batch_messages() -> None:
    accumulator = _Accumulator(linger_ms=60_000, batch_bytes=1 << 20, batch_messages=2)
    assert not accumulator.add(0, _pending())
    assert accumulator.drain(everything=False) == []
    assert accumulator.add(0, _pending())
    [(partition, batch)] = accumulator.drain(everything=False)
    assert partition == 0 and len(batch) == 2


def test_a_batch_is_ready_once_it_reaches_batch_bytes() -> None:
    accumulator = _Accumulator(linger_ms=60_000, batch_bytes=100, batch_messages=1000)
    assert accumulator.add(3, _pending(size=150))


def test_a_batch_is_ready_after_linger_ms() -> None:
    accumulator = _Accumulator(linger_ms=1, batch_bytes=1 << 20, batch_messages=1000)
    accumulator.add(0, _pending())
    time.sleep(0.01)
    assert [p for p, _ in accumulator.drain(everything=False)] == [0]
    assert len(accumulator) == 0


def test_flush_drains_batches_that_are_not_ready() -> None:
    accumulator = _Accumulator(linger_ms=60_000, batch_bytes=1 << 20, batch_messages=1000)
    accumulator.add(0, _pending())
    accumulator.add(1, _pending())
    assert sorted(p for p, _ in accumulator.drain(everything=True)) == [0, 1]
