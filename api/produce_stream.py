"""The produce stream: record batches sent over one WebSocket, each acknowledged by a frame
(README "Produce streams").

Owns the endpoint, its frame format and the answers. A batch costs one frame each way instead of
an HTTP request and response, on both ends. Each batch is checked and appended exactly as the
POST of an `application/vnd.raftline.batch` body (app.checked_batch, app.append_here); unlike
the POST, a batch for a partition this node does not lead is not forwarded: it is answered with
leader_unavailable naming the leader (`leader_http`), and the client sends it there (or by POST).

Client frames are binary: a 12-byte header, the request id (8 bytes) and the partition (4
bytes), both big-endian unsigned, then one Kafka RecordBatch v2. Answers are JSON text frames,
in the order the batches complete, many in flight: `{"id", "partition", "base_offset",
"count"}` (and `"duplicate": true` for an idempotent retry), or `{"id", "partition", "status",
"error": {...}}` with the body a POST would answer. A frame too short for its header, or a text
frame, is answered `{"id": null, "error": ...}` and the stream closes (1002 protocol error,
1003 unsupported data); an oversized frame closes it with 1009.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from raftline.api import codec
from raftline.api.app import MAX_BODY_BYTES, ApiState, _state, _topic, append_here, checked_batch
from raftline.api.errors import ApiError, from_broker_error, invalid
from raftline.api.streams import PING_S, STATS_KEY, StreamStats, required_upgrade
from raftline.node.errors import BrokerError

log = logging.getLogger(__name__)

HEADER = codec.PRODUCE_FRAME_HEADER
STREAM_ACKS = ("all", "leader")  # acks=none has no answer to send: the POST serves it
# Batches read from the socket and not yet answered; at this many the stream stops reading, so
# a producer that outruns the log is held back by TCP, not by the node's memory.
MAX_IN_FLIGHT = 1024


async def produce_stream(request: web.Request) -> web.StreamResponse:
    """`GET /v1/topics/{topic}/produce-stream?acks=all|leader`: see the module's description."""
    state = _state(request)
    topic = _topic(request)
    acks = request.query.get("acks", "all")
    if acks not in STREAM_ACKS:
        raise invalid(f"acks must be one of {', '.join(STREAM_ACKS)} on a produce stream")
    required_upgrade(request)
    await state.topic_meta(topic)  # an unknown topic is a 404 before the upgrade
    socket = web.WebSocketResponse(heartbeat=PING_S, max_msg_size=MAX_BODY_BYTES + HEADER.size)
    await socket.prepare(request)
    stats = request.app[STATS_KEY]
    stats.open["produce"] += 1
    stats.sockets.add(socket)
    answering: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    try:
        async for message in socket:
            if message.type == WSMsgType.BINARY:
                if len(message.data) < HEADER.size:
                    await _violation(
                        socket,
                        WSCloseCode.PROTOCOL_ERROR,
                        f"a frame holds a {HEADER.size}-byte header (request id, partition) "
                        f"and a record batch; this one has {len(message.data)} bytes",
                    )
                    break
                await slots.acquire()
                task = asyncio.ensure_future(
                    _answered(state, stats, socket, topic, acks, message.data, slots)
                )
                answering.add(task)
                task.add_done_callback(answering.discard)
            elif message.type == WSMsgType.TEXT:
                await _violation(
                    socket,
                    WSCloseCode.UNSUPPORTED_DATA,
                    "produce stream frames are binary: a header and a record batch",
                )
                break
            else:  # an error reading (an oversized frame: aiohttp closes with 1009)
                break
    finally:
        # Batches read are appended and answered while the client is still there to hear.
        await asyncio.gather(*answering, return_exceptions=True)
        stats.open["produce"] -= 1
        stats.sockets.discard(socket)
        await socket.close()
    return socket


async def _answered(
    state: ApiState,
    stats: StreamStats,
    socket: web.WebSocketResponse,
    topic: str,
    acks: str,
    frame: bytes,
    slots: asyncio.Semaphore,
) -> None:
    """Check and append one frame's batch; send its answer frame."""
    request_id, partition = HEADER.unpack_from(frame)
    answer: dict[str, Any] = {"id": request_id, "partition": partition}
    try:
        try:
            batch, count = await checked_batch(state, topic, partition, frame[HEADER.size :], None)
            base, duplicate = await append_here(state, topic, partition, batch, acks)
        except BrokerError as exc:
            raise from_broker_error(exc) from None
        except TimeoutError:
            raise ApiError("timeout", "the request timed out") from None  # as the POST says
        answer["base_offset"] = base
        answer["count"] = count
        if duplicate:
            answer["duplicate"] = True
        stats.messages["produce"] += count
    except ApiError as exc:
        _add_error(answer, exc)
    except Exception:
        log.exception("produce stream batch for %s/%d failed", topic, partition)
        _add_error(answer, ApiError("internal_error", "internal error; see the node's log"))
    finally:
        slots.release()
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client left: nobody to tell
        await socket.send_str(orjson.dumps(answer).decode())


def _add_error(answer: dict[str, Any], error: ApiError) -> None:
    answer["status"] = error.status
    answer.update(error.body())


async def _violation(socket: web.WebSocketResponse, code: WSCloseCode, message: str) -> None:
    """A frame that breaks the protocol: an error frame saying what, then the stream closes."""
    answer = {"id": None, **invalid(message).body()}
    with contextlib.suppress(ConnectionError, RuntimeError):
        await socket.send_str(orjson.dumps(answer).decode())
    await socket.close(code=code, message=message[:120].encode())


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/topics/{topic}/produce-stream", produce_stream)
