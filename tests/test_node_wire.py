"""Frames between nodes: encoding, rejection of malformed bytes, and what a bad frame closes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest

from bench.ports import free_ports
from raftline.node import wire
from raftline.node.transport import Transport, _PeerConnection
from raftline.node.wire import FrameError, FrameKind
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.types import Entry, EntryKind, Message, MessageType, SnapshotMeta

pytestmark = pytest.mark.timeout(30)


def frame_bytes(frame: wire.Frame) -> bytes:
    return frame if isinstance(frame, bytes) else b"".join(frame)


def roundtrip(frame: wire.Frame) -> tuple[FrameKind, Any]:
    frame = frame_bytes(frame)
    length = wire.frame_length(frame[:4])
    assert length == len(frame) - 4
    return wire.decode_frame(frame[4:])


def append_message(entries: list[Entry], snapshot: SnapshotMeta | None = None) -> Message:
    return Message(
        MessageType.APPEND,
        src=1,
        dst=2,
        term=7,
        group="orders~1~0",
        log_index=4,
        log_term=6,
        entries=entries,
        commit=4,
        snapshot=snapshot,
        context=b"ctx",
    )


def test_append_message_round_trips_with_batch_bytes_untouched() -> None:
    batch = build_batch([Record(b"payload")])
    msg = append_message(
        [Entry(5, 7, EntryKind.DATA, batch, 1), Entry(6, 7, EntryKind.NOOP, b"", 1)],
        SnapshotMeta(3, 6, (1, 2, 3), ()),
    )
    kind, body = roundtrip(wire.encode_raft([msg], [["q", "g", 1, 2, 3]]))
    messages, notices = wire.decode_raft(body)
    assert kind is FrameKind.RAFT
    assert messages == [msg] and messages[0].entries[0].data == batch
    assert notices == [["q", "g", 1, 2, 3]]


def test_large_batches_go_as_blobs_after_a_blobs_frame_referenced_not_copied() -> None:
    large = build_batch([Record(os.urandom(wire.LARGE_BIN))])
    small = build_batch([Record(b"payload")])
    msg = append_message(
        [
            Entry(5, 7, EntryKind.DATA, large, 1),
            Entry(6, 7, EntryKind.DATA, small, 1),
            Entry(7, 7, EntryKind.DATA, large, 1),
        ]
    )
    notices: list[list[Any]] = [["q", "g", 1, 2, 3]]
    blobs_frame, first, second, raft_frame = wire.encode_raft([msg], notices)
    assert first is large and second is large  # the batch itself, not a copy, twice
    assert roundtrip(blobs_frame) == (FrameKind.BLOBS, [len(large), len(large)])
    assert len(raft_frame) < len(small) + 200  # the large batches are only named in it


def test_frames_carry_their_version() -> None:
    frame = bytearray(wire.encode_frame(FrameKind.PING, []))
    frame[4] = wire.VERSION + 1
    with pytest.raises(FrameError, match="version"):
        roundtrip(bytes(frame))


@pytest.mark.parametrize("length", [0, 1, wire.MAX_FRAME + 1])
def test_implausible_lengths_are_rejected_before_reading(length: int) -> None:
    with pytest.raises(FrameError):
        wire.frame_length(struct.pack(">I", length))


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # a byte msgpack never uses
        msgpack.packb([[["g", 99, 1, 2, 3, 0, 0, 0, False, 0, 0, b"", [], None]], []]),
        msgpack.packb([[["g", 5, "one", 2, 3, 0, 0, 0, False, 0, 0, b"", [], None]], []]),
        msgpack.packb([[["g", 5, 1, 2]], []]),
        msgpack.packb([[["g", 5, 1, 2, 3, 0, 0, 0, False, 0, 0, b"", [[1, 2]], None]], []]),
        msgpack.packb({"not": "a list"}),
    ],
)
def test_malformed_raft_bodies_raise_frame_errors(body: bytes) -> None:
    with pytest.raises(FrameError):
        _, decoded = wire.decode_frame(bytes([wire.VERSION, FrameKind.RAFT]) + body)
        wire.decode_raft(decoded)


@pytest.mark.parametrize(
    "entry",
    [
        [1, 1, int(EntryKind.DATA), 1, b"not a record batch"],
        [1, 1, int(EntryKind.DATA), 2, build_batch([Record(b"one offset")])],
        [1, 1, int(EntryKind.NOOP), 3, b""],
    ],
)
def test_entries_the_log_could_not_store_are_frame_errors(entry: list[Any]) -> None:
    fields = ["g", int(MessageType.APPEND), 1, 2, 3, 0, 0, 0, False, 0, 0, b"", [entry], None]
    with pytest.raises(FrameError):
        wire.decode_message(fields)


@contextlib.asynccontextmanager
async def connected_pair(received: list[Message]) -> AsyncIterator[tuple[Transport, Transport]]:
    """Nodes 1 and 2 on loopback, linked both ways; node 2 puts the Raft messages it gets in
    `received`."""
    ports = free_ports(2)
    peers = {1: f"127.0.0.1:{ports[0]}", 2: f"127.0.0.1:{ports[1]}"}

    async def no_rpc(peer: int, method: str, args: Any) -> Any:
        return None

    def transport(node: int, on_raft: Any) -> Transport:
        return Transport(
            node,
            peers[node],
            peers,
            on_raft,
            no_rpc,
            lambda p, up, revived: None,
            lambda p: None,
            5.0,
            0.05,
        )

    one = transport(1, lambda peer, msgs, notices: None)
    two = transport(2, lambda peer, msgs, notices: received.extend(msgs))
    await one.start()
    await two.start()
    try:
        deadline = time.monotonic() + 10
        while not (one.alive(2) and two.alive(1)):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        yield one, two
    finally:
        await one.stop()
        await two.stop()


async def test_a_garbage_frame_closes_only_its_connection() -> None:
    received: list[Message] = []
    async with connected_pair(received) as (one, two):
        deadline = time.monotonic() + 5
        host, port = two.listen.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(wire.encode_frame(FrameKind.HELLO, {"node": 3}))
        writer.write(struct.pack(">IBB", 5, wire.VERSION, FrameKind.RAFT) + b"\xc1\xc1\xc1")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by node 2
        assert two.bad_frames == 1
        heartbeat = Message(MessageType.HEARTBEAT, src=1, dst=2, term=1, group="g")
        assert one.send(2, wire.encode_raft([heartbeat], []))
        while not received:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert received == [heartbeat] and one.alive(2)
        writer.close()


def receiving_connection(received: list[Message]) -> _PeerConnection:
    """A connection of node 2 that already heard node 1's HELLO, fed by hand below."""

    async def no_rpc(peer: int, method: str, args: Any) -> Any:
        return None

    owner = Transport(
        2,
        "127.0.0.1:1",
        {},
        lambda p, msgs, notices: received.extend(msgs),
        no_rpc,
        lambda p, up, revived: None,
        lambda p: None,
        5.0,
        0.05,
    )
    return _PeerConnection(owner, peer=1)


