"""The queue endpoints of the v1 contract (API.md "Queues").

Owns their request checks and answer shapes. Every call is one call to the queue's shard
leader (Broker.queue_call), wherever it is; a long receive is cut into calls that each fit in a
node-to-node request, and ends as soon as one of them brings messages. Answers name that leader
(header Raftline-Queue-Leader) so that clients send their next calls there, saving two forwards.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Any

from aiohttp import web

from raftline.api import codec, filters, validation
from raftline.api.app import ApiState, _state, read_body, reply, wants_msgpack
from raftline.api.errors import invalid

QUEUE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
CREATE_FIELDS = frozenset({"name", "topic", "lock_ms", "max_deliveries", "dead_letter_topic"})
RECEIVE_FIELDS = frozenset({"max_messages", "wait_ms", "filter"})
ACK_FIELDS = frozenset({"receipts", "outcome"})
EXTEND_FIELDS = frozenset({"receipts", "lock_ms"})
OUTCOMES = ("accept", "release", "reject")
MAX_MESSAGES = 1_000
MAX_WAIT_MS = 30_000
MAX_RECEIPTS = 1_000
MIN_LOCK_MS, MAX_LOCK_MS = 100, 12 * 3_600_000
MAX_DELIVERIES = 1_000
_turns = itertools.count()  # which partition a receive looks at first
LEADER_HEADER = "Raftline-Queue-Leader"


def _queue(name: Any) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise invalid(f"invalid queue name {name!r}: 1-249 characters of [A-Za-z0-9._-]")
    return name


def _int(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if not validation.is_int(value) or not low <= value <= high:
        raise invalid(f"{name} must be an integer in {low}..{high}")
    return int(value)


def _receipts(body: dict[str, Any]) -> list[str]:
    items = body.get("receipts")
    if (
        not isinstance(items, list)
        or not 0 < len(items) <= MAX_RECEIPTS
        or not all(isinstance(r, str) for r in items)
    ):
        raise invalid(f"receipts must be a list of 1..{MAX_RECEIPTS} receipt strings")
    return items


async def create(request: web.Request) -> web.Response:
    body = validation.fields_of(await read_body(request), CREATE_FIELDS, "the queue")
    name = _queue(body.get("name"))
    args: dict[str, Any] = {
        "topic": validation.topic_name(body.get("topic")),
        "lock_ms": _int(body, "lock_ms", 30_000, MIN_LOCK_MS, MAX_LOCK_MS),
        "max_deliveries": _int(body, "max_deliveries", 5, 1, MAX_DELIVERIES),
        "dead_letter_topic": None,
    }
    if body.get("dead_letter_topic") is not None:
        args["dead_letter_topic"] = validation.topic_name(body["dead_letter_topic"])
        if args["dead_letter_topic"] == args["topic"]:
            raise invalid("dead_letter_topic must be another topic than the queue's")
    answer = await _state(request).broker.queue_call(name, "queue_create", args)
    return reply(request, answer["queue"], status=201)


async def list_queues(request: web.Request) -> web.Response:
    return reply(request, {"queues": await _state(request).broker.list_queues()})


async def describe(request: web.Request) -> web.Response:
    name = _queue(request.match_info["queue"])
    answer = await _state(request).broker.queue_call(name, "queue_describe", {})
    return reply(request, answer, headers=_leader(request, name))


async def delete(request: web.Request) -> web.Response:
    name = _queue(request.match_info["queue"])
    await _state(request).broker.queue_call(name, "queue_delete", {})
    return web.Response(status=204)


def _leader(request: web.Request, name: str) -> dict[str, str] | None:
    """The header naming the queue's shard leader, when this node knows it."""
    address = _state(request).broker.queue_leader_http(name)
    return {LEADER_HEADER: address} if address else None


