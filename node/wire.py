"""The node-to-node wire format: length-prefixed, versioned frames with msgpack bodies.

Owns frame layout and Raft message encoding; record batch bytes travel untouched: as msgpack bin,
or (batches of LARGE_BIN bytes or more) as raw blobs between a BLOBS frame and their RAFT frame.

Frame: u32 length of what follows | u8 version | u8 kind | msgpack body.
A RAFT frame with large batches goes as: a BLOBS frame (body: the blobs' lengths), the blobs'
bytes back to back, then the RAFT frame, where each of those batches is the msgpack ext BLOB_EXT
holding its length. The receiver allocates each batch's final bytes from the BLOBS frame and has
the kernel write the blobs straight into them: no frame buffer, no copy out of it.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

import msgpack

from raftline.raftlog.batch import parse_header
from raftline.raftlog.speedups import C
from raftline.raftlog.types import Entry, EntryKind, Message, MessageType, SnapshotMeta

VERSION = 1
MAX_FRAME = 64 * 1024 * 1024  # a full APPEND is capped near 1 MiB; this bounds a bad length
PREFIX = struct.Struct(">IBB")
LENGTH = struct.Struct(">I")
# Entries carrying batches of at least this size travel as blobs (module docstring).
LARGE_BIN = 64 * 1024
BLOB_EXT = 1  # msgpack ext type of a RAFT frame's placeholder for the next blob


# A frame: its bytes, or pieces whose concatenation goes to the socket as one unit (a BLOBS
# frame, its blobs and their RAFT frame), so that large batches reach the socket without being
# copied into one buffer (a transport's writelines takes the pieces).
Frame = bytes | list[bytes]


class FrameKind(IntEnum):
    HELLO = 1  # {"node": id}: the first frame on a connection names the dialing node
    RAFT = 2  # [messages, notices]: everything for one peer from one driver round
    PING = 3  # []: node-pair liveness, sent every tick the link carried nothing else
    RPC_REQUEST = 4  # [id, method, args]
    RPC_RESPONSE = 5  # [id, ok, result or [code, message]]
    BLOBS = 6  # [length, ...]: that many raw bytes follow, then the RAFT frame they belong to


_FRAME_KINDS = {int(k): k for k in FrameKind}  # a lookup: calling the enum costs two calls


class FrameError(ValueError):
    """Bytes that are not a frame of this protocol; the connection carrying them is closed."""


def encode_frame(kind: FrameKind, body: Any) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    if len(payload) + 2 > MAX_FRAME:
        raise FrameError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return PREFIX.pack(len(payload) + 2, VERSION, kind) + payload


def frame_length(prefix: bytes) -> int:
    """Length announced by a 4-byte prefix, checked against the limit."""
    (length,) = LENGTH.unpack(prefix)
    if not 2 <= length <= MAX_FRAME:
        raise FrameError(f"implausible frame length {length}")
    return length


def decode_frame(
    data: bytes | bytearray | memoryview, blobs: Blobs | None = None
) -> tuple[FrameKind, Any]:
    """Decode what follows the length prefix: version, kind, body. `blobs`: those announced by
    the BLOBS frame before this one, which its BLOB_EXT placeholders stand for, in order."""
    if len(data) < 2:
        raise FrameError("frame shorter than its header")
    if data[0] != VERSION:
        raise FrameError(f"unsupported frame version {data[0]}")
    kind = _FRAME_KINDS.get(data[1])
    if kind is None:
        raise FrameError(f"undecodable frame: unknown kind {data[1]}")
    try:
        body = msgpack.unpackb(
            memoryview(data)[2:],
            raw=False,
            strict_map_key=True,
            ext_hook=_no_ext if blobs is None else blobs.claim,
        )
    except (ValueError, msgpack.UnpackException) as exc:
        raise FrameError(f"undecodable frame: {exc}") from exc
    if blobs is not None and (kind is not FrameKind.RAFT or blobs.claimed != len(blobs.data)):
        raise FrameError("a BLOBS frame's blobs do not match the RAFT frame after them")
    return kind, body


def _no_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"msgpack ext {code} outside a RAFT frame that follows its blobs")


class Blobs:
    """The blobs a BLOBS frame announced: buffers of their final size, filled in turn by the
    receiver, then claimed in order by the placeholders of the RAFT frame that follows."""

    def __init__(self, lengths: Any) -> None:
        lengths = as_list(lengths)
        if not lengths or any(type(n) is not int or n < LARGE_BIN for n in lengths):
            raise FrameError(f"a BLOBS frame needs a list of blob lengths of {LARGE_BIN} or more")
        if sum(lengths) > MAX_FRAME:
            raise FrameError(f"blobs of {sum(lengths)} bytes exceed {MAX_FRAME}")
        self.data: list[bytes] = []
        self.views: list[memoryview] = []  # writable, one per blob, until finished()
        for length in lengths:
            if C is None:  # bytearrays, copied into bytes once filled
                buffer = bytearray(length)
                self.views.append(memoryview(buffer))
            else:
                data, view = C.unfilled_bytes(length)
                self.data.append(data)
                self.views.append(view)
        self.claimed = 0

    def finished(self) -> None:
        """Every view is filled: the views go, the bytes may be read from here on."""
        if C is None:
            self.data = [bytes(view) for view in self.views]
        for view in self.views:
            view.release()
        self.views = []

    def claim(self, code: int, data: bytes) -> bytes:
        """msgpack's ext_hook: the next blob, for a placeholder that names its length."""
        if code != BLOB_EXT or len(data) != LENGTH.size or self.claimed == len(self.data):
            raise FrameError(f"unexpected msgpack ext {code} of {len(data)} bytes")
        blob = self.data[self.claimed]
        if LENGTH.unpack(data)[0] != len(blob):
            raise FrameError("a blob placeholder names another length than its blob")
        self.claimed += 1
        return blob


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
_ENTRY_KINDS = {int(k): k for k in EntryKind}


