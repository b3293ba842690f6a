"""The node-to-node wire format: length-prefixed, versioned frames with msgpack bodies.

Owns frame layout and Raft message encoding; record batch bytes travel as msgpack bin, untouched.

Frame: u32 length of what follows | u8 version | u8 kind | msgpack body.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

import msgpack

from raftline.raftlog.batch import parse_header
from raftline.raftlog.types import Entry, EntryKind, Message, MessageType, SnapshotMeta

VERSION = 1
MAX_FRAME = 64 * 1024 * 1024  # a full APPEND is capped near 1 MiB; this bounds a bad length
PREFIX = struct.Struct(">IBB")
LENGTH = struct.Struct(">I")
# Entries carrying batches of at least this size are framed without msgpack copying them; at
# 64 KiB and above msgpack encodes bin as bin 32: 0xc6 and a big-endian u32 length.
LARGE_BIN = 64 * 1024
_BIN32 = struct.Struct(">BI")


# A frame: its bytes, or pieces whose concatenation is the frame, so that large batches reach
# the socket without being copied into one buffer (a transport's writelines takes the pieces).
Frame = bytes | list[bytes]


class FrameKind(IntEnum):
    HELLO = 1  # {"node": id}: the first frame on a connection names the dialing node
    RAFT = 2  # [messages, notices]: everything for one peer from one driver round
    PING = 3  # []: node-pair liveness, sent every tick the link carried nothing else
    RPC_REQUEST = 4  # [id, method, args]
    RPC_RESPONSE = 5  # [id, ok, result or [code, message]]


class FrameError(ValueError):
    """Bytes that are not a frame of this protocol; the connection carrying them is closed."""


def encode_frame(kind: FrameKind, body: Any) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    return b"".join(_framed(kind, [payload], len(payload)))


def _framed(kind: FrameKind, parts: list[bytes], size: int) -> list[bytes]:
    """The pieces of the frame of a body encoded as `parts` (`size` bytes in all)."""
    if size + 2 > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return [PREFIX.pack(size + 2, VERSION, kind), *parts]


def _encode_parts(body: Any) -> tuple[list[bytes], int]:
    """`body` as msgpack.packb(body, use_bin_type=True) would encode it, as pieces whose
    concatenation is that encoding: bin values of LARGE_BIN bytes or more are pieces of
    their own, referenced rather than copied (packb copies a 1 MB batch twice, the frame
    prefix a third time)."""
    packer = msgpack.Packer(use_bin_type=True)
    parts: list[bytes] = []
    small = bytearray()  # encoded bytes since the last large value

    def walk(item: Any) -> None:
        nonlocal small
        kind = type(item)
        if kind is list or kind is tuple:
            small += packer.pack_array_header(len(item))
            for element in item:
                walk(element)
        elif kind is bytes and len(item) >= LARGE_BIN:
            small += _BIN32.pack(0xC6, len(item))
            parts.extend((bytes(small), item))
            small = bytearray()
        else:
            small += packer.pack(item)

    walk(body)
    parts.append(bytes(small))
    return parts, sum(map(len, parts))


def frame_length(prefix: bytes) -> int:
    """Length announced by a 4-byte prefix, checked against the limit."""
    (length,) = LENGTH.unpack(prefix)
    if not 2 <= length <= MAX_FRAME:
        raise FrameError(f"implausible frame length {length}")
    return length


def decode_frame(data: bytes) -> tuple[FrameKind, Any]:
    """Decode what follows the length prefix: version, kind, body."""
    if len(data) < 2:
        raise FrameError("frame shorter than its header")
    if data[0] != VERSION:
        raise FrameError(f"unsupported frame version {data[0]}")
    try:
        kind = FrameKind(data[1])
        body = msgpack.unpackb(memoryview(data)[2:], raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise FrameError(f"undecodable frame: {exc}") from exc
    return kind, body


def encode_message(msg: Message) -> list[Any]:
    snapshot = msg.snapshot
    return [
        msg.group,
        int(msg.type),
        msg.src,
        msg.dst,
        msg.term,
        msg.log_index,
        msg.log_term,
        msg.commit,
        msg.reject,
        msg.reject_hint,
        msg.hint_term,
        msg.context,
        [[e.index, e.term, int(e.kind), e.count, e.data] for e in msg.entries],
        None
        if snapshot is None
        else [snapshot.index, snapshot.term, list(snapshot.voters), list(snapshot.learners)],
    ]


def _int(value: Any) -> int:
    if type(value) is not int:
        raise FrameError(f"expected an integer, got {type(value).__name__}")
    return value


def _bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise FrameError(f"expected bytes, got {type(value).__name__}")
    return value


def as_list(value: Any, length: int | None = None) -> list[Any]:
    if type(value) is not list or (length is not None and len(value) != length):
        raise FrameError(f"expected a list of {length or 'any'} items")
    return value


def _checked(entry: Entry) -> Entry:
    """Refuse entries the log could not store, so bad bytes close a connection, not the node."""
    if entry.kind in (EntryKind.NOOP, EntryKind.CONFIG):
        if entry.count != 1:
            raise FrameError(f"{entry.kind.name} entry with count {entry.count}")
        return entry
    header = parse_header(entry.data)  # CorruptBatchError is a ValueError
    if (
        header.size != len(entry.data)
        or header.offset_count != entry.count
        or header.is_control != (entry.kind == EntryKind.CONTROL)
    ):
        raise FrameError(f"entry at {entry.index} does not match its record batch")
    return entry


_MESSAGE_TYPES = {int(t): t for t in MessageType}


def decode_message(fields: Any) -> Message:
    """One message of a RAFT frame, every field checked. The common message (a heartbeat, an
    answer, a vote: no entries, no snapshot) takes one type check of all its integers and a
    table lookup of its type: decoded field by field it cost ~10 us, the largest share of a
    node's loop while thousands of new groups elect and heartbeat."""
    (
        group,
        mtype,
        src,
        dst,
        term,
        log_index,
        log_term,
        commit,
        reject,
        reject_hint,
        hint_term,
        context,
        entries,
        snapshot,
    ) = as_list(fields, 14)
    kind_of = _MESSAGE_TYPES.get(mtype) if type(mtype) is int else None
    if (
        type(group) is not str
        or type(reject) is not bool
        or type(context) is not bytes
        or type(entries) is not list
        or kind_of is None
    ):
        raise FrameError("bad message group, type, reject flag, context or entries")
    for value in (src, dst, term, log_index, log_term, commit, reject_hint, hint_term):
        if type(value) is not int:
            raise FrameError(f"expected an integer, got {type(value).__name__}")
    decoded = []
    if entries:
        try:
            decoded = [
                _checked(Entry(_int(i), _int(t), EntryKind(_int(k)), _bytes(d), _int(c)))
                for i, t, k, c, d in (as_list(e, 5) for e in entries)
            ]
        except ValueError as exc:
            raise FrameError(f"bad message: {exc}") from exc
    meta = None
    if snapshot is not None:
        s_index, s_term, voters, learners = as_list(snapshot, 4)
        meta = SnapshotMeta(
            _int(s_index),
            _int(s_term),
            tuple(_int(v) for v in as_list(voters)),
            tuple(_int(v) for v in as_list(learners)),
        )
    return Message(
        kind_of,
        src,
        dst,
        term,
        group,
        log_index,
        log_term,
        decoded,
        commit,
        reject,
        reject_hint,
        hint_term,
        meta,
        context,
    )


def encode_raft(messages: list[Message], notices: list[list[Any]]) -> Frame:
    body = [[encode_message(m) for m in messages], notices]
    if not any(len(e.data) >= LARGE_BIN for m in messages for e in m.entries):
        return encode_frame(FrameKind.RAFT, body)
    parts, size = _encode_parts(body)
    return _framed(FrameKind.RAFT, parts, size)


def decode_raft(body: Any) -> tuple[list[Message], list[list[Any]]]:
    messages, notices = as_list(body, 2)
    return [decode_message(m) for m in as_list(messages)], [as_list(n) for n in as_list(notices)]
