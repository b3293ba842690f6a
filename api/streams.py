"""Push delivery: the streamed forms of partition fetch, group fetch and queue receive, over
WebSocket (README "Streams").

Owns the stream endpoints, their credit-based flow control and the frames they send. A stream
runs the long-poll it replaces over and over on the node the client connected to (each read
goes to the partition's or queue's leader wherever it is now, so the stream outlives a leader
change) and pushes each answer as one JSON text frame (binary frames where a client asks for
them: stored batches on topic streams, msgpack on queue streams). WebSocket rather than
Server-Sent Events: the consumer replenishes its window on the same connection, so no second
endpoint has to find the node holding the stream (behind a load balancer it would not), and
both aiohttp ends speak it.

Flow control: the client grants credit (`credit=` at connect, then `{"credit": n}` frames);
each message sent spends one; with none left the stream reads nothing and sends nothing.
Invariant: messages sent <= credit granted, at every moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from raftline.api import codec, filters, validation
from raftline.api.app import STATE_KEY, _resolve_offset, _state, _topic
from raftline.api.errors import ApiError, from_broker_error, invalid
from raftline.api.groups import (
    MAX_GROUP_WAIT_MS,
    _group,
    _member_id,
    member_fetch,
    read_partitions,
    taken_from,
)
from raftline.api.queues import MAX_MESSAGES as MAX_QUEUE_MESSAGES
from raftline.api.queues import _queue, receive_messages
from raftline.node.errors import BrokerError
from raftline.raftlog.batch import parse_header

log = logging.getLogger(__name__)

DEFAULT_CREDIT = 100
MAX_CREDIT = 100_000
ROUND_WAIT_MS = 5_000  # one round's long-poll; between rounds the stream sees a closed client
PING_S = 15.0  # WebSocket pings keep proxies from closing an idle stream
RETRY_S = 0.2  # a round that failed retryably (an election) is tried again after this
QUEUE_FORMATS = ("json", "msgpack")  # a queue stream's frames: JSON text, or msgpack binary


class StreamStats:
    """Per kind of stream (topic, group, queue): how many are open, messages pushed."""

    def __init__(self) -> None:
        self.open: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.messages: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.sockets: set[web.WebSocketResponse] = set()  # closed when the node stops

    async def close_all(self, _: web.Application) -> None:
        """On shutdown: end every stream at once (its client goes to another node), rather
        than leave the server to wait for their handlers."""
        for socket in list(self.sockets):
            await socket.close(code=WSCloseCode.GOING_AWAY, message=b"node stopping")

    def lines(self) -> list[str]:
        out = [
            "# HELP raftline_streams_open WebSocket streams open on this node, by kind.",
            "# TYPE raftline_streams_open gauge",
            *(f'raftline_streams_open{{kind="{k}"}} {n}' for k, n in self.open.items()),
            "# HELP raftline_stream_messages_total Messages pushed on streams (appended, on "
            "produce streams), by kind.",
            "# TYPE raftline_stream_messages_total counter",
            *(
                f'raftline_stream_messages_total{{kind="{k}"}} {n}'
                for k, n in self.messages.items()
            ),
        ]
        return out


KINDS = ("topic", "group", "queue", "produce")  # produce: api/produce_stream.py
STATS_KEY = web.AppKey("stream_stats", StreamStats)


class Credit:
    """The window a client grants: `take(n)` spends, `grant(n, seen)` replenishes; `wait()`
    until some is left. `seen`: the number of the last frame the client says it has taken in
    (a group stream waits for the one that announced a rebalance)."""

    def __init__(self, initial: int) -> None:
        self.left = initial
        self.seen = 0
        self._changed = asyncio.Event()

    def grant(self, amount: int, seen: int = 0) -> None:
        self.left = min(self.left + amount, MAX_CREDIT)
        self.seen = max(self.seen, seen)
        self._changed.set()

    async def seen_at_least(self, frame: int) -> None:
        while self.seen < frame:
            self._changed.clear()
            await self._changed.wait()

    def take(self, amount: int) -> None:
        assert 0 <= amount <= self.left, "a stream sent more than its credit"
        self.left -= amount

    async def wait(self) -> None:
        while self.left <= 0:
            self._changed.clear()
            await self._changed.wait()


def _credit(query: Any) -> int:
    text = query.get("credit", str(DEFAULT_CREDIT))
    try:
        value = int(text)
    except ValueError:
        raise invalid(f"credit must be an integer in 0..{MAX_CREDIT}") from None
    if not 0 <= value <= MAX_CREDIT:
        raise invalid(f"credit must be an integer in 0..{MAX_CREDIT}")
    return value


def required_upgrade(request: web.Request) -> None:
    """A 426 for a request that does not ask for a WebSocket."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise ApiError(
            "invalid_request",
            "this endpoint streams over WebSocket (send Upgrade: websocket); "
            "without it, use its request-per-call form",
            status=426,
        )


