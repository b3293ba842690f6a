"""The queue client, written once for both shells: receive, ack, release, reject, extend and the
queue's admin calls as Ops, and the received message with its settle methods.

Owns `QueueCore` (the requests and the reading of their answers), `QueueApi` (the public
methods: each hands its Op to the client shell's `_run`, so it returns the value from Client
and an awaitable of it from AsyncClient) and `QueueMessage`. A message used as a context
manager (`with` on Client, `async with` on AsyncClient) is acknowledged when the block ends
normally and released when it raises. No I/O here.

Routing: every answer names the queue's shard leader (header Raftline-Queue-Leader); receive, ack
and extend go straight to it, so the node that takes them runs them without a forward. A
retryable failure forgets it (the retry goes to a bootstrap node, which forwards), and an address
this client cannot connect to is skipped as for partition leaders.

Retries: the shells retry retryable errors. A receive retried after its answer was lost leaves
the first answer's records locked until their lock expires (then they come again: at-least-once);
an accept retried after it applied answers ok (the shard remembers which delivery acknowledged
each recent record); a release or reject retried after it applied answers `lock_expired`.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from raftline.clients.core import Call, Op, Returns, json_call
from raftline.clients.streaming import StreamCursor
from raftline.clients.wire import (
    Answer,
    HeaderValue,
    RaftlineError,
    _decoded,
    _json_headers,
    json_request,
)

if TYPE_CHECKING:
    from raftline.clients.core import ClientApi

OUTCOMES = ("accept", "release", "reject")
LEADER_HEADER = "raftline-queue-leader"


@dataclass(slots=True)
class QueueMessage:
    """One received message: the fetch fields, its receipt and delivery count; `ack()`,
    `release()`, `reject()` and `extend()` settle or keep it (each returns whether the receipt
    still held its lock; an awaitable of that on AsyncClient)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    receipt: str
    delivery_count: int
    headers: dict[str, HeaderValue] = field(default_factory=dict)
    queue: QueueApi | None = field(default=None, repr=False, compare=False)
    error: str | None = None  # the error code of the last settle that failed

    @property
    def text(self) -> str | None:
        return None if self.value is None else self.value.decode("utf-8", "replace")

    def _queue(self) -> QueueApi:
        if self.queue is None:
            raise ValueError("this message was not received through a queue client")
        return self.queue

    def ack(self) -> Returns[bool]:
        return self._queue().settle_one(self, "accept")

    def release(self) -> Returns[bool]:
        return self._queue().settle_one(self, "release")

    def reject(self) -> Returns[bool]:
        return self._queue().settle_one(self, "reject")

    def extend(self, lock_ms: int | None = None) -> Returns[bool]:
        return self._queue().extend_one(self, lock_ms)

    # acknowledged on success, released on an exception

    def __enter__(self) -> QueueMessage:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        result = self.ack() if kind is None else self.release()
        if hasattr(result, "__await__"):
            result.close()  # type: ignore[union-attr]  # a coroutine: never started
            raise TypeError("use `async with message:` with an AsyncClient")

    async def __aenter__(self) -> QueueMessage:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        await (self.ack() if kind is None else self.release())  # type: ignore[misc]


def queue_path(name: str, action: str = "") -> str:
    path = f"/v1/queues/{urllib.parse.quote(name, safe='')}"
    return f"{path}/{action}" if action else path