def _entry(fields: Any) -> Entry:
    """One entry of an APPEND, checked (a type check per field and a table lookup of its
    kind, as decode_message does: every message a follower stores comes through here)."""
    if type(fields) is not list or len(fields) != 5:
        raise FrameError("expected a list of 5 items")
    index, term, kind, count, data = fields
    entry_kind = _ENTRY_KINDS.get(kind) if type(kind) is int else None
    if (
        type(index) is not int
        or type(term) is not int
        or type(count) is not int
        or type(data) is not bytes
        or entry_kind is None
    ):
        raise FrameError("bad entry offset, term, kind, count or data")
    return _checked(Entry(index, term, entry_kind, data, count))


def decode_message(fields: Any) -> Message:
    """One message of a RAFT frame, every field checked. The common message (a heartbeat, an
    answer, a vote: no entries, no snapshot) takes one type check of all its integers and a
    table lookup of its type: decoded field by field it cost ~10 us, the largest share of a
    node's loop while thousands of new groups elect and heartbeat."""
    if type(fields) is not list or len(fields) != 14:
        raise FrameError("expected a list of 14 items")
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
    ) = fields
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
            decoded = [_entry(fields) for fields in entries]
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
    """A RAFT frame; where entries carry batches of LARGE_BIN bytes or more, preceded by a
    BLOBS frame and those batches themselves (referenced, not copied)."""
    encoded = [encode_message(m) for m in messages]
    blobs: list[bytes] = []
    for fields in encoded:
        for entry in fields[12]:
            data = entry[4]
            if len(data) >= LARGE_BIN:
                blobs.append(data)
                entry[4] = msgpack.ExtType(BLOB_EXT, LENGTH.pack(len(data)))
    raft = encode_frame(FrameKind.RAFT, [encoded, notices])
    if not blobs:
        return raft
    return [encode_frame(FrameKind.BLOBS, [len(b) for b in blobs]), *blobs, raft]


def decode_raft(body: Any) -> tuple[list[Message], list[list[Any]]]:
    # The checks of as_list written out: this runs for every frame between two nodes.
    if type(body) is not list or len(body) != 2:
        raise FrameError("expected a list of 2 items")
    messages, notices = body
    if type(messages) is not list or type(notices) is not list:
        raise FrameError("expected a list of any items")
    for notice in notices:
        if type(notice) is not list:
            raise FrameError("expected a list of any items")
    return [decode_message(m) for m in messages], notices
