"""Push consumers of the chaos runs: each follows one partition over a WebSocket topic stream.

Owns how a stream's frames become history: each frame is one poll, from the position before it
to the position it names, so the queue checker judges pushed reads as it judges polled ones.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from raftline.chaos.history import Op, OpType
from raftline.chaos.workload import Endpoint, Outcome, Workload

CREDIT = 200  # messages in flight per stream; each frame's count is granted back on arrival
HEARTBEAT_S = 2.0  # a stream whose node stops answering pings is closed by the client
FRAME_WAIT_S = 10.0  # no frame for this long (producers write all the time): reopen elsewhere


@dataclass
class StreamConsumer:
    """One process following `partition` from offset 0, reopening its stream on another node
    (from the last position a frame named) whenever the stream ends or its node goes down."""

    work: Workload
    process: int
    partition: int

    async def follow(self, session: aiohttp.ClientSession, until: float) -> None:
        offset = 0
        while time.monotonic() < until:
            endpoint = self.work.nodes.pick(self.partition)
            offset, outcome = await self._stream(session, endpoint, offset, until)
            self.work.nodes.observe(endpoint, outcome, self.partition)
            if outcome.type != "ok":
                await asyncio.sleep(0.2)

    async def _stream(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, offset: int, until: float
    ) -> tuple[int, Outcome]:
        """Reads one stream until it ends or `until`: the position reached and how it ended."""
        path = (
            f"{endpoint.url}/v1/topics/{self.work.topic}/stream"
            f"?partitions={self.partition}&offset={offset}&credit={CREDIT}"
        )
        try:
            async with session.ws_connect(path, heartbeat=HEARTBEAT_S) as socket:
                while time.monotonic() < until:
                    invoke = self._invoke(offset, endpoint)
                    frame = await self._next_frame(socket, endpoint, until)
                    if isinstance(frame, Outcome):
                        self._complete(invoke, "fail", offset, error=frame.error)
                        return offset, frame
                    messages, reached = self._read(frame, offset)
                    self._complete(invoke, "ok", offset, messages, reached)
                    offset = reached
                    if messages:
                        await socket.send_bytes(orjson.dumps({"credit": len(messages)}))
        except aiohttp.ClientConnectorError:
            return offset, Outcome("fail", None, None, "connection_refused")
        except (TimeoutError, aiohttp.ClientError) as failure:
            return offset, Outcome("fail", None, None, type(failure).__name__)
        return offset, Outcome("ok", None, None, None)

    async def _next_frame(
        self, socket: aiohttp.ClientWebSocketResponse, endpoint: Endpoint, until: float
    ) -> dict[str, Any] | Outcome:
        """The next text frame as JSON; an Outcome when the stream ended, failed, went quiet
        (for FRAME_WAIT_S, or past `until`: the producers stop then, so the frame waited for
        may never come) or its node stopped answering health checks."""
        # aiohttp's own receive timeout starts again at every heartbeat pong: it never fires
        # on a stream whose node answers pings but sends no frame.
        wait_s = max(0.0, min(FRAME_WAIT_S, until - time.monotonic()))
        receive = asyncio.ensure_future(socket.receive())
        down = asyncio.ensure_future(endpoint.down.wait())
        done: set[asyncio.Future[Any]] = set()
        try:
            done, _ = await asyncio.wait(
                (receive, down), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            down.cancel()
            if receive not in done:
                receive.cancel()
        if receive not in done:
            return Outcome("fail", None, None, "node_down" if down in done else "no_frame")
        message = receive.result()
        if message.type != aiohttp.WSMsgType.TEXT:
            return Outcome("fail", None, None, f"stream_{message.type.name.lower()}")
        frame = orjson.loads(message.data)
        if "error" in frame:
            error = frame["error"]
            code = error.get("code") if isinstance(error, dict) else None
            return Outcome("fail", None, frame, code or "stream_error")
        return frame

    def _read(self, frame: dict[str, Any], offset: int) -> tuple[list[list[Any]], int]:
        """This partition's messages of a frame as [offset, value] pairs, and its position."""
        messages = [
            [m["offset"], m.get("value", m.get("value_b64"))]
            for m in frame.get("messages", ())
            if m.get("partition") == self.partition
        ]
        reached = offset
        for position in frame.get("positions", ()):
            if position.get("partition") == self.partition:
                reached = int(position["offset"])
        return messages, reached

    def _invoke(self, offset: int, endpoint: Endpoint) -> Op:
        request = {"key": self.work.key(self.partition), "offset": offset, "final": False}
        return self.work.recorder.invoke(self.process, "poll", request, endpoint.name)

    def _complete(
        self,
        invoke: Op,
        kind: OpType,
        offset: int,
        messages: list[list[Any]] | None = None,
        reached: int | None = None,
        error: str | None = None,
    ) -> None:
        request = {"key": self.work.key(self.partition), "offset": offset, "final": False}
        if kind == "ok":
            value = {**request, "messages": messages, "next_offset": reached}
            self.work.recorder.complete(invoke, "ok", value)
        else:  # a read changes nothing: a stream that ended is a failed poll
            self.work.recorder.complete(invoke, "fail", request, error)
