"""Large request bodies received by the kernel straight into the bytes object that keeps them.

Owns the node's HTTP connection protocol: aiohttp's, except that once a request's headers
declare a large plain body, the rest of that body is read from the socket into its final
buffer and handed to the request as one chunk; aiohttp gets the connection back, with a fresh
parser, at the body's last byte. Through aiohttp alone every body byte is copied three times on
the event loop (uvloop's read buffer into bytes, the parser's body slice, the join of the
slices): about a fifth of the loop's time on 1 MB produce requests.

It reads and replaces aiohttp internals (the handler's message queue, parser and settings, the
server's handler arguments); an aiohttp without them is served as plain aiohttp, and
tests/test_api_body_intake.py fails on one that takes no body.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_parser import HttpRequestParser
from aiohttp.streams import StreamReader

from raftline.api.app import MAX_BODY_BYTES
from raftline.raftlog.speedups import C

# Below this the copies cost less than handing the connection over and back.
LARGE_BODY_BYTES = 256 * 1024
# A longer declared body is left to aiohttp, which refuses it (413) before reading: its buffer
# is not allocated on a client's word.
MAX_TAKEN_BODY_BYTES = MAX_BODY_BYTES


def _keeps_internals() -> bool:
    """This aiohttp's request handler keeps what the intake reads and replaces."""
    classes = web_protocol.RequestHandler.__mro__
    slots = {name for cls in classes for name in getattr(cls, "__slots__", ())}
    return {"_messages", "_parser", "_read_bufsize", "_reading_paused"} <= slots


TAKES_BODIES = C is not None and _keeps_internals()


class IntakeServer(web.Server):
    """aiohttp's low-level server with IntakeRequestHandler as the connection protocol."""

    def __call__(self) -> web_protocol.RequestHandler:
        return IntakeRequestHandler(self, loop=self._loop, **self._kwargs)


class IntakeAppRunner(web.AppRunner):
    """web.AppRunner serving through IntakeServer."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return IntakeServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )


class IntakeRequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection protocol, taking large plain bodies from the socket itself."""

    def __init__(self, *args: Any, auto_decompress: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, auto_decompress=auto_decompress, **kwargs)
        self._auto_decompress = auto_decompress
        self.bodies_taken = 0

    def data_received(self, data: bytes) -> None:
        queued = len(self._messages)
        super().data_received(data)
        # Only a request alone in the queue: one pipelined behind others is left to aiohttp,
        # whose parser holds bytes back while its queue is full.
        if queued == 0 and len(self._messages) == 1 and TAKES_BODIES:
            message, payload = self._messages[0]
            declared = _large_plain_body(message, payload)
            if declared is not None:
                self._take_body(payload, declared)

    def _take_body(self, payload: StreamReader, declared: int) -> None:
        """Receive the rest of the body straight from the socket (see _Intake)."""
        transport = self.transport
        assert transport is not None and C is not None
        parser = self._new_parser()  # first: nothing is changed if this aiohttp refuses it
        head = payload.read_nowait()  # what the parser passed on with the headers
        # aiohttp's own pause: its flag set and the transport stopped until the hand-back, so
        # nothing more reaches its parser, whose state is mid-body from here on.
        self.pause_reading()
        body, view = C.unfilled_bytes(declared)
        view[: len(head)] = head
        transport.set_protocol(_Intake(self, parser, payload, body, view, len(head)))
        transport.resume_reading()
        self.bodies_taken += 1

    def _new_parser(self) -> Any:
        """A request parser as aiohttp's RequestHandler.__init__ makes it."""
        return HttpRequestParser(
            self,
            self._loop,
            self._read_bufsize,
            max_line_size=self.max_line_size,
            max_field_size=self.max_field_size,
            max_headers=self.max_headers,
            payload_exception=web_protocol.RequestPayloadError,
            auto_decompress=self._auto_decompress,
            max_msg_queue_size=web_protocol.MAX_MSG_QUEUE_SIZE,
        )

    def _body_received(self, parser: Any, payload: StreamReader, body: bytes) -> None:
        """The intake's last byte came: the parser for the next request, the body to its
        request as one chunk, and the connection back."""
        self._parser = parser
        payload.set_read_chunk_size(len(body))  # buffered whole without pausing the socket
        payload.feed_data(body)
        payload.feed_eof()
        assert self.transport is not None
        self.transport.set_protocol(self)
        self.resume_reading()  # ends the pause taken in _take_body


def _large_plain_body(message: Any, payload: Any) -> int | None:
    """The declared length of a request body worth taking: large but within the API's limit,
    sent whole (no chunks, no compression) and not all here yet."""
    if type(payload) is not StreamReader or message.upgrade or message.compression:
        return None
    if message.chunked or "Transfer-Encoding" in message.headers:
        return None
    try:
        declared = int(message.headers.get("Content-Length", ""))
    except ValueError:
        return None
    if not LARGE_BODY_BYTES <= declared <= MAX_TAKEN_BODY_BYTES or payload.total_bytes >= declared:
        return None
    return declared


class _Intake(asyncio.BufferedProtocol):
    """The connection's protocol while the rest of one body arrives: the kernel writes it into
    `body` through `view`, exactly the bytes still due (what follows stays in the socket)."""

    def __init__(
        self,
        handler: IntakeRequestHandler,
        parser: Any,
        payload: StreamReader,
        body: bytes,
        view: memoryview,
        filled: int,
    ) -> None:
        self.handler = handler
        self.parser = parser
        self.payload = payload
        self.body = body
        self.view = view
        self.filled = filled

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled < len(self.view):
            return
        transport = self.handler.transport
        assert transport is not None
        transport.pause_reading()  # in this callback: before the socket is read again
        self.view.release()
        self.handler._body_received(self.parser, self.payload, self.body)

    def eof_received(self) -> bool | None:
        result: bool | None = self.handler.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        self.view.release()
        self.handler.connection_lost(exc)  # fails the request reading the body

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()
