"""One TCP connection per node pair carrying every Raft group's traffic, plus link liveness and RPC.

Owns dialing, accepting, frame reading/writing, per-peer liveness, request/response calls, and the
test-only hold on outgoing frames (LinkFaults: delay, reorder, duplicate) at the send point.

Frames are received without copies of their own: the kernel writes small frames into one
scratch buffer they are decoded from, a large frame straight into a buffer of its size, and the
large batches of an APPEND (the blobs of wire.py) straight into the bytes objects the log keeps.
A StreamReader copied every byte three times (buffer, readexactly, bytes); msgpack copied each
batch once more out of the frame buffer.

The node with the lower id dials the higher one; both directions share that connection. A peer
counts as alive while its link is up and a frame arrived within `dead_after_s` (every node sends a
PING each tick on a link that carried nothing else): requests, calls and forwards go by that.
A peer counts as gone, which wakes the quiet groups it leads, once its connection closed or it
was silent past the dead-after window: `dead_after_s` on a node whose loop runs on time, wider
on one whose own loop stalled recently (node/liveness.py). A frame that does not parse closes
only the connection it arrived on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from raftline.node import wire
from raftline.node.config import parse_address
from raftline.node.liveness import DeadAfterWindow
from raftline.node.netfaults import LinkFaults
from raftline.node.wire import FrameError, FrameKind
from raftline.raftlog.types import Message

log = logging.getLogger(__name__)

MAX_WRITE_BUFFER = 32 * 1024 * 1024  # beyond this a peer is not reading: drop, Raft resends
SCRATCH_BYTES = 256 * 1024  # receive buffer of a connection: small frames are decoded in place
# A frame of at least this many bytes that is not yet wholly received gets a buffer of its own.
OWN_BUFFER_BYTES = 64 * 1024
# That buffer is kept for the connection's next large frame up to this size (an APPEND of 1 MB
# batches): no fresh, zero-filled megabyte per frame.
KEPT_BUFFER_BYTES = 4 * 1024 * 1024


# tcp(7) TCP_RTO_MIN_US (Linux 6.15+): the floor of a socket's retransmission timeout. Nodes
# share one network, where round trips take well under a millisecond; Linux's default floor of
# 200 ms makes one lost segment stall every group on a node pair's one connection that long.
TCP_RTO_MIN_US = 45
PEER_RTO_MIN_US = 10_000
# tcp(7) TCP_RTO_MAX_MS (Linux 6.15+): the ceiling of that timeout as it doubles while nothing is
# acknowledged. At Linux's default of 120 s, a connection cut for 20 s by a network partition
# next retransmitted up to 20 s after the heal, and the groups whose traffic it carries waited
# that long. At 1 s (the least Linux allows) each side retransmits every second while cut, so a
# healed link carries frames again within a second; a fresh dial retries its SYN as often.
# Linux gives a connection up after tcp_retries2 (15) unanswered retransmissions, so now after
# about 15 s of a cut, not 15 min: a longer cut heals on a new connection, as after a restart.
TCP_RTO_MAX_MS = 44
PEER_RTO_MAX_MS = 1_000


def tune_peer_socket(sock: Any) -> None:
    """Bound the retransmission timeout of a node-to-node socket (where the kernel can): a lower
    floor than Linux's default, and a ceiling for its backoff."""
    if sock is None:
        return
    for option, value in ((TCP_RTO_MIN_US, PEER_RTO_MIN_US), (TCP_RTO_MAX_MS, PEER_RTO_MAX_MS)):
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


# RPC error code of a call whose outcome is unknown: it was sent, and the link failed before
# the answer came (or the remote's own answer was that it cannot know). Never retried blindly.
OUTCOME_UNKNOWN = "outcome_unknown"