def _message(topic: str, item: dict[str, Any], binary: bool = False) -> dict[str, Any]:
    """A received message as API.md shapes it; `binary` (msgpack): key and value as bytes,
    headers in one map of text and bytes, no `_b64` fields (nothing in base64)."""
    offset, timestamp, key, value, headers = item["record"]
    message: dict[str, Any] = {
        "topic": topic,
        "partition": item["partition"],
        "offset": offset,
        "timestamp": timestamp,
    }
    named = [(str(k), v) for k, v in headers]
    if binary:
        message["key"] = key
        message["value"] = value
        message["headers"] = codec.binary_headers(named)
    else:
        codec._put_text(message, "key", key)
        codec._put_text(message, "value", value)
        codec._put_headers(message, named)
    message["receipt"] = item["receipt"]
    message["delivery_count"] = item["delivery_count"]
    return message


async def receive(request: web.Request) -> web.Response:
    state = _state(request)
    name = _queue(request.match_info["queue"])
    body = (
        validation.fields_of(await read_body(request), RECEIVE_FIELDS, "the receive request")
        if request.body_exists
        else {}
    )
    limit = _int(body, "max_messages", 10, 1, MAX_MESSAGES)
    wait_ms = _int(body, "wait_ms", 0, 0, MAX_WAIT_MS)
    record_filter = filters.from_body(body.get("filter"))
    payload = await receive_messages(state, name, limit, wait_ms, record_filter)
    if wants_msgpack(request):
        payload = codec.binary_headers_inline(payload)
    return reply(request, payload, headers=_leader(request, name))


async def receive_messages(
    state: ApiState,
    name: str,
    limit: int,
    wait_ms: int,
    record_filter: filters.RecordFilter | None = None,
    binary: bool = False,
) -> dict[str, Any]:
    """One receive (API.md): `{"messages": [...]}`; only records `record_filter` matches, the
    others left available to other receivers. `binary`: the messages shaped for msgpack."""
    deadline = time.monotonic() + wait_ms / 1000
    # Each call to the shard leader must end well inside a node-to-node request's timeout.
    slice_ms = max(int(state.broker.config.request_timeout_s * 1000) - 2_000, 500)
    turn = next(_turns)
    while True:
        left = max(int((deadline - time.monotonic()) * 1000), 0)
        args: dict[str, Any] = {"max_messages": limit, "wait_ms": min(left, slice_ms), "turn": turn}
        if record_filter is not None:
            args["filter"] = record_filter.source
        answer = await state.broker.queue_call(name, "queue_receive", args)
        if answer["messages"] or time.monotonic() >= deadline:
            break
    return {"messages": [_message(answer["topic"], m, binary) for m in answer["messages"]]}


async def ack(request: web.Request) -> web.Response:
    name = _queue(request.match_info["queue"])
    body = validation.fields_of(await read_body(request), ACK_FIELDS, "the ack request")
    outcome = body.get("outcome", "accept")
    if outcome not in OUTCOMES:
        raise invalid(f"outcome must be one of {', '.join(OUTCOMES)}")
    args = {"receipts": _receipts(body), "outcome": outcome}
    answer = await _state(request).broker.queue_call(name, "queue_ack", args)
    return reply(request, {"results": answer["results"]}, headers=_leader(request, name))


async def extend(request: web.Request) -> web.Response:
    name = _queue(request.match_info["queue"])
    body = validation.fields_of(await read_body(request), EXTEND_FIELDS, "the extend request")
    args: dict[str, Any] = {"receipts": _receipts(body)}
    if body.get("lock_ms") is not None:
        args["lock_ms"] = _int(body, "lock_ms", 0, MIN_LOCK_MS, MAX_LOCK_MS)
    answer = await _state(request).broker.queue_call(name, "queue_extend", args)
    body = {"results": answer["results"], "lock_ms": answer["lock_ms"]}
    return reply(request, body, headers=_leader(request, name))


def add_routes(app: web.Application) -> None:
    router = app.router
    router.add_post("/v1/queues", create)
    router.add_get("/v1/queues", list_queues)
    router.add_get("/v1/queues/{queue}", describe)
    router.add_delete("/v1/queues/{queue}", delete)
    router.add_post("/v1/queues/{queue}/receive", receive)
    router.add_post("/v1/queues/{queue}/ack", ack)
    router.add_post("/v1/queues/{queue}/extend", extend)