class QueueCore:
    """The Ops of one queue. `max_messages` and `wait_ms` are the defaults of `receive`.
    `filter`: receive only the records this expression matches (README "Filters"; the others
    stay available to other receivers). `stream=True`: the queue's node pushes locked
    messages over a WebSocket, at most `prefetch` (default max_messages) received and not yet
    settled (RabbitMQ's prefetch); where the upgrade is refused, receive long-polls."""

    def __init__(
        self,
        client: ClientApi,
        name: str,
        *,
        max_messages: int = 10,
        wait_ms: int = 1_000,
        filter: str | None = None,
        stream: bool = False,
        prefetch: int | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.max_messages = max_messages
        self.wait_ms = wait_ms
        self.record_filter = filter
        self.stream = StreamCursor(stream, prefetch or max_messages, client.nodes)
        self._unsettled: set[str] = set()  # receipts pushed by the stream, their credit out
        self._leader: str | None = None  # the shard leader's base URL, from the last answer

    def leader_url(self) -> str | None:
        """Where the next receive, ack or extend goes (None: a bootstrap node)."""
        if self._leader in self.client.metadata.unreachable:
            return None
        return self._leader

    def _called(self, action: str, body: dict[str, Any]) -> Op[Any]:
        """POST `body` to the queue's `action`, at its shard leader when known."""
        try:
            answer = yield Call(
                "POST", queue_path(self.name, action), json_request(body), self.leader_url()
            )
        except RaftlineError as error:
            if error.retryable:
                self._leader = None
            raise
        self._learn_leader(answer)
        return answer.json()

    def _learn_leader(self, answer: Answer) -> None:
        address = answer.headers.get(LEADER_HEADER)
        self._leader = f"http://{address}" if address else None

    def _located(self) -> Op[None]:
        """Learn the shard leader from the queue's description (its answer names it)."""
        self._learn_leader((yield Call("GET", queue_path(self.name), json_request(None))))

    def received(self, max_messages: int, wait_ms: int) -> Op[list[QueueMessage]]:
        if self.stream.active():
            streamed = yield from self._streamed(wait_ms)
            if streamed is not None:
                return streamed
        body: dict[str, Any] = {"max_messages": max_messages, "wait_ms": wait_ms}
        if self.record_filter is not None:
            body["filter"] = self.record_filter
        answer = yield from self._called("receive", body)
        return [self._message(m) for m in answer.get("messages", [])]

    def _streamed(self, wait_ms: int) -> Op[list[QueueMessage] | None]:
        """The stream's next frame; None when the upgrade was refused. A lost stream answers
        nothing now (its messages' locks expire and they come again) and is opened again at
        the next receive."""
        # msgpack frames: values as bytes, no base64 (a server that does not know the
        # parameter sends JSON text frames, taken as well)
        params = {"max_messages": str(self.max_messages), "format": "msgpack"}
        if self.record_filter is not None:
            params["filter"] = self.record_filter
        if self.stream.handle is None:
            self._unsettled.clear()  # a new stream starts with the whole window
            if self.leader_url() is None:  # open it at the shard leader: no forward per round
                yield from self._located()
        path = queue_path(self.name, "stream")
        if not (yield from self.stream.opened(path, params, self.leader_url())):
            return None
        try:
            frame = yield from self.stream.frame(wait_ms / 1000)
        except RaftlineError as error:
            if error.retryable:
                return []
            raise
        if isinstance(frame, bytes):
            packed = msgpack.unpackb(frame, raw=False)
            messages = [self._message(m, packed=True) for m in packed["messages"]]
        else:
            messages = [self._message(m) for m in (frame or {}).get("messages", ())]
        self._unsettled.update(m.receipt for m in messages)
        return messages

    def stopped(self) -> Op[None]:
        yield from self.stream.shut()

    def _message(self, m: dict[str, Any], packed: bool = False) -> QueueMessage:
        """A message of a JSON answer or frame; `packed`: of a msgpack frame (key and value as
        bytes, headers in one map of text and bytes)."""
        return QueueMessage(
            topic=str(m["topic"]),
            partition=int(m["partition"]),
            offset=int(m["offset"]),
            timestamp=int(m.get("timestamp") or 0),
            key=m["key"] if packed else _decoded(m, "key"),
            value=m["value"] if packed else _decoded(m, "value"),
            receipt=str(m["receipt"]),
            delivery_count=int(m["delivery_count"]),
            headers=dict(m["headers"]) if packed else _json_headers(m),
            queue=self if isinstance(self, QueueApi) else None,
        )

    def settled(self, messages: list[QueueMessage], outcome: str) -> Op[list[bool]]:
        """Settle `messages`; per message whether it held its lock (else `message.error`)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}")
        if not messages:
            return []
        body = {"receipts": [m.receipt for m in messages], "outcome": outcome}
        answer = yield from self._called("ack", body)
        for message in messages:  # settled (or its lock lost): its stream credit goes back
            if message.receipt in self._unsettled:
                self._unsettled.discard(message.receipt)
                self.stream.consumed(1)
        yield from self.stream.granted()
        return _results(messages, answer)

    def extended(self, messages: list[QueueMessage], lock_ms: int | None) -> Op[list[bool]]:
        if not messages:
            return []
        body: dict[str, Any] = {"receipts": [m.receipt for m in messages]}
        if lock_ms is not None:
            body["lock_ms"] = lock_ms
        answer = yield from self._called("extend", body)
        return _results(messages, answer)


def _results(messages: list[QueueMessage], answer: dict[str, Any]) -> list[bool]:
    out = []
    for message, result in zip(messages, answer["results"], strict=True):
        message.error = result.get("error")
        out.append(bool(result.get("ok")))
    return out


def _first(results: list[bool]) -> bool:
    return results[0]


def _single(op: Op[list[bool]]) -> Op[bool]:
    return _first((yield from op))


class QueueApi(QueueCore):
    """The public calls of a queue (Queue and AsyncQueue): admin, receive and settle."""

    def create(
        self,
        topic: str,
        *,
        lock_ms: int = 30_000,
        max_deliveries: int = 5,
        dead_letter_topic: str | None = None,
    ) -> Returns[dict[str, Any]]:
        body = {
            "name": self.name,
            "topic": topic,
            "lock_ms": lock_ms,
            "max_deliveries": max_deliveries,
            "dead_letter_topic": dead_letter_topic,
        }
        return self.client._run(json_call("POST", "/v1/queues", body))

    def describe(self) -> Returns[dict[str, Any]]:
        return self.client._run(json_call("GET", queue_path(self.name)))

    def delete(self) -> Returns[Any]:
        return self.client._run(json_call("DELETE", queue_path(self.name)))

    def receive(
        self, max_messages: int | None = None, wait_ms: int | None = None
    ) -> Returns[list[QueueMessage]]:
        return self.client._run(
            self.received(
                self.max_messages if max_messages is None else max_messages,
                self.wait_ms if wait_ms is None else wait_ms,
            )
        )

    def ack(self, messages: list[QueueMessage]) -> Returns[list[bool]]:
        return self.client._run(self.settled(list(messages), "accept"))

    def release(self, messages: list[QueueMessage]) -> Returns[list[bool]]:
        return self.client._run(self.settled(list(messages), "release"))

    def reject(self, messages: list[QueueMessage]) -> Returns[list[bool]]:
        return self.client._run(self.settled(list(messages), "reject"))

    def extend(
        self, messages: list[QueueMessage], lock_ms: int | None = None
    ) -> Returns[list[bool]]:
        return self.client._run(self.extended(list(messages), lock_ms))

    def close(self) -> Returns[None]:
        """Close the queue's stream, if it has one (its unsettled messages keep their locks)."""
        return self.client._run(self.stopped())

    def settle_one(self, message: QueueMessage, outcome: str) -> Returns[bool]:
        return self.client._run(_single(self.settled([message], outcome)))

    def extend_one(self, message: QueueMessage, lock_ms: int | None) -> Returns[bool]:
        return self.client._run(_single(self.extended([message], lock_ms)))
