"""The exchange endpoints: create, list, describe and delete exchanges, bind and unbind
destinations, and publish through an exchange (`POST /v1/exchanges/{x}/messages`).

Owns their request checks and answer shapes; definitions live in the cluster metadata
(Broker.exchanges), routing and writing in api/exchange_publish.py. Every change is one
metadata command through the controller, so any node answers and a lost controller gives a
retryable 503 within an election timeout.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftline.api import validation
from raftline.api.app import STATE_KEY, _state, read_body, reply
from raftline.api.errors import invalid
from raftline.api.exchange_publish import RoutingProducers, publish
from raftline.api.queues import QUEUE_NAME
from raftline.node.exchanges.matcher import KINDS, MAX_KEY_CHARS, check_pattern
from raftline.node.exchanges.model import EXCHANGE_NAME

CREATE_FIELDS = frozenset({"name", "kind", "alternate"})
BINDING_FIELDS = frozenset({"key", "topic", "queue"})
DESTINATION_FIELDS = frozenset({"topic", "queue"})
PUBLISH_FIELDS = frozenset({"messages", "acks"})
MAX_PUBLISH_MESSAGES = 10_000
PRODUCERS_KEY = web.AppKey("routing_producers", RoutingProducers)


def exchange_name(name: Any) -> str:
    if not isinstance(name, str) or not EXCHANGE_NAME.match(name):
        raise invalid(f"invalid exchange name {name!r}: 1-249 characters of [A-Za-z0-9._-]")
    return name


def routing_key(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_KEY_CHARS:
        raise invalid(f"{where}: routing_key must be a string of at most {MAX_KEY_CHARS} chars")
    return value


def destination(
    obj: Any, what: str, allowed: frozenset[str] = DESTINATION_FIELDS
) -> dict[str, str]:
    """`{"topic": t}` or `{"queue": q}`: exactly one of them."""
    body = validation.fields_of(obj, allowed, what)
    named = [k for k in ("topic", "queue") if body.get(k) is not None]
    if len(named) != 1:
        raise invalid(f"{what} names exactly one of topic or queue")
    if named[0] == "topic":
        return {"topic": validation.topic_name(body["topic"])}
    queue = body["queue"]
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise invalid(f"invalid queue name {queue!r}: 1-249 characters of [A-Za-z0-9._-]")
    return {"queue": queue}


async def create(request: web.Request) -> web.Response:
    body = validation.fields_of(await read_body(request), CREATE_FIELDS, "the exchange")
    name = exchange_name(body.get("name"))
    kind = body.get("kind")
    if kind not in KINDS:
        raise invalid(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    alternate = body.get("alternate")
    if alternate is not None:
        alternate = destination(alternate, "alternate")
    described = await _state(request).broker.exchanges.create(name, kind, alternate)
    return reply(request, described, status=201)


async def list_exchanges(request: web.Request) -> web.Response:
    return reply(request, {"exchanges": await _state(request).broker.exchanges.list()})


async def describe(request: web.Request) -> web.Response:
    name = exchange_name(request.match_info["exchange"])
    return reply(request, await _state(request).broker.exchanges.describe(name))


async def delete(request: web.Request) -> web.Response:
    name = exchange_name(request.match_info["exchange"])
    await _state(request).broker.exchanges.delete(name)
    return web.Response(status=204)


def _binding(body: dict[str, Any], kind: str | None = None) -> tuple[str, dict[str, str]]:
    key = body.get("key", "")
    if not isinstance(key, str):
        raise invalid("key must be a string (a routing key, or a pattern for a topic exchange)")
    if kind is not None:
        problem = check_pattern(kind, key)
        if problem is not None:
            raise invalid(problem)
    return key, destination(body, "the binding", BINDING_FIELDS)


async def bind(request: web.Request) -> web.Response:
    """`POST /v1/exchanges/{x}/bindings` `{"key": pattern, "topic": t | "queue": q}`."""
    broker = _state(request).broker
    name = exchange_name(request.match_info["exchange"])
    body = validation.fields_of(await read_body(request), BINDING_FIELDS, "the binding")
    exchange = await broker.exchanges.exchange(name)
    key, target = _binding(body, exchange.kind)
    return reply(request, await broker.exchanges.bind(name, key, target), status=201)


async def unbind(request: web.Request) -> web.Response:
    """`DELETE /v1/exchanges/{x}/bindings?key=K&topic=T` (or `&queue=Q`)."""
    name = exchange_name(request.match_info["exchange"])
    query = validation.fields_of(dict(request.query), BINDING_FIELDS, "the query")
    key, target = _binding(query)
    await _state(request).broker.exchanges.unbind(name, key, target)
    return web.Response(status=204)


async def publish_messages(request: web.Request) -> web.Response:
    """`POST /v1/exchanges/{x}/messages` `{"messages": [{"routing_key": k, "key", "value",
    "headers", "timestamp"}]}`: each message to every destination its key matches."""
    state = _state(request)
    name = exchange_name(request.match_info["exchange"])
    body = validation.fields_of(await read_body(request), PUBLISH_FIELDS, "the publish request")
    if body.get("acks", "all") != "all":
        raise invalid("an exchange publish is acknowledged by a majority of replicas: acks=all")
    raw = body.get("messages")
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_PUBLISH_MESSAGES:
        raise invalid(f"messages must be an array of 1..{MAX_PUBLISH_MESSAGES} messages")
    keys, plain = split_routing_keys(raw)
    messages = validation.produce_request({"messages": plain}).messages
    exchange = await state.broker.exchanges.for_publish(name)
    answer = await publish(state, request.app[PRODUCERS_KEY], exchange, keys, messages)
    return reply(request, answer)


def split_routing_keys(raw: list[Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Each message's routing key (default "") and the message without it, for the produce
    checks; a partition is refused (an exchange chooses partitions by key, as produce does)."""
    keys, plain = [], []
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(f"{where} must be a JSON object")
        message = dict(message)
        keys.append(routing_key(message.pop("routing_key", ""), where))
        if "partition" in message:
            raise invalid(f"{where}: an exchange picks partitions by key; drop partition")
        plain.append(message)
    return keys, plain


def add_routes(app: web.Application) -> None:
    app[PRODUCERS_KEY] = RoutingProducers(app[STATE_KEY].broker.node_id)
    router = app.router
    router.add_post("/v1/exchanges", create)
    router.add_get("/v1/exchanges", list_exchanges)
    router.add_get("/v1/exchanges/{exchange}", describe)
    router.add_delete("/v1/exchanges/{exchange}", delete)
    router.add_post("/v1/exchanges/{exchange}/bindings", bind)
    router.add_delete("/v1/exchanges/{exchange}/bindings", unbind)
    router.add_post("/v1/exchanges/{exchange}/messages", publish_messages)