Frame = tuple[str | bytes, int]  # a text (JSON) or binary frame, and the messages it holds
Round = Callable[[int], Awaitable[list[Frame]]]  # credit left -> the frames to send


async def _serve(
    request: web.Request, kind: str, credit: Credit, round_: Round
) -> web.StreamResponse:
    """Upgrade, then run rounds while the client is there: each sends its frame (if any) and
    spends the credit of the messages in it. An error ends the stream with an error frame."""
    required_upgrade(request)
    socket = web.WebSocketResponse(heartbeat=PING_S, max_msg_size=1 << 16)
    await socket.prepare(request)
    stats = request.app[STATS_KEY]
    stats.open[kind] += 1
    stats.sockets.add(socket)
    reader = asyncio.ensure_future(_read_credit(socket, credit))
    give_up_s = _state(request).broker.router.election_timeout_s * 2

    async def round_then_send() -> None:
        """A round, and its frames sent from this task as soon as it has them (not by the
        stream's own task, which a busy loop resumes a turn or two later)."""
        for payload, count in await _round_or_retry(round_, credit.left, give_up_s):
            credit.take(count)
            stats.messages[kind] += count
            if isinstance(payload, str):
                await socket.send_str(payload)
            else:
                await socket.send_bytes(payload)

    try:
        while not reader.done():
            if credit.left <= 0:
                waiting = asyncio.ensure_future(credit.wait())
                await asyncio.wait({waiting, reader}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if reader.done():
                    break
            worker = asyncio.ensure_future(round_then_send())
            await asyncio.wait({worker, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not worker.done():  # the client left mid-round
                worker.cancel()
                with contextlib.suppress(BaseException):
                    await worker
                break
            worker.result()  # its error, if it failed
    except ApiError as exc:
        await _send_error(socket, exc)
    except BrokerError as exc:
        await _send_error(socket, from_broker_error(exc))
    except ConnectionResetError:
        pass
    except Exception:
        log.exception("stream %s failed", request.path)
        await _send_error(socket, ApiError("internal_error", "internal error; see the node's log"))
    finally:
        stats.open[kind] -= 1
        stats.sockets.discard(socket)
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        await socket.close()
    return socket


def _text(frame: dict[str, Any]) -> str:
    return orjson.dumps(frame, option=orjson.OPT_NON_STR_KEYS).decode("utf-8")


def json_frames(frame: dict[str, Any] | None) -> list[Frame]:
    """`frame` as the one text frame of a round (none for None), costing its messages."""
    return [] if frame is None else [(_text(frame), len(frame.get("messages", ())))]


async def _round_or_retry(round_: Round, left: int, give_up_s: float) -> list[Frame]:
    """One round; a retryable failure (an election under way) is waited out, as a client
    retrying a long-poll would, for `give_up_s`: then it ends the stream (as a retryable error
    frame), and the client connects again, maybe to a node that can reach a leader."""
    deadline = time.monotonic() + give_up_s
    while True:
        try:
            return await round_(left)
        except (ApiError, BrokerError) as exc:
            if not exc.retryable or time.monotonic() >= deadline:
                raise
            log.debug("stream round: %s; trying again", exc)
        await asyncio.sleep(RETRY_S)


async def _send_error(socket: web.WebSocketResponse, error: ApiError) -> None:
    with contextlib.suppress(Exception):
        await socket.send_str(_text(error.body()))


async def _read_credit(socket: web.WebSocketResponse, credit: Credit) -> None:
    """Client frames until it closes: each `{"credit": n}` (with "seen": the last numbered
    frame taken in, on group streams) adds n. Anything else ends it."""
    async for message in socket:
        if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return
        try:
            body = orjson.loads(message.data)
            amount, seen = body["credit"], body.get("seen", 0)
        except (ValueError, KeyError, TypeError, AttributeError):
            await _send_error(socket, invalid('stream frames from the client are {"credit": n}'))
            return
        if not validation.is_int(amount) or not 0 <= amount <= MAX_CREDIT:
            await _send_error(socket, invalid(f"credit must be an integer in 0..{MAX_CREDIT}"))
            return
        if not validation.is_int(seen) or seen < 0:
            await _send_error(socket, invalid("seen must be a frame number (an integer >= 0)"))
            return
        credit.grant(amount, seen)


# ---- partition streams ---------------------------------------------------------------------


def _partitions(query: Any, count: int) -> list[int]:
    text = query.get("partitions")
    if text is None:
        return list(range(count))
    try:
        chosen = sorted({int(p) for p in text.split(",")})
    except ValueError:
        raise invalid("partitions must be a comma-separated list of partition numbers") from None
    for partition in chosen:
        if not 0 <= partition < count:
            raise ApiError("unknown_partition", f"the topic has no partition {partition}")
    return chosen


async def topic_stream(request: web.Request) -> web.StreamResponse:
    """Partitions of a topic (`partitions=0,2`, default all) from `offset` (or `offset.P=N` per
    partition, which is how a client resumes): text frames `{"messages": [...with topic],
    "positions": [{"topic", "partition", "offset"}]}`, sent when messages came or a position
    moved (a filter passed records over). With `format=batches` (and no filter), records read
    on this node go as they are stored, in binary frames (see batch_frame)."""
    state = _state(request)
    topic = _topic(request)
    query = request.query
    spec = validation.fetch_request({k: v for k, v in query.items() if k != "timestamp"})
    record_filter = filters.from_query(query)
    raw = record_filter is None and query.get("format") == "batches"
    credit = Credit(_credit(query))
    meta = await state.topic_meta(topic)
    positions: dict[int, int | str] = {}
    for partition in _partitions(query, meta.partitions):
        start = query.get(f"offset.{partition}")
        positions[partition] = spec.offset if start is None else _offset(start)

    async def round_(left: int) -> list[Frame]:
        for partition, start in list(positions.items()):
            if isinstance(start, str):
                positions[partition] = await _resolve_offset(
                    state, topic, partition, start, spec.isolation == "read_committed"
                )
        starts = [[topic, p, o] for p, o in positions.items()]
        limited = validation.FetchRequest(
            0, min(left, spec.max_messages), spec.max_bytes, 0, isolation=spec.isolation
        )
        bodies, _ = await read_partitions(
            state, starts, limited, ROUND_WAIT_MS, record_filter, None, raw=raw
        )
        frames: list[Frame] = []
        messages: list[dict[str, Any]] = []
        moved = False
        budget = limited.max_messages
        for (_, partition, start), body in zip(starts, bodies, strict=True):
            if body is None:
                continue
            sent_raw = False
            if "batches" in body:
                batches, count, reached = _whole_batches(body, start, budget)
                if batches:
                    frames.append((batch_frame(topic, partition, reached, batches), count))
                    sent_raw = True
                elif not body["batches"]:
                    reached = int(body["next_offset"])
                else:  # the first batch begins before `start` or exceeds the credit: decode
                    decoded = codec.decode_batches(
                        body["batches"], partition, start, budget, limited.max_bytes
                    )
                    taken = [{"topic": topic, **m} for m in decoded.messages]
                    count, reached = len(taken), decoded.next_offset
                    messages += taken
            else:
                taken, reached = taken_from(topic, body, budget)
                count = len(taken)
                messages += taken
            budget -= count
            if reached != positions[partition]:
                positions[partition] = reached
                moved = moved or not sent_raw  # a batch frame says where it got to
        if messages or moved:
            where = [{"topic": topic, "partition": p, "offset": o} for p, o in positions.items()]
            frames += json_frames({"messages": messages, "positions": where})
        return frames

    return await _serve(request, "topic", credit, round_)


def _whole_batches(
    body: dict[str, Any], start: int, budget: int
) -> tuple[list[codec.Buffer], int, int]:
    """The stored batches of a local fetch answer that begin at or after `start` and fit in
    `budget` messages together: (them, their record count, the offset after the last)."""
    chosen: list[codec.Buffer] = []
    count = 0
    reached = start
    for stored in body["batches"]:
        header = parse_header(stored)
        if header.base_offset < start or count + header.records_count > budget:
            return chosen, count, reached
        chosen.append(stored)
        count += header.records_count
        reached = header.last_offset + 1
    return chosen, count, max(reached, int(body["next_offset"])) if chosen else start


def batch_frame(topic: str, partition: int, next_offset: int, batches: list[codec.Buffer]) -> bytes:
    """A binary frame: a 4-byte big-endian length, that many bytes of JSON `{"topic",
    "partition", "next_offset"}`, then Kafka v2 record batches back to back as stored."""
    header = orjson.dumps({"topic": topic, "partition": partition, "next_offset": next_offset})
    return b"".join([len(header).to_bytes(4, "big"), header, *batches])


def _offset(text: str) -> int | str:
    return validation.fetch_request({"offset": text}).offset


# ---- group streams -------------------------------------------------------------------------


async def member_stream(request: web.Request) -> web.StreamResponse:
    """A group member's fetches, pushed: each frame is a group fetch answer (API.md) numbered
    by "frame" (1, 2, ...), sent when it has messages, a position moved, or the generation or
    rebalancing flag changed. After a frame saying `rebalancing`, the next round waits until
    the client's credit frame says "seen" that number: the member commits in its generation
    first, as between two long-polls."""
    state = _state(request)
    group = _group(request)
    member = _member_id(request.match_info["member_id"])
    spec = validation.fetch_request(dict(request.query))
    record_filter = filters.from_query(request.query)
    credit = Credit(_credit(request.query))
    last: dict[str, Any] = {"frame": 0}

    def news_of(plan: dict[str, Any]) -> bool:
        """A generation or rebalancing flag the member has not been sent: send it now."""
        return bool(
            plan["generation"] != last.get("generation")
            or plan["rebalancing"] != last.get("rebalancing")
        )

    async def round_(left: int) -> list[Frame]:
        if last.get("rebalancing"):
            await credit.seen_at_least(last["frame"])
        wait_ms = min(ROUND_WAIT_MS, MAX_GROUP_WAIT_MS)
        limited = validation.FetchRequest(
            0, min(left, spec.max_messages), spec.max_bytes, wait_ms, isolation=spec.isolation
        )
        answer = await member_fetch(state, group, member, limited, record_filter, news_of)
        news = (
            answer["messages"]
            or answer["generation"] != last.get("generation")
            or answer["rebalancing"] != last.get("rebalancing")
            or answer["positions"] != last.get("positions")
        )
        if not news:
            return []
        answer["frame"] = last["frame"] + 1
        last.update(answer)
        return json_frames(answer)

    return await _serve(request, "group", credit, round_)


# ---- queue streams -------------------------------------------------------------------------


async def queue_stream(request: web.Request) -> web.StreamResponse:
    """A queue's receives, pushed: frames `{"messages": [...]}` as a receive answers (each
    message locked to this receiver with its receipt); ack them as usual. Credit bounds the
    messages sent and not yet replenished: a RabbitMQ-style prefetch when the client grants
    one back per message it settles. `format=msgpack`: binary frames, the same frame in
    msgpack with key and value as bytes (no base64; see queues._message): a fifth of the
    encoding and decoding time of JSON for 1 KB messages."""
    state = _state(request)
    name = _queue(request.match_info["queue"])
    query = request.query
    try:
        limit = int(query.get("max_messages", "100"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_QUEUE_MESSAGES:
        raise invalid(f"max_messages must be an integer in 1..{MAX_QUEUE_MESSAGES}")
    form = query.get("format", "json")
    if form not in QUEUE_FORMATS:
        raise invalid(f"format must be one of {', '.join(QUEUE_FORMATS)}")
    binary = form == "msgpack"
    record_filter = filters.from_query(query)
    credit = Credit(_credit(query))

    async def round_(left: int) -> list[Frame]:
        answer = await receive_messages(
            state, name, min(left, limit), ROUND_WAIT_MS, record_filter, binary
        )
        if not answer["messages"]:
            return []
        if binary:
            return [(msgpack.packb(answer, use_bin_type=True), len(answer["messages"]))]
        return json_frames(answer)

    return await _serve(request, "queue", credit, round_)


def add_routes(app: web.Application) -> None:
    stats = app[STATS_KEY] = StreamStats()
    app[STATE_KEY].metric_sources.append(stats.lines)
    app.on_shutdown.append(stats.close_all)
    router = app.router
    router.add_get("/v1/topics/{topic}/stream", topic_stream)
    router.add_get("/v1/groups/{group}/members/{member_id}/stream", member_stream)
    router.add_get("/v1/queues/{queue}/stream", queue_stream)