class RemoteError(Exception):
    """An RPC failed on the remote node (or never reached it); `code` follows API.md's codes,
    or is OUTCOME_UNKNOWN. `leader_unavailable` means the call had no effect."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


RaftHandler = Callable[[int, list[Message], list[list[Any]]], None]
RpcHandler = Callable[[int, str, Any], Awaitable[Any]]
# (peer, up, revived): revived is a link up again on the connection it had, without reconnecting
LinkHandler = Callable[[int, bool, bool], None]
GoneHandler = Callable[[int], None]  # peer: its connection closed, or silent past the window


@dataclass
class _Link:
    transport: asyncio.Transport
    last_heard: float = field(default_factory=time.monotonic)
    sent_since_tick: bool = False
    alive: bool = True
    gone: bool = False  # silent past the dead-after window (told once until heard again)


class Transport:
    def __init__(
        self,
        node_id: int,
        listen: str,
        peers: dict[int, str],
        on_raft: RaftHandler,
        on_rpc: RpcHandler,
        on_link: LinkHandler,
        on_gone: GoneHandler,
        dead_after_s: float,
        tick_s: float,
    ) -> None:
        self.node_id = node_id
        self.listen = listen
        self.addresses = {p: a for p, a in peers.items() if p != node_id}
        self._on_raft = on_raft
        self._on_rpc = on_rpc
        self._on_link = on_link
        self._on_gone = on_gone
        self.dead_after = DeadAfterWindow(dead_after_s, tick_s)
        self._last_tick = time.monotonic()
        self._links: dict[int, _Link] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._calls_to: dict[int, int] = {}  # call id -> the peer it went to
        self._connections: set[_PeerConnection] = set()  # open ones, named by HELLO or not
        self._call_ids = itertools.count(1)
        self.frames_sent = 0
        self.frames_received = 0
        self.frames_dropped = 0
        self.bad_frames = 0
        self.peers_gone = 0  # silent past the dead-after window, or connection closed
        # Test hook only: None keeps send() on its direct path.
        self.link_faults: LinkFaults | None = None
        self.frames_held = 0  # copies sent late by the fault hook, duplicates included
        self.frames_duplicated = 0
        self._fault_rng = random.Random()
        self._held: set[asyncio.TimerHandle] = set()

    async def start(self) -> None:
        host, port = parse_address(self.listen)
        loop = asyncio.get_running_loop()
        self._last_tick = time.monotonic()  # the time since construction was no stall
        self._server = await loop.create_server(lambda: _PeerConnection(self, None), host, port)
        for peer in self.addresses:
            if peer > self.node_id:
                self._spawn(self._dial_forever(peer))

    async def stop(self) -> None:
        if self._server:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for handle in self._held:
            handle.cancel()
        self._held.clear()
        for connection in list(self._connections):
            connection.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(RemoteError(OUTCOME_UNKNOWN, "node stopping"))

    def alive(self, peer: int) -> bool:
        if peer == self.node_id:
            return True
        link = self._links.get(peer)
        return link is not None and link.alive

    def add_peer(self, peer: int, address: str) -> None:
        """Learn a peer's Raft address from the metadata registry; dial it if we are the dialer."""
        if peer == self.node_id or self.addresses.get(peer) == address:
            return
        known = peer in self.addresses
        self.addresses[peer] = address
        if not known and peer > self.node_id and self._server is not None:
            self._spawn(self._dial_forever(peer))

    def send(self, peer: int, frame: wire.Frame) -> bool:
        faults = self.link_faults
        if faults is not None and faults.applies_to(peer):
            return self._send_late(peer, frame, faults)
        return self._write(peer, frame)

    def _send_late(self, peer: int, frame: wire.Frame, faults: LinkFaults) -> bool:
        """Hold `frame` per the injected faults. A held frame goes out on whatever link is up
        when it is due, so it may arrive after later frames: Raft and the call ids tolerate
        that. RPC requests are never duplicated: unlike Raft messages they are not idempotent."""
        if peer not in self._links:
            return False
        kind = wire.PREFIX.unpack_from(frame if type(frame) is bytes else frame[0])[2]
        may_duplicate = kind in (FrameKind.RAFT, FrameKind.BLOBS, FrameKind.PING)
        loop = asyncio.get_running_loop()
        delays = faults.send_delays_s(self._fault_rng, may_duplicate)
        self.frames_duplicated += len(delays) - 1
        for delay in delays:
            if delay <= 0:
                self._write(peer, frame)
            else:
                self._held.add(loop.call_later(delay, self._write, peer, frame))
                self.frames_held += 1
        self._links[peer].sent_since_tick = True
        return True

    def _write(self, peer: int, frame: wire.Frame) -> bool:
        link = self._links.get(peer)
        if link is None:
            return False
        transport = link.transport
        if transport.is_closing() or transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.frames_dropped += 1
            return False
        if type(frame) is bytes:
            transport.write(frame)
        else:
            transport.writelines(frame)
        link.sent_since_tick = True
        self.frames_sent += 1
        return True

    def tick(self) -> None:
        """Once per node tick: keep quiet links visibly alive and notice silent peers."""
        now = time.monotonic()
        if self._held:  # forget the holds that have fired; stop() cancels the rest
            loop_now = asyncio.get_running_loop().time()
            self._held = {h for h in self._held if h.when() > loop_now}
        stalled = now - self._last_tick
        self._last_tick = now
        self.dead_after.observe_tick(now, stalled)
        dead_after = self.dead_after.seconds()
        if stalled > self.dead_after.base_s / 2:
            # This node did not run for a while (starved of CPU, or one long step): what its
            # peers sent meanwhile may still wait unread, so that time does not count as their
            # silence. Declaring every peer dead after its own stall woke thousands of groups.
            for link in self._links.values():
                link.last_heard = min(now, link.last_heard + stalled)
        ping = wire.encode_frame(FrameKind.PING, [])
        for peer, link in list(self._links.items()):
            if not link.sent_since_tick:
                self.send(peer, ping)
            link.sent_since_tick = False
            silence = now - link.last_heard
            silent = silence > self.dead_after.base_s
            if link.alive and silent:
                link.alive = False
                log.info("link to node %s down: silent for %.2f s", peer, silence)
                self._link_down(peer)
            elif not link.alive and not silent:
                link.alive, link.gone = True, False
                log.info("link to node %s alive again on the same connection", peer)
                self._on_link(peer, True, True)  # heard again on the same connection
            if not link.gone and silence > dead_after:
                link.gone = True
                self.peers_gone += 1
                self._on_gone(peer)

    async def call(self, peer: int, method: str, args: Any, timeout: float) -> Any:
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        self._calls_to[call_id] = peer
        try:
            frame = wire.encode_frame(FrameKind.RPC_REQUEST, [call_id, method, args])
            if not self.send(peer, frame):
                raise RemoteError("leader_unavailable", f"no connection to node {peer}")
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError as exc:
            raise RemoteError("timeout", f"node {peer} did not answer {method}") from exc
        finally:
            self._calls.pop(call_id, None)
            self._calls_to.pop(call_id, None)

    def _link_down(self, peer: int) -> None:
        """`peer` went silent or its connection closed: its calls in flight fail now (the
        caller may retry elsewhere) rather than at their timeout."""
        for call_id in [c for c, p in self._calls_to.items() if p == peer]:
            fut = self._calls[call_id]
            if not fut.done():
                fut.set_exception(RemoteError(OUTCOME_UNKNOWN, f"node {peer} became unreachable"))
        self._on_link(peer, False, False)

    # connections

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dial_forever(self, peer: int) -> None:
        loop = asyncio.get_running_loop()
        backoff = 0.05
        while True:
            try:
                sock = await self._dial_socket(peer)
                _, connection = await loop.create_connection(
                    lambda: _PeerConnection(self, peer), sock=sock
                )
            except OSError:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            await connection.closed
            await asyncio.sleep(backoff)  # a peer that accepts and drops at once is not spun on

    async def _dial_socket(self, peer: int) -> socket.socket:
        """A socket connected to `peer` (its addresses tried in turn), tuned before its SYN: a
        dial into a partition then retries its SYN every second, not 1, 2, 4 ... s apart."""
        loop = asyncio.get_running_loop()
        host, port = parse_address(self.addresses[peer])
        failure = OSError(f"no address for node {peer}")
        for family, kind, proto, _, address in await loop.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        ):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                tune_peer_socket(sock)
                await loop.sock_connect(sock, address)
                return sock
            except OSError as exc:
                sock.close()
                failure = exc
            except BaseException:
                sock.close()
                raise
        raise failure

    def _attach(self, peer: int, transport: asyncio.Transport) -> None:
        """A connection to `peer` is up (dialed, or accepted and named by its HELLO)."""
        old = self._links.get(peer)
        if old is not None:
            old.transport.close()
        self._links[peer] = _Link(transport)
        log.info("link to node %s up on a new connection", peer)
        self._on_link(peer, True, False)

    def _detach(self, peer: int, transport: asyncio.Transport) -> None:
        link = self._links.get(peer)
        if link is not None and link.transport is transport:
            del self._links[peer]
            log.info("link to node %s down: connection closed", peer)
            self._link_down(peer)
            if not link.gone:
                self.peers_gone += 1
                self._on_gone(peer)

    def _received(self, peer: int, kind: FrameKind, body: Any) -> None:
        link = self._links.get(peer)
        if link is not None:
            link.last_heard = time.monotonic()
        self.frames_received += 1
        self._dispatch(peer, kind, body)

    def _dispatch(self, peer: int, kind: FrameKind, body: Any) -> None:
        if kind is FrameKind.RAFT:
            messages, notices = wire.decode_raft(body)
            self._on_raft(peer, messages, notices)
        elif kind is FrameKind.RPC_REQUEST:
            call_id, method, args = wire.as_list(body, 3)
            if type(call_id) is not int or type(method) is not str:
                raise FrameError("bad RPC request")
            self._spawn(self._answer(peer, call_id, method, args))
        elif kind is FrameKind.RPC_RESPONSE:
            call_id, ok, result = wire.as_list(body, 3)
            fut = self._calls.get(call_id)
            if fut is None or fut.done():
                return
            if ok:
                fut.set_result(result)
            else:
                code, message = wire.as_list(result, 2)
                fut.set_exception(RemoteError(str(code), str(message)))
        elif kind is FrameKind.HELLO:
            raise FrameError("HELLO after the connection was established")

    async def _answer(self, peer: int, call_id: int, method: str, args: Any) -> None:
        try:
            body = [call_id, True, await self._on_rpc(peer, method, args)]
        except Exception as exc:  # the caller gets the error; this node keeps running
            code = getattr(exc, "rpc_code", None) or getattr(exc, "code", "internal")
            if code == "internal":
                log.exception("RPC %s from node %s failed", method, peer)
            body = [call_id, False, [code, str(getattr(exc, "message", exc))]]
        with contextlib.suppress(FrameError):
            self.send(peer, wire.encode_frame(FrameKind.RPC_RESPONSE, body))


