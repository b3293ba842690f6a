"""Exchanges and request/reply in the client, written once for both shells.

Owns `RoutingClientApi` (the admin calls of exchanges, `publish`, `request` and `responder`,
each handing its Op to the shell's `_run`: a value from Client, an awaitable from AsyncClient),
`Reply` and `Responder`. No I/O here.

`request()` sends one `POST /v1/request` under this client's id (so all its requests share one
reply topic, which the cluster deletes once the client has been gone for a while) with a
correlation id made here: a try that failed with a retryable error other than `timeout` is
made again with the same id, so the reply to any try answers it. A request may therefore reach
a responder more than once; responders that must not act twice dedupe by `correlation-id`.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from raftline.clients.core import Call, ClientApi, Hook, Op, Pause, Returns, _then, json_call
from raftline.clients.queueing import QueueCore, QueueMessage
from raftline.clients.wire import (
    Message,
    RaftlineError,
    encode_message,
    json_message,
    json_request,
    messages_path,
)

REPLY_TO = "reply-to"
CORRELATION_ID = "correlation-id"
KINDS = ("fanout", "direct", "topic")


def exchange_path(name: str, *rest: str) -> str:
    return "/".join(["/v1/exchanges", urllib.parse.quote(name, safe=""), *rest])


def _destination(topic: str | None, queue: str | None) -> dict[str, str]:
    if (topic is None) == (queue is None):
        raise ValueError("name exactly one of topic= or queue=")
    return {"topic": topic} if topic is not None else {"queue": queue}  # type: ignore[dict-item]


@dataclass(slots=True)
class Reply:
    """The reply to a request: its message (on the client's reply topic), the correlation id,
    and where the request was written (`[{"topic", "partition", "offset"}]`)."""

    correlation_id: str
    message: Message
    request: list[dict[str, Any]]

    @property
    def value(self) -> bytes | None:
        return self.message.value

    @property
    def text(self) -> str | None:
        value = self.message.value
        return None if value is None else value.decode("utf-8", "replace")


class Responder:
    """Serves requests from a queue: for each received message, `handler(message)` (a
    QueueMessage; on AsyncClient it may be a coroutine function) returns the reply value
    (str or bytes; None: no reply), which goes to the message's `reply-to` topic with its
    `correlation-id`; then the message is acknowledged (also when the reply topic is gone:
    the requester gave up). A handler that raises releases the message (another responder
    may take it) and the error propagates out of `serve`."""

    def __init__(
        self,
        client: RoutingClientApi,
        queue: str,
        handler: Callable[[QueueMessage], Any],
        *,
        max_messages: int = 10,
        wait_ms: int = 1_000,
    ) -> None:
        self.client = client
        self.queue = QueueCore(client, queue)
        self.handler = handler
        self.max_messages = max_messages
        self.wait_ms = wait_ms

    def serve(self, requests: int | None = None) -> Returns[int]:
        """Answer `requests` requests (None: serve until the handler raises); the count."""
        return self.client._run(self._served(requests))

    def _served(self, limit: int | None) -> Op[int]:
        handled = 0
        while limit is None or handled < limit:
            room = self.max_messages if limit is None else min(self.max_messages, limit - handled)
            for message in (yield from self.queue.received(room, self.wait_ms)):
                try:
                    value = yield Hook(self.handler, (message,))
                except Exception:
                    yield from self.queue.settled([message], "release")
                    raise
                reply_to = message.headers.get(REPLY_TO)
                if value is not None and isinstance(reply_to, str):
                    correlation = message.headers.get(CORRELATION_ID)
                    headers = {} if correlation is None else {CORRELATION_ID: correlation}
                    body = {"messages": [encode_message(value, headers=headers)]}
                    try:
                        yield from json_call("POST", messages_path(reply_to), body)
                    except RaftlineError as error:
                        if error.code != "unknown_topic":
                            raise
                        # the requester is gone (its reply topic expired): nobody to answer
                yield from self.queue.settled([message], "accept")
                handled += 1
        return handled


class RoutingClientApi(ClientApi):
    """ClientApi with exchanges and request/reply (the base of Client and AsyncClient)."""

    _client_id: str | None = None

    @property
    def client_id(self) -> str:
        """This client's id: it names the client's reply topic (`_reply.<id>`)."""
        if self._client_id is None:
            self._client_id = uuid.uuid4().hex
        return self._client_id

    # ---- exchanges (admin) --------------------------------------------------------------------

    def create_exchange(
        self,
        name: str,
        kind: str,
        *,
        alternate_topic: str | None = None,
        alternate_queue: str | None = None,
    ) -> Returns[dict[str, Any]]:
        """An exchange of `kind` (fanout, direct or topic); messages that match no binding go
        to the alternate topic or queue when one is named, else are dropped (and counted)."""
        body: dict[str, Any] = {"name": name, "kind": kind}
        if alternate_topic is not None or alternate_queue is not None:
            body["alternate"] = _destination(alternate_topic, alternate_queue)
        return self._run(json_call("POST", "/v1/exchanges", body))

    def list_exchanges(self) -> Returns[list[dict[str, Any]]]:
        return self._run(_then(json_call("GET", "/v1/exchanges"), itemgetter("exchanges")))

    def describe_exchange(self, name: str) -> Returns[dict[str, Any]]:
        """Kind, alternate and bindings (`[{"key", "topic"} | {"key", "queue", "topic"}]`)."""
        return self._run(json_call("GET", exchange_path(name)))

    def delete_exchange(self, name: str) -> Returns[Any]:
        return self._run(json_call("DELETE", exchange_path(name)))

    def bind(
        self, exchange: str, key: str = "", *, topic: str | None = None, queue: str | None = None
    ) -> Returns[dict[str, Any]]:
        """Bind a topic or a queue with `key` (a routing key for direct, a pattern with `*` and
        `#` for topic, ignored by fanout). Binding twice is one binding."""
        body = {"key": key, **_destination(topic, queue)}
        return self._run(json_call("POST", exchange_path(exchange, "bindings"), body))

    def unbind(
        self, exchange: str, key: str = "", *, topic: str | None = None, queue: str | None = None
    ) -> Returns[Any]:
        params = {"key": key, **_destination(topic, queue)}
        return self._run(json_call("DELETE", exchange_path(exchange, "bindings"), params=params))

    # ---- publishing -----------------------------------------------------------------------------

    def publish(
        self,
        exchange: str,
        routing_key: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        *,
        headers: dict[str, str | bytes] | None = None,
        reply_to: str | None = None,
        correlation_id: str | None = None,
    ) -> Returns[dict[str, Any]]:
        """Publish one message; its result: `{"routed": [{"topic", "partition", "offset"}]}`
        plus `"dropped": true` when it matched nothing, `"alternate": true` when it went to
        the alternate. `reply_to` and `correlation_id` set the request/reply headers."""
        headers = dict(headers or {})
        if reply_to is not None:
            headers[REPLY_TO] = reply_to
        if correlation_id is not None:
            headers[CORRELATION_ID] = correlation_id
        message = {"routing_key": routing_key, **encode_message(value, key, headers=headers)}
        op = json_call("POST", exchange_path(exchange, "messages"), {"messages": [message]})
        return self._run(_then(op, _first_result))

    def publish_many(
        self, exchange: str, messages: list[dict[str, Any]]
    ) -> Returns[dict[str, Any]]:
        """Publish encoded messages (encode_message(...) plus "routing_key") in one request:
        all of them or none when they go to several partitions (see the README)."""
        return self._run(
            json_call("POST", exchange_path(exchange, "messages"), {"messages": messages})
        )

    # ---- request/reply --------------------------------------------------------------------------

    def request(
        self,
        value: bytes | str | None,
        *,
        topic: str | None = None,
        exchange: str | None = None,
        routing_key: str = "",
        key: bytes | str | None = None,
        headers: dict[str, str | bytes] | None = None,
        timeout_ms: int = 5_000,
        correlation_id: str | None = None,
        keep_reply_topic: bool = True,
    ) -> Returns[Reply]:
        """Publish a request to `topic` or through `exchange` and wait up to `timeout_ms`
        for its reply; raises RaftlineError `timeout` when none comes. The reply comes on
        this client's reply topic, kept for its next requests; with `keep_reply_topic=False`
        on one made for this request and deleted after it (for one-off callers)."""
        if (topic is None) == (exchange is None):
            raise ValueError("name exactly one of topic= or exchange=")
        if timeout_ms / 1000 >= self.timeout:
            raise ValueError(f"timeout_ms must be below the client's timeout ({self.timeout} s)")
        body: dict[str, Any] = {
            "message": encode_message(value, key, headers=headers),
            "timeout_ms": timeout_ms,
            "correlation_id": correlation_id or uuid.uuid4().hex,
        }
        if keep_reply_topic:
            body["client_id"] = self.client_id
        if topic is not None:
            body["topic"] = topic
        else:
            body.update(exchange=exchange, routing_key=routing_key)
        return self._run(self._requested(body))

    def _requested(self, body: dict[str, Any]) -> Op[Reply]:
        """One request, tried again (same correlation id) after retryable failures other than
        `timeout`: a timeout means the wait was spent, not that nothing happened."""
        attempt = 0
        while True:
            try:
                once = dataclasses.replace(json_request(body), retry=False)  # retried here
                answer = yield Call("POST", "/v1/request", once)
                break
            except RaftlineError as error:
                if error.code == "timeout" or not error.retryable:
                    raise
                if attempt >= self.retry.retries:
                    raise
                yield Pause(self.retry.delay(attempt))
                attempt += 1
        data = answer.json()
        reply = data["reply"]
        return Reply(str(data["correlation_id"]), json_message(reply), list(data["request"]))

    def responder(
        self, queue: str, handler: Callable[[QueueMessage], Any], **options: Any
    ) -> Responder:
        """A Responder serving requests from `queue` with `handler` (options: max_messages,
        wait_ms); `responder(...).serve()` runs it."""
        return Responder(self, queue, handler, **options)


def _first_result(answer: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = answer["results"][0]
    return result
