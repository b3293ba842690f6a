"""One TCP connection per node pair carrying every Raft group's traffic, plus link liveness and RPC.

Owns dialing, accepting, frame reading/writing, per-peer liveness, request/response calls, and the
test-only hold on outgoing frames (LinkFaults: delay, reorder, duplicate) at the send point.

The node with the lower id dials the higher one; both directions share that connection. A peer
counts as alive while its link is up and a frame arrived within `dead_after_s` (every node sends a
PING each tick on a link that carried nothing else). A frame that does not parse closes only the
connection it arrived on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from raftline.node import wire
from raftline.node.config import parse_address
from raftline.node.netfaults import LinkFaults
from raftline.node.wire import FrameError, FrameKind
from raftline.raftlog.types import Message

log = logging.getLogger(__name__)

MAX_WRITE_BUFFER = 32 * 1024 * 1024  # beyond this a peer is not reading: drop, Raft resends
# Bytes a link's reader buffers before pausing the socket (asyncio pauses at twice this). The
# default 64 KiB paused and resumed it a dozen times for each 1 MB APPEND frame.
READ_LIMIT = 4 * 1024 * 1024


class RemoteError(Exception):
    """An RPC failed on the remote node (or never reached it); `code` follows API.md's codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


RaftHandler = Callable[[int, list[Message], list[list[Any]]], None]
RpcHandler = Callable[[int, str, Any], Awaitable[Any]]
LinkHandler = Callable[[int, bool], None]


@dataclass
class _Link:
    writer: asyncio.StreamWriter
    last_heard: float = field(default_factory=time.monotonic)
    sent_since_tick: bool = False
    alive: bool = True


class Transport:
    def __init__(
        self,
        node_id: int,
        listen: str,
        peers: dict[int, str],
        on_raft: RaftHandler,
        on_rpc: RpcHandler,
        on_link: LinkHandler,
        dead_after_s: float,
    ) -> None:
        self.node_id = node_id
        self.listen = listen
        self.addresses = {p: a for p, a in peers.items() if p != node_id}
        self._on_raft = on_raft
        self._on_rpc = on_rpc
        self._on_link = on_link
        self._dead_after = dead_after_s
        self._links: dict[int, _Link] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self.frames_sent = 0
        self.frames_received = 0
        self.frames_dropped = 0
        self.bad_frames = 0
        # Test hook only: None keeps send() on its direct path.
        self.link_faults: LinkFaults | None = None
        self.frames_held = 0  # copies sent late by the fault hook, duplicates included
        self.frames_duplicated = 0
        self._fault_rng = random.Random()
        self._held: set[asyncio.TimerHandle] = set()

    async def start(self) -> None:
        host, port = parse_address(self.listen)
        self._server = await asyncio.start_server(self._accept, host, port, limit=READ_LIMIT)
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
        for link in list(self._links.values()):
            link.writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(RemoteError("leader_unavailable", "node stopping"))

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

    def send(self, peer: int, frame: bytes) -> bool:
        faults = self.link_faults
        if faults is not None and faults.applies_to(peer):
            return self._send_late(peer, frame, faults)
        return self._write(peer, frame)

    def _send_late(self, peer: int, frame: bytes, faults: LinkFaults) -> bool:
        """Hold `frame` per the injected faults. A held frame goes out on whatever link is up
        when it is due, so it may arrive after later frames: Raft and the call ids tolerate
        that. RPC requests are never duplicated: unlike Raft messages they are not idempotent."""
        if peer not in self._links:
            return False
        kind = wire.PREFIX.unpack_from(frame)[2]
        may_duplicate = kind in (FrameKind.RAFT, FrameKind.PING)
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

    def _write(self, peer: int, frame: bytes) -> bool:
        link = self._links.get(peer)
        if link is None:
            return False
        transport = link.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.frames_dropped += 1
            return False
        link.writer.write(frame)
        link.sent_since_tick = True
        self.frames_sent += 1
        return True

    def tick(self) -> None:
        """Once per node tick: keep quiet links visibly alive and notice silent peers."""
        now = time.monotonic()
        if self._held:  # forget the holds that have fired; stop() cancels the rest
            loop_now = asyncio.get_running_loop().time()
            self._held = {h for h in self._held if h.when() > loop_now}
        ping = wire.encode_frame(FrameKind.PING, [])
        for peer, link in list(self._links.items()):
            if not link.sent_since_tick:
                self.send(peer, ping)
            link.sent_since_tick = False
            silent = now - link.last_heard > self._dead_after
            if link.alive and silent:
                link.alive = False
                self._on_link(peer, False)
            elif not link.alive and not silent:
                link.alive = True
                self._on_link(peer, True)

    async def call(self, peer: int, method: str, args: Any, timeout: float) -> Any:
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        try:
            frame = wire.encode_frame(FrameKind.RPC_REQUEST, [call_id, method, args])
            if not self.send(peer, frame):
                raise RemoteError("leader_unavailable", f"no connection to node {peer}")
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError as exc:
            raise RemoteError("timeout", f"node {peer} did not answer {method}") from exc
        finally:
            self._calls.pop(call_id, None)

    # connections

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dial_forever(self, peer: int) -> None:
        backoff = 0.05
        while True:
            link = self._links.get(peer)
            if link is not None and not link.writer.transport.is_closing():
                await asyncio.sleep(backoff)
                continue
            try:
                host, port = parse_address(self.addresses[peer])
                reader, writer = await asyncio.open_connection(host, port, limit=READ_LIMIT)
            except OSError:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            writer.write(wire.encode_frame(FrameKind.HELLO, {"node": self.node_id}))
            await self._serve_link(peer, reader, writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            kind, body = await self._read_frame(reader)
            if kind is not FrameKind.HELLO or type(body) is not dict:
                raise FrameError("first frame is not HELLO")
            peer = body.get("node")
            if type(peer) is not int or peer == self.node_id:
                raise FrameError(f"HELLO names a bad node id {peer!r}")
        except (FrameError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.warning("closing inbound connection before HELLO: %s", exc)
            self.bad_frames += isinstance(exc, FrameError)
            writer.close()
            return
        await self._serve_link(peer, reader, writer)

    async def _serve_link(
        self, peer: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        old = self._links.get(peer)
        if old is not None:
            old.writer.close()
        link = self._links[peer] = _Link(writer)
        self._on_link(peer, True)
        try:
            while True:
                kind, body = await self._read_frame(reader)
                link.last_heard = time.monotonic()
                self.frames_received += 1
                self._dispatch(peer, kind, body)
        except FrameError as exc:
            self.bad_frames += 1
            log.warning("closing connection to node %s: %s", peer, exc)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            if self._links.get(peer) is link:
                del self._links[peer]
                self._on_link(peer, False)

    @staticmethod
    async def _read_frame(reader: asyncio.StreamReader) -> tuple[FrameKind, Any]:
        length = wire.frame_length(await reader.readexactly(wire.LENGTH.size))
        return wire.decode_frame(await reader.readexactly(length))

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
            code = getattr(exc, "code", "internal")
            if code == "internal":
                log.exception("RPC %s from node %s failed", method, peer)
            body = [call_id, False, [code, str(getattr(exc, "message", exc))]]
        with contextlib.suppress(FrameError):
            self.send(peer, wire.encode_frame(FrameKind.RPC_RESPONSE, body))