def feed(connection: _PeerConnection, data: bytes, chunks: list[int]) -> None:
    """Deliver `data` as the event loop would, in reads of the given sizes (cycled)."""
    position, turn = 0, 0
    while position < len(data):
        buffer = connection.get_buffer(-1)
        size = min(len(buffer), chunks[turn % len(chunks)], len(data) - position)
        buffer[:size] = data[position : position + size]
        connection.buffer_updated(size)
        position, turn = position + size, turn + 1


def assert_frames_arrive_whole(sizes: list[int], chunks: list[int]) -> None:
    messages = [
        append_message([Entry(5, 7, EntryKind.DATA, build_batch([Record(os.urandom(n))]), 1)])
        for n in sizes
    ]
    received: list[Message] = []
    connection = receiving_connection(received)
    feed(connection, b"".join(frame_bytes(wire.encode_raft([m], [])) for m in messages), chunks)
    assert received == messages
    assert connection.owner.bad_frames == 0


@pytest.mark.parametrize("chunks", [[1 << 30], [7, 4093, 65536], [300_000, 13]])
async def test_frames_of_every_size_arrive_whole_however_the_bytes_are_split(
    chunks: list[int],
) -> None:
    sizes = [10, 70_000, 1_000, 300_000, 5, 1_200_000, *[30_000, 50_000, 60_000] * 8, 100]
    assert_frames_arrive_whole(sizes, chunks)