class _PeerConnection(asyncio.BufferedProtocol):
    """One connection of a node pair: receives frames and hands them to the Transport.

    Bytes land in `scratch`, where whole frames are decoded in place. A large frame that is
    still arriving moves to a buffer of its own (`large`, kept for the next one) that the rest
    is received into; the blobs a BLOBS frame announces are received into their own bytes, and
    handed to the RAFT frame that follows them. A connection this node accepted is anonymous
    until its first frame, a HELLO, names the peer.
    """

    def __init__(self, owner: Transport, peer: int | None) -> None:
        self.owner = owner
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.scratch = bytearray(SCRATCH_BYTES)
        self.start = 0  # scratch[start:end] holds received bytes not yet decoded
        self.end = 0
        self.large = bytearray()  # holds the large frames, one at a time
        self.frame: memoryview | None = None  # a large frame being received, without its prefix
        self.blobs: wire.Blobs | None = None  # announced, for the next RAFT frame
        self.filling: list[memoryview] = []  # the socket's bytes go here in turn, then to scratch
        self.filled = 0  # bytes of filling[0] received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        tune_peer_socket(transport.get_extra_info("socket"))
        self.owner._connections.add(self)
        if self.peer is not None:  # we dialed: introduce ourselves
            self.transport.write(wire.encode_frame(FrameKind.HELLO, {"node": self.owner.node_id}))
            self.owner._attach(self.peer, self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._connections.discard(self)
        if self.peer is not None and self.transport is not None:
            self.owner._detach(self.peer, self.transport)
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.filling:
            return self.filling[0][self.filled :]
        return memoryview(self.scratch)[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self.filling:
                self.filled += nbytes
                if self.filled == len(self.filling[0]):
                    del self.filling[0]
                    self.filled = 0
                    if not self.filling:
                        self._filled()
                return
            self.end += nbytes
            self._decode_scratch()
        except FrameError as exc:
            self.owner.bad_frames += 1
            if self.peer is None:
                log.warning("closing inbound connection before HELLO: %s", exc)
            else:
                log.warning("closing connection to node %s: %s", self.peer, exc)
            self.close()

    def _filled(self) -> None:
        """The large frame, or the last blob, has been received whole."""
        if self.frame is None:
            assert self.blobs is not None
            self.blobs.finished()  # the RAFT frame they belong to comes next
            return
        frame, self.frame = self.frame, None
        if len(self.large) > KEPT_BUFFER_BYTES:
            self.large = bytearray()  # the frame's view keeps it while decoded
        self._frame(frame)

    def _decode_scratch(self) -> None:
        scratch, prefix = self.scratch, wire.LENGTH.size
        view = memoryview(scratch)
        try:
            while self.end - self.start >= prefix:
                length = wire.frame_length(scratch[self.start : self.start + prefix])
                if self.peer is None and length > OWN_BUFFER_BYTES:
                    raise FrameError(f"a {length}-byte frame before HELLO")
                body_at, have = self.start + prefix, self.end - self.start - prefix
                if have >= length:
                    self.start = body_at + length
                    self._frame(view[body_at : self.start])
                    if self.blobs is not None and self.blobs.views and self._fill_blobs(view):
                        break  # the rest of the blobs comes straight from the socket
                elif length >= OWN_BUFFER_BYTES:
                    if len(self.large) < length:
                        self.large = bytearray(length)
                    self.frame = memoryview(self.large)[:length]
                    self.frame[:have] = view[body_at : self.end]
                    self.filling, self.filled = [self.frame], have
                    self.start = self.end = 0
                    return
                else:
                    break
        finally:
            view.release()
        if self.start == self.end:
            self.start = self.end = 0
        elif len(scratch) - self.start < OWN_BUFFER_BYTES + prefix:
            # Too little room left for the frame begun at `start`: move it to the front.
            pending = self.end - self.start
            scratch[:pending] = scratch[self.start : self.end]
            self.start, self.end = 0, pending

    def _fill_blobs(self, view: memoryview) -> bool:
        """Blobs were just announced: they take the bytes after their BLOBS frame, first those
        already in the scratch buffer. Whether some are still due from the socket."""
        assert self.blobs is not None
        due = list(self.blobs.views)
        while due and self.start < self.end:
            blob = due[0]
            taken = min(len(blob), self.end - self.start)
            blob[:taken] = view[self.start : self.start + taken]
            self.start += taken
            if taken < len(blob):
                self.filled = taken
                break
            del due[0]
        else:
            self.filled = 0
        self.filling = due
        if not due:
            self.blobs.finished()
        return bool(due)

    def _frame(self, data: bytes | bytearray | memoryview) -> None:
        blobs, self.blobs = self.blobs, None  # received whole, if any: they belong to this frame
        # decoded values are copies or blobs: `data` may be reused
        kind, body = wire.decode_frame(data, blobs)
        if kind is FrameKind.BLOBS:
            if self.peer is None:
                raise FrameError("blobs before HELLO")
            self.blobs = wire.Blobs(body)
            return
        if self.peer is not None:
            self.owner._received(self.peer, kind, body)
            return
        peer = body.get("node") if kind is FrameKind.HELLO and type(body) is dict else None
        if type(peer) is not int or peer == self.owner.node_id:
            raise FrameError(f"first frame is not a HELLO naming another node: {body!r:.80}")
        assert self.transport is not None
        self.peer = peer
        self.owner._attach(peer, self.transport)
