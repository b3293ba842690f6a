"""Push delivery for the client cores, written once for both shells: the stream steps an Op
yields (`Open`, `Receive`, `Grant`, `Shut`) and `StreamCursor`, one consumer's stream.

Owns when a stream is opened, the credit its consumer owes the server (messages handed to the
application since the last grant: the window is `window` messages fetched and not yet
consumed), and the fall back to long-polling when a server or a proxy refuses the upgrade
(then for FALLBACK_S before the stream is tried again). No I/O here: the shells open sockets,
send credit and wait for frames.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from raftline.clients.routing import Nodes
from raftline.clients.wire import BATCH_CONTENT_TYPE, Answer, RaftlineError

log = logging.getLogger(__name__)

STREAM_UNSUPPORTED = "stream_unsupported"  # the upgrade was refused: long-poll instead
FALLBACK_S = 60.0


@dataclass(slots=True)
class Open:
    """Open a stream at `path` (to `url`, else a bootstrap node, with the client's retries).
    The shell answers a handle, or throws RaftlineError (STREAM_UNSUPPORTED when the answer
    was no WebSocket upgrade)."""

    path: str
    params: dict[str, str]
    url: str | None = None


@dataclass(slots=True)
class Receive:
    """Grant `credit` more messages (a frame even when 0 if it names a frame `seen`: that
    tells a group stream that the member is back; else none), then wait up to `wait_s` for a
    frame. The shell answers the frame (a dict from a text frame, bytes from a binary one) or
    None when none came in time; an error frame or a lost stream is thrown."""

    stream: Any
    credit: int
    wait_s: float
    seen: int | None = None  # the last numbered frame taken in (group streams number theirs)


@dataclass(slots=True)
class Grant:
    """Grant `credit` more messages now, without waiting for a frame (answered with None; a
    lost stream is not reported here but by the next Receive)."""

    stream: Any
    credit: int


@dataclass(slots=True)
class Shut:
    """Close the stream (answered with None)."""

    stream: Any


StreamOp = Generator[Open | Receive | Grant | Shut, Any, Any]


def batch_frame(frame: bytes) -> tuple[int, int, Answer]:
    """A binary frame of a topic stream (api/streams.py batch_frame): its partition, the
    offset after it, and its stored batches as a batch fetch answer (decoded as one)."""
    size = int.from_bytes(frame[:4], "big")
    header = json.loads(frame[4 : 4 + size])
    next_offset = str(header["next_offset"])
    headers = {
        "content-type": BATCH_CONTENT_TYPE,
        "raftline-next-offset": next_offset,
        "raftline-log-start-offset": "0",
        "raftline-high-watermark": next_offset,
    }
    batches = memoryview(frame)[4 + size :]
    return int(header["partition"]), int(header["next_offset"]), Answer(headers, batches)  # type: ignore[arg-type]


class StreamCursor:
    """One consumer's stream: on when asked for (`enabled`) and not fallen back."""

    def __init__(
        self,
        enabled: bool,
        window: int,
        nodes: Nodes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`nodes`: the client's bootstrap nodes; a stream lost to a retryable error is opened
        again on the next one."""
        if window < 1:
            raise ValueError("a stream's window (prefetch) must be at least 1 message")
        self.enabled = enabled
        self.window = window
        self.nodes = nodes
        self.clock = clock
        self.handle: Any = None
        self.owed = 0
        self.seen: int | None = None
        self._fallback_until = 0.0

    def active(self) -> bool:
        return self.enabled and self.clock() >= self._fallback_until

    def opened(self, path: str, params: dict[str, str], url: str | None = None) -> StreamOp:
        """The stream, opened now (at `url`, else a bootstrap node) unless it is open; False
        when the server or a proxy refused the upgrade (the caller long-polls instead)."""
        if self.handle is not None:
            return True
        try:
            self.handle = yield Open(path, {**params, "credit": str(self.window)}, url)
        except RaftlineError as error:
            if error.code != STREAM_UNSUPPORTED:
                raise
            log.info("streaming refused at %s (%s): long-polling instead", path, error)
            self._fallback_until = self.clock() + FALLBACK_S
            return False
        self.owed = 0
        self.seen = None
        return True

    def frame(self, wait_s: float) -> StreamOp:
        """The next frame (None when none came within `wait_s`), after granting what the
        application consumed. A failure closes the stream and is raised."""
        owed, self.owed = self.owed, 0
        try:
            frame = yield Receive(self.handle, owed, wait_s, self.seen)
        except RaftlineError as error:
            if error.retryable and self.nodes is not None:
                self.nodes.failed(None, error)
            yield from self.shut()
            raise
        if isinstance(frame, dict) and isinstance(frame.get("frame"), int):
            self.seen = frame["frame"]  # said with the next credit: after the caller took it in
        return frame

    def consumed(self, count: int) -> None:
        """`count` messages were handed to the application: their credit goes back."""
        self.owed += count

    def granted(self) -> StreamOp:
        """Send the credit owed at once, not with the next Receive: a consumer that settles
        beside a receive still waiting for its frame (asyncio, or another thread) would
        otherwise leave the server without credit until that wait ends."""
        if self.handle is None or not self.owed:
            return
        owed, self.owed = self.owed, 0
        yield Grant(self.handle, owed)

    def shut(self) -> StreamOp:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            yield Shut(handle)
