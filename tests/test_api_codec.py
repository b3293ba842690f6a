"""Produce messages become one record batch; fetched batches become JSON messages."""

import asyncio
import base64
from unittest import mock

import pytest
from aiohttp import StreamReader
from aiohttp.streams import EMPTY_PAYLOAD

from raftline.api import codec
from raftline.api.codec import decode_batches, encode_batch
from raftline.api.validation import ProduceMessage
from raftline.raftlog import batch as batch_header
from raftline.raftlog.records import RAFT_NOOP, build_control_batch


def _stamped(raw: bytes, base_offset: int) -> bytes:
    out = bytearray(raw)
    batch_header.stamp(out, base_offset, 1)
    return bytes(out)


def _messages(*values: bytes | None) -> list[ProduceMessage]:
    return [ProduceMessage(key=None, value=v) for v in values]


def test_messages_of_one_request_share_one_batch_with_consecutive_offsets() -> None:
    raw = encode_batch(_messages(b"a", b"b", b"c"), "none", 1_700_000_000_000)
    header = batch_header.parse_header(raw)
    assert header.records_count == 3
    assert header.offset_count == 3


def test_round_trip_keeps_key_value_headers_and_timestamp() -> None:
    message = ProduceMessage(key=b"k", value=b"v", headers=[("h", b"x")], timestamp=123)
    raw = _stamped(encode_batch([message], "none", 999), 10)
    decoded = decode_batches([raw], 2, 10, 500, 1 << 20)
    assert decoded.messages == [
        {
            "partition": 2,
            "offset": 10,
            "timestamp": 123,
            "key": "k",
            "value": "v",
            "headers": {"h": "x"},
        }
    ]
    assert decoded.next_offset == 11


def test_compressed_topics_round_trip() -> None:
    raw = _stamped(encode_batch(_messages(b"x" * 1000, b"y"), "zstd", 5), 0)
    decoded = decode_batches([raw], 0, 0, 500, 1 << 20)
    assert [m["value"] for m in decoded.messages] == ["x" * 1000, "y"]


def test_values_that_are_not_utf8_come_back_as_base64() -> None:
    raw = _stamped(encode_batch(_messages(b"\xff\xfe", None), "none", 5), 0)
    first, second = decode_batches([raw], 0, 0, 500, 1 << 20).messages
    assert first["value_b64"] == base64.b64encode(b"\xff\xfe").decode()
    assert "value" not in first
    assert second["value"] is None


def test_records_below_the_requested_offset_are_skipped() -> None:
    raw = _stamped(encode_batch(_messages(b"a", b"b", b"c"), "none", 5), 100)
    decoded = decode_batches([raw], 0, 101, 500, 1 << 20)
    assert [m["offset"] for m in decoded.messages] == [101, 102]


def test_control_batches_are_skipped_but_move_the_next_offset() -> None:
    control = build_control_batch(RAFT_NOOP, b"", base_offset=7)
    decoded = decode_batches([control], 0, 7, 500, 1 << 20)
    assert decoded.messages == []
    assert decoded.next_offset == 8


def test_max_messages_cuts_the_answer_and_next_offset_resumes_there() -> None:
    raw = _stamped(encode_batch(_messages(b"a", b"b", b"c"), "none", 5), 0)
    decoded = decode_batches([raw], 0, 0, 2, 1 << 20)
    assert [m["offset"] for m in decoded.messages] == [0, 1]
    assert decoded.next_offset == 2


def test_max_bytes_still_returns_at_least_one_message() -> None:
    raw = _stamped(encode_batch(_messages(b"x" * 100, b"y" * 100), "none", 5), 0)
    decoded = decode_batches([raw], 0, 0, 500, 10)
    assert [m["offset"] for m in decoded.messages] == [0]
    assert decoded.next_offset == 1


@pytest.mark.timeout(10)
async def test_an_empty_body_reads_as_empty_however_often_it_is_read() -> None:
    # aiohttp shares one empty body between requests; its later reads differ from its first.
    for _ in range(3):
        assert await codec.read_whole_body(EMPTY_PAYLOAD, None) == b""


@pytest.mark.timeout(10)
async def test_a_body_is_its_chunks_joined() -> None:
    content = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    for chunk in (b"ab", b"", b"cde"):
        content.feed_data(chunk)
    content.feed_eof()
    assert await codec.read_whole_body(content, 5) == b"abcde"


@pytest.mark.timeout(10)
async def test_a_declared_body_over_the_buffer_limit_before_it_is_read_resumes_reading() -> None:
    # aiohttp pauses reading once more than twice its limit is buffered; a reader that only
    # waited for the end of the body would then wait forever.
    protocol = mock.Mock(_reading_paused=False)
    content = StreamReader(protocol, 4, loop=asyncio.get_running_loop())
    content.feed_data(b"0123456789")
    assert protocol.pause_reading.called
    reading = asyncio.ensure_future(codec.read_whole_body(content, 20))
    await asyncio.sleep(0)
    assert protocol.resume_reading.called
    content.feed_data(b"abcdefghij")
    content.feed_eof()
    assert await reading == b"0123456789abcdefghij"


@pytest.mark.timeout(10)
async def test_a_decompressed_body_longer_than_declared_is_read_as_it_arrives() -> None:
    # The declared length counts compressed bytes; what is buffered can pass twice that.
    protocol = mock.Mock(_reading_paused=False)
    content = StreamReader(protocol, 4, loop=asyncio.get_running_loop())
    content.total_compressed_bytes = 0  # as aiohttp's decompressing payload sets it
    reading = asyncio.ensure_future(codec.read_whole_body(content, 5))
    await asyncio.sleep(0)
    content.feed_data(b"x" * 30)
    assert protocol.pause_reading.called
    await asyncio.sleep(0)
    assert protocol.resume_reading.called
    content.feed_data(b"y" * 30)
    content.feed_eof()
    assert await reading == b"x" * 30 + b"y" * 30
