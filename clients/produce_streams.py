"""Record batches sent over produce streams (README "Produce streams"), for both shells: one
WebSocket per node, topic and acks, many batches in flight on it, each answered by its frame.

Owns the streams a client keeps open, the request ids, the matching of answers to batches and
the fallback: a batch the stream cannot deliver or that is answered with an error goes by POST
(the shell's, with the client's retries), so a producer's retry semantics are those of
the POST. A node that refuses the upgrade (one without produce streams) is not asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable

import aiohttp
import orjson

from raftline.api.codec import PRODUCE_FRAME_HEADER
from raftline.clients.streaming import STREAM_UNSUPPORTED
from raftline.clients.wire import Answer, RaftlineError, Request, answer

HEADER = PRODUCE_FRAME_HEADER

# (node base url, stream path, query) -> the open WebSocket
Opener = Callable[[str, str, dict[str, str]], Awaitable[aiohttp.ClientWebSocketResponse]]


class ProduceStream:
    """One open produce stream: batches out as frames, answers matched back by request id."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse, node: str) -> None:
        self.socket = socket
        self.node = node
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Answer]] = {}
        self._reader = asyncio.ensure_future(self._read())

    @property
    def closed(self) -> bool:
        return self._reader.done()

    async def sent(self, partition: int, batch: bytes | bytearray, timeout_s: float) -> Answer:
        """The answer to one batch; raises the error it was answered with, or a retryable
        connection_failed if the stream ended first or no answer came within `timeout_s`, the
        client's request timeout (the batch may then have been written, as when a POST's
        connection breaks or times out)."""
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            await self.socket.send_bytes(HEADER.pack(request_id, partition) + batch)
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            # A node that answers pings but not batches (paused, stuck) gets no more of them.
            await self.close()
            raise self._lost(f"no answer within {timeout_s} s") from None
        except (aiohttp.ClientError, OSError, RuntimeError) as exc:
            raise self._lost(str(exc)) from exc
        finally:
            self._waiting.pop(request_id, None)

    async def _read(self) -> None:
        reason = "closed by the node"
        try:
            async for message in self.socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    reason = f"ended ({message.type.name})"
                    break
                frame = orjson.loads(message.data)
                future = self._waiting.get(frame.get("id"))
                if future is None or future.done():
                    continue  # a batch whose sender gave up (cancelled)
                try:
                    raw = message.data.encode()
                    future.set_result(answer(frame.get("status", 200), {}, raw, self.node))
                except RaftlineError as error:
                    future.set_exception(error)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            reason = str(exc)
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(self._lost(reason))

    def _lost(self, reason: str) -> RaftlineError:
        return RaftlineError(
            "connection_failed", f"{self.node}: produce stream lost: {reason}", retryable=True
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.socket.close()
        with contextlib.suppress(BaseException):
            await self._reader


class ProduceStreams:
    """The produce streams of one client, opened on first use, on one event loop."""

    def __init__(self, opener: Opener, timeout_s: float) -> None:
        self._opener = opener
        self._timeout_s = timeout_s
        self._streams: dict[tuple[str, str, str], asyncio.Task[ProduceStream]] = {}
        self._unsupported: set[str] = set()  # nodes that refused the upgrade

    async def answered(self, node: str, path: str, request: Request) -> Answer | None:
        """The answer to `request` (a batch POST's) sent over the stream at `path` on `node`;
        None when the stream could not take it or answered a retryable error: the caller POSTs
        it. An error the node answered for good (a bad batch, an unknown partition) is raised:
        a POST would be refused alike."""
        if node in self._unsupported:
            return None
        assert request.params is not None and request.payload is not None
        partition, acks = int(request.params["partition"]), request.params["acks"]
        try:
            stream = await self._stream(node, path, acks)
            return await stream.sent(partition, request.payload, self._timeout_s)
        except RaftlineError as error:
            if error.code == STREAM_UNSUPPORTED:
                self._unsupported.add(node)
            elif error.status is not None and not error.retryable:
                raise
            return None

    async def _stream(self, node: str, path: str, acks: str) -> ProduceStream:
        """The open stream to `node` (opened once by the first caller; a closed one again)."""
        key = (node, path, acks)
        opening = self._streams.get(key)
        if opening is not None and opening.done() and not _usable(opening):
            opening = None
        if opening is None:
            opening = asyncio.ensure_future(self._opened(node, path, acks))
            self._streams[key] = opening
        return await asyncio.shield(opening)

    async def _opened(self, node: str, path: str, acks: str) -> ProduceStream:
        return ProduceStream(await self._opener(node, path, {"acks": acks}), node)

    async def close(self) -> None:
        for opening in self._streams.values():
            if opening.done() and _usable(opening):
                await opening.result().close()
            else:
                opening.cancel()
        self._streams.clear()


def _usable(opening: asyncio.Task[ProduceStream]) -> bool:
    """A finished opening that gave a stream still open."""
    return not opening.cancelled() and opening.exception() is None and not opening.result().closed