async def test_small_and_large_frames_fed_one_byte_a_read_arrive_whole() -> None:
    # Every boundary falls inside a read; kept small since each byte is one Python call.
    assert_frames_arrive_whole([10, 70_000, 1_000, 5, 100], [1])


class ClosingTransport:
    closed = False

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # no socket to tune


async def test_a_large_frame_before_hello_closes_the_connection_unread() -> None:
    connection = receiving_connection([])
    connection.peer = None  # accepted, not yet named by a HELLO
    transport = ClosingTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    feed(connection, struct.pack(">IBB", 10_000_000, wire.VERSION, FrameKind.HELLO), [1 << 30])
    assert transport.closed and connection.owner.bad_frames == 1
    assert connection.frame is None  # no buffer was set aside for it


def many_entries_message(total: int) -> Message:
    """An APPEND of batches each below LARGE_BIN: one frame of about `total` bytes, no blobs."""
    per_entry = wire.LARGE_BIN // 2
    return append_message(
        [
            Entry(5 + i, 7, EntryKind.DATA, build_batch([Record(b"v" * per_entry)]), 1)
            for i in range(max(1, total // per_entry))
        ]
    )


async def test_a_connection_keeps_one_large_frame_buffer_of_a_bounded_size() -> None:
    received: list[Message] = []
    connection = receiving_connection(received)
    sizes = [1_000_000, 500_000, 6_000_000, 1_000_000]
    sent = [many_entries_message(n) for n in sizes]
    kept = []
    for message in sent:
        feed(connection, frame_bytes(wire.encode_raft([message], [])), [65536])
        kept.append(len(connection.large))
    assert received == sent
    first = kept[0]
    assert first > 900_000 and kept[1] == first  # the smaller frame reused it
    assert kept[2] == 0  # over KEPT_BUFFER_BYTES: let go once decoded
    assert kept[3] > 900_000


async def test_large_batches_are_received_into_their_own_bytes_without_a_frame_buffer() -> None:
    batch = build_batch([Record(os.urandom(1_000_000))])
    message = append_message([Entry(5, 7, EntryKind.DATA, batch, 1)])
    received: list[Message] = []
    connection = receiving_connection(received)
    feed(connection, frame_bytes(wire.encode_raft([message], [])), [65536])
    assert received == [message]
    assert type(received[0].entries[0].data) is bytes
    assert len(connection.large) == 0  # the frame buffer a copy would have come out of


def blobs_unit() -> tuple[list[Message], bytes, list[int]]:
    """Two APPENDs, two blobs and a small batch between them, a heartbeat behind: the bytes,
    and every offset where one frame or blob ends and the next begins."""
    batches = [build_batch([Record(os.urandom(n))]) for n in (wire.LARGE_BIN, 10, 200_000)]
    messages = [
        append_message([Entry(5 + i, 7, EntryKind.DATA, b, 1) for i, b in enumerate(batches)]),
        Message(MessageType.HEARTBEAT, src=1, dst=2, term=7, group="g"),
    ]
    pieces = [*wire.encode_raft(messages[:1], []), wire.encode_raft(messages[1:], [])]
    boundaries = [sum(map(len, pieces[:i])) for i in range(1, len(pieces))]
    return messages, b"".join(pieces), boundaries


@pytest.mark.parametrize("shift", [-5, -1, 0, 1, 4, 5, 6])
async def test_blobs_and_frames_split_at_every_boundary_arrive_whole(shift: int) -> None:
    messages, data, boundaries = blobs_unit()
    for boundary in boundaries:
        received: list[Message] = []
        connection = receiving_connection(received)
        cut = boundary + shift
        for part in (data[:cut], data[cut:]):  # each part in the largest reads there is room for
            feed(connection, part, [1 << 30])
        assert received == messages, f"split at {cut}"
        assert connection.owner.bad_frames == 0


async def test_blobs_fed_one_byte_a_read_arrive_whole() -> None:
    messages, data, _ = blobs_unit()
    received: list[Message] = []
    feed(receiving_connection(received), data, [1])
    assert received == messages


def blobs_frame(lengths: Any) -> bytes:
    return wire.encode_frame(FrameKind.BLOBS, lengths)


def placeholder(length: int) -> msgpack.ExtType:
    return msgpack.ExtType(wire.BLOB_EXT, struct.pack(">I", length))


def raft_frame_with(data: Any) -> bytes:
    fields = ["g", int(MessageType.APPEND), 1, 2, 3, 0, 0, 0, False, 0, 0, b"", [], None]
    fields[12] = [[5, 7, int(EntryKind.DATA), 1, data]]
    return wire.encode_frame(FrameKind.RAFT, [[fields], []])


BLOB = wire.LARGE_BIN


@pytest.mark.parametrize(
    "data",
    [
        blobs_frame([]),  # announces nothing
        blobs_frame([BLOB - 1]),  # a blob smaller than any the sender makes
        blobs_frame([BLOB, "two"]),
        blobs_frame([wire.MAX_FRAME, BLOB]),  # more than a frame may carry
        raft_frame_with(placeholder(BLOB)),  # a placeholder without blobs
        blobs_frame([BLOB]) + bytes(BLOB) + raft_frame_with(placeholder(BLOB + 1)),
        blobs_frame([BLOB, BLOB]) + bytes(2 * BLOB) + raft_frame_with(placeholder(BLOB)),
        blobs_frame([BLOB]) + bytes(BLOB) + wire.encode_frame(FrameKind.PING, []),
        blobs_frame([BLOB]) + bytes(BLOB) + blobs_frame([BLOB]),
    ],
)
async def test_blobs_that_do_not_match_their_raft_frame_close_the_connection(data: bytes) -> None:
    received: list[Message] = []
    connection = receiving_connection(received)
    transport = ClosingTransport()
    connection.transport = transport  # type: ignore[assignment]
    feed(connection, data, [1 << 30])
    assert transport.closed and connection.owner.bad_frames == 1
    assert received == []


async def test_blobs_before_hello_close_the_connection() -> None:
    connection = receiving_connection([])
    connection.peer = None
    transport = ClosingTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    feed(connection, blobs_frame([BLOB]), [1 << 30])
    assert transport.closed and connection.owner.bad_frames == 1
    assert connection.filling == []  # no blob was set aside for it


async def test_a_peer_receives_exactly_the_batch_bytes_its_leader_sent() -> None:
    received: list[Message] = []
    async with connected_pair(received) as (one, two):
        deadline = time.monotonic() + 10
        batches = [build_batch([Record(os.urandom(n))]) for n in (1_000_000, 100, 300_000)]
        sent = [
            append_message([Entry(5 + i, 7, EntryKind.DATA, b, 1) for i, b in enumerate(batches)])
            for _ in range(3)
        ]
        for message in sent:
            assert one.send(2, wire.encode_raft([message], []))
        while len(received) < len(sent):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert received == sent
        assert [e.data for m in received for e in m.entries] == batches * 3
        assert two.bad_frames == 0
