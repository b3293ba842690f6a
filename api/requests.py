"""`POST /v1/request`: publish a request and wait, bounded, for its correlated reply.

Owns the request/reply conventions: the request message goes to a topic, or through an
exchange, with two headers added, `reply-to` (the client's temporary reply topic) and
`correlation-id`; a responder writes its reply to the `reply-to` topic with the same
`correlation-id` header. The node reads the reply topic from where it ended before the publish
(so no reply is missed), passes over other replies, and answers the first match, or 504
`timeout`. A request without `client_id` gets a reply topic of its own, deleted after the
answer; with one, the client's reply topic serves all its requests and the controller deletes
it once unused for REPLY_TTL_MS (node/replies.py), so a vanished client leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

from raftline.api import codec, validation
from raftline.api.app import (
    ApiState,
    _assign_partitions,
    _fetch_local,
    _produce_partition,
    _state,
    read_body,
    reply,
)
from raftline.api.errors import ApiError, invalid
from raftline.api.exchange_publish import publish
from raftline.api.exchanges import PRODUCERS_KEY, exchange_name, routing_key
from raftline.node.replies import CLIENT_ID, delete_reply_topic, ensure_reply_topic, reply_topic

REPLY_TO = "reply-to"
CORRELATION_ID = "correlation-id"
FIELDS = frozenset(
    {"topic", "exchange", "routing_key", "message", "timeout_ms", "client_id", "correlation_id"}
)
DEFAULT_TIMEOUT_MS = 5_000
MAX_TIMEOUT_MS = 30_000  # below load balancers' idle timeouts, as long polls are
READ_SLICE_MS = 5_000  # one wait on the reply topic (a forwarded read must fit a request)
MAX_CORRELATION_ID = 128


async def request_reply(request: web.Request) -> web.Response:
    state = _state(request)
    broker = state.broker
    body = validation.fields_of(await read_body(request), FIELDS, "the request")
    exchange, topic = body.get("exchange"), body.get("topic")
    if (exchange is None) == (topic is None):
        raise invalid("a request names exactly one of topic or exchange")
    if exchange is None and "routing_key" in body:
        raise invalid("routing_key goes with exchange")
    key = routing_key(body.get("routing_key", ""), "the request")
    timeout_ms = body.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not validation.is_int(timeout_ms) or not 0 < timeout_ms <= MAX_TIMEOUT_MS:
        raise invalid(f"timeout_ms must be an integer in 1..{MAX_TIMEOUT_MS}")
    client_id = body.get("client_id")
    temporary = client_id is None
    client_id = uuid.uuid4().hex if client_id is None else client_id
    if not isinstance(client_id, str) or not CLIENT_ID.match(client_id):
        raise invalid("client_id must be 1-64 of [A-Za-z0-9_-]")
    correlation_id = body.get("correlation_id", uuid.uuid4().hex)
    if not isinstance(correlation_id, str) or not 0 < len(correlation_id) <= MAX_CORRELATION_ID:
        raise invalid(f"correlation_id must be a string of 1..{MAX_CORRELATION_ID} characters")
    raw = body.get("message")
    if not isinstance(raw, dict) or "partition" in raw:
        raise invalid("message must be a JSON object (key, value, headers), without partition")
    message = validation.produce_request({"messages": [raw]}).messages[0]
    if any(name in (REPLY_TO, CORRELATION_ID) for name, _ in message.headers):
        raise invalid(f"the request sets the {REPLY_TO} and {CORRELATION_ID} headers itself")
    replies_to = reply_topic(client_id)
    message.headers = [
        *message.headers,
        (REPLY_TO, replies_to.encode()),
        (CORRELATION_ID, correlation_id.encode()),
    ]
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        await ensure_reply_topic(broker, replies_to, timeout_ms + READ_SLICE_MS)
        start = (await _read(state, replies_to, "latest", 0))["next_offset"]
        if exchange is not None:
            target = await broker.exchanges.for_publish(exchange_name(exchange))
            routed = await publish(state, request.app[PRODUCERS_KEY], target, [key], [message])
            if routed["dropped"]:
                raise ApiError(
                    "unroutable",
                    f"the request matched no binding of exchange {exchange!r}: no responder "
                    "can receive it",
                    status=404,
                    retryable=False,
                )
            written = routed["results"][0]["routed"]
        else:
            written = [await _produce_one(state, validation.topic_name(topic), message)]
        answer = await _await_reply(state, replies_to, start, correlation_id, deadline)
    finally:
        if temporary:
            task = asyncio.ensure_future(delete_reply_topic(broker, replies_to))
            state.background.add(task)
            task.add_done_callback(state.background.discard)
    broker.counters["requests"] += 1
    return reply(request, {"correlation_id": correlation_id, "request": written, "reply": answer})


async def _produce_one(
    state: ApiState, topic: str, message: validation.ProduceMessage
) -> dict[str, Any]:
    meta = await state.topic_meta(topic)
    partition = next(iter(_assign_partitions(state, topic, meta, [message])))
    batch = codec.encode_batch([message], meta.compression, state.broker.clock.now_ms())
    base, _ = await _produce_partition(state, topic, partition, batch, "all")
    return {"topic": topic, "partition": partition, "offset": base}


async def _await_reply(
    state: ApiState, topic: str, offset: int, correlation_id: str, deadline: float
) -> dict[str, Any]:
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            state.broker.counters["request_timeouts"] += 1
            raise ApiError(
                "timeout", f"no reply with correlation-id {correlation_id!r} came in time"
            )
        answer = await _read(state, topic, offset, min(left_ms, READ_SLICE_MS))
        for message in answer["messages"]:
            if (message.get("headers") or {}).get(CORRELATION_ID) == correlation_id:
                return {"topic": topic, **message}
        offset = answer["next_offset"]


async def _read(state: ApiState, topic: str, offset: int | str, wait_ms: int) -> dict[str, Any]:
    """One read of the reply topic (one partition) on its leader, wherever it is."""
    spec = validation.FetchRequest(offset, 100, 1 << 20, wait_ms)

    async def local() -> dict[str, Any]:
        return await _fetch_local(state, topic, 0, spec, False)

    async def remote(leader: str) -> dict[str, Any]:
        params = {
            "offset": str(offset),
            "max_messages": "100",
            "max_bytes": str(1 << 20),
            "wait_ms": str(wait_ms),
        }
        return await state.forwarder.fetch(leader, topic, 0, params)

    answer: dict[str, Any] = await state.with_leader(local, remote, False, repeatable=True)
    return answer


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/request", request_reply)
