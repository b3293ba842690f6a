"""Frames between nodes: encoding, rejection of malformed bytes, and what a bad frame closes."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from typing import Any

import msgpack
import pytest

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


def test_a_frame_carrying_large_batches_references_them_and_encodes_its_messages() -> None:
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
    frame = wire.encode_raft([msg], notices)
    assert sum(part is large for part in frame) == 2  # the batch itself, not a copy, twice
    assert frame_bytes(frame) == wire.encode_frame(
        FrameKind.RAFT, [[wire.encode_message(msg)], notices]
    )
    _, body = roundtrip(frame)
    assert wire.decode_raft(body) == ([msg], notices)


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_garbage_frame_closes_only_its_connection() -> None:
    ports = free_port(), free_port()
    peers = {1: f"127.0.0.1:{ports[0]}", 2: f"127.0.0.1:{ports[1]}"}
    received: list[Message] = []

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
        deadline = time.monotonic() + 5
        while not (one.alive(2) and two.alive(1)):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[1])
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
    finally:
        await one.stop()
        await two.stop()


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


async def test_a_connection_keeps_one_large_frame_buffer_of_a_bounded_size() -> None:
    received: list[Message] = []
    connection = receiving_connection(received)
    sizes = [1_000_000, 500_000, 6_000_000, 1_000_000]
    kept = []
    for n in sizes:
        message = append_message([Entry(5, 7, EntryKind.DATA, build_batch([Record(b"v" * n)]), 1)])
        feed(connection, frame_bytes(wire.encode_raft([message], [])), [65536])
        kept.append(len(connection.large))
    assert [len(m.entries[0].data) for m in received] == [
        len(build_batch([Record(b"v" * n)])) for n in sizes
    ]
    first = kept[0]
    assert first > 1_000_000 and kept[1] == first  # the smaller frame reused it
    assert kept[2] == 0  # over KEPT_BUFFER_BYTES: let go once decoded
    assert kept[3] > 1_000_000
