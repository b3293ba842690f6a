"""The stream steps' I/O over aiohttp WebSockets, for both shells (the blocking one runs them
on a loop of its own, see `LoopThread`).

Owns opening a stream (a refused upgrade becomes STREAM_UNSUPPORTED, an unreachable or
unavailable node a retryable error), sending credit, reading frames and closing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp

from raftline.clients.streaming import STREAM_UNSUPPORTED, Grant, Receive
from raftline.clients.wire import RaftlineError, connection_error

_T = TypeVar("_T")

PING_S = 15.0


async def open_stream(
    session: aiohttp.ClientSession, base: str, path: str, params: dict[str, str], timeout: float
) -> aiohttp.ClientWebSocketResponse:
    try:
        return await session.ws_connect(
            base + path,
            params=params,
            heartbeat=PING_S,
            timeout=aiohttp.ClientWSTimeout(ws_close=timeout),
            autoping=True,
        )
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status in (502, 503, 504):
            raise RaftlineError(
                "leader_unavailable", f"{base}: {exc.message}", retryable=True, node=base
            ) from exc
        raise RaftlineError(
            STREAM_UNSUPPORTED, f"{base}: HTTP {exc.status} {exc.message}", retryable=False
        ) from exc
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise connection_error(base, exc) from exc


async def receive_frame(call: Receive) -> dict[str, Any] | bytes | None:
    """Send the call's credit, then wait for a frame (see Receive). A grant of nothing that
    names no frame seen tells the node nothing: it is not sent (a queue stream's credit goes
    back with its acks, so most of its receives have none to give: one frame fewer each way
    per frame pushed)."""
    socket: aiohttp.ClientWebSocketResponse = call.stream
    grant: dict[str, int] = {"credit": call.credit}
    if call.seen is not None:
        grant["seen"] = call.seen
    wait_s = call.wait_s
    try:
        if call.credit or call.seen is not None:
            await socket.send_str(json.dumps(grant))
        # Not receive(timeout=...): aiohttp starts that timeout again at every ping or pong,
        # so on a quiet stream a wait longer than the heartbeat would never end.
        async with asyncio.timeout(max(wait_s, 0.001)):
            message = await socket.receive()
    except TimeoutError:
        return None
    except (aiohttp.ClientError, OSError, RuntimeError) as exc:
        raise RaftlineError("connection_failed", f"stream lost: {exc}", retryable=True) from exc
    if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
        raise RaftlineError(
            "connection_failed", f"stream ended ({message.type.name})", retryable=True
        )
    if message.type == aiohttp.WSMsgType.BINARY:
        return message.data  # type: ignore[no-any-return]  # stored batches (streaming.py)
    frame = json.loads(message.data)
    error = frame.get("error") if isinstance(frame, dict) else None
    if isinstance(error, dict):
        raise RaftlineError(
            str(error.get("code", "internal_error")),
            str(error.get("message", "")),
            retryable=bool(error.get("retryable")),
            body=frame,
        )
    return frame  # type: ignore[no-any-return]


async def send_credit(call: Grant) -> None:
    """Send the call's credit; a stream lost meanwhile is left for the next receive to report."""
    with contextlib.suppress(aiohttp.ClientError, OSError, RuntimeError):
        await call.stream.send_str(json.dumps({"credit": call.credit}))


async def close_stream(socket: aiohttp.ClientWebSocketResponse) -> None:
    with contextlib.suppress(Exception):
        await socket.close()


class LoopThread:
    """An event loop on a daemon thread of its own, with one aiohttp session, for the blocking
    client's streams: `run(coroutine)` waits for its result in the calling thread."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftline-streams", daemon=True
        )
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None

    async def opened(
        self, base: str, path: str, params: dict[str, str]
    ) -> aiohttp.ClientWebSocketResponse:
        if self._session is None:  # made on this loop, where it is used
            self._session = aiohttp.ClientSession()
        return await open_stream(self._session, base, path, params, self._timeout)

    def run(self, make: Coroutine[Any, Any, _T]) -> _T:
        future: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(make, self._loop)
        return future.result()

    def close(self) -> None:
        async def closing() -> None:
            if self._session is not None:
                await self._session.close()

        with contextlib.suppress(Exception):
            self.run(closing())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
