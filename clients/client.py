"""Python client for the Raftline HTTP API: sync and asyncio admin, producer and consumer.

Owns batching (linger, size), key partitioning, leader discovery, retries and keep-alive reuse.
By default producers send Kafka record batches they build themselves and consumers read whole
stored batches (`wire="batch"`); `wire="json"` speaks the plain JSON contract instead.
Bulk paths skip per-message objects: `send_batch` sends many values as one batch behind one
future, and `fetch_values`/`poll_values` hand back values only.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import http.client
import itertools
import json
import operator
import random
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import aiohttp
import orjson

from raftline.api.codec import BATCH_CONTENT_TYPE, read_whole_body
from raftline.api.partitioner import partition_for_key
from raftline.raftlog.batch import iter_headers
from raftline.raftlog.records import (
    DecodedRecord,
    Record,
    batch_values,
    build_batch_buffer,
    decode_batch,
)
from raftline.raftlog.speedups import keep_large_buffers

DEFAULT_URL = "http://127.0.0.1:8080"
METADATA_TTL_S = 30.0
WIRES = ("batch", "json")  # body formats of produce and fetch; see the module docstring
_value_of = operator.attrgetter("value")
_T = TypeVar("_T")


class RaftlineError(Exception):
    """An error answer (or a failed connection) carrying the contract's error code."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status
        self.body = body or {}


def _error_from(status: int, raw: bytes) -> RaftlineError:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        text = raw[:200].decode("utf-8", "replace")
        return RaftlineError(
            "http_error", f"HTTP {status}: {text}", retryable=status >= 500, status=status
        )
    return RaftlineError(
        str(error.get("code", "unknown")),
        str(error.get("message", "")),
        retryable=bool(error.get("retryable", False)),
        status=status,
        body=body,
    )


def _connection_error(url: str, exc: BaseException) -> RaftlineError:
    return RaftlineError("connection_failed", f"{url}: {exc}", retryable=True)


@dataclass(slots=True)
class Message:
    """One fetched message. `key`/`value` are bytes (None when absent or a tombstone)."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str | None:
        return None if self.value is None else self.value.decode("utf-8", "replace")


@dataclass(slots=True)
class FetchResult:
    messages: list[Message]
    next_offset: int
    log_start_offset: int
    high_watermark: int


class Acked(NamedTuple):
    """Where a produced message landed (a named tuple: one is made per acknowledged message)."""

    partition: int
    offset: int


class BatchAcked(NamedTuple):
    """Where a batch sent by send_batch/produce_batch landed: `count` consecutive offsets from
    `base_offset` on one partition. `base_offset` is None with acks=none (nothing is answered)."""

    partition: int
    base_offset: int | None
    count: int

    @property
    def offsets(self) -> range:
        if self.base_offset is None:
            raise ValueError("a batch sent with acks=none has no known offsets")
        return range(self.base_offset, self.base_offset + self.count)


@dataclass(slots=True)
class FetchedValues:
    """The values of one fetch in offset order (None for a null value), without Message objects."""

    values: list[bytes | None]
    next_offset: int
    log_start_offset: int
    high_watermark: int


def _bytes_field(name: str, data: bytes | str | None) -> dict[str, Any]:
    if data is None:
        return {name: None}
    if isinstance(data, str):
        return {name: data}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode("ascii")}


def encode_message(
    value: bytes | str | None,
    key: bytes | str | None = None,
    *,
    partition: int | None = None,
    headers: dict[str, str] | None = None,
    timestamp: int | None = None,
) -> dict[str, Any]:
    """The JSON object the produce endpoint takes for one message."""
    message = _bytes_field("value", value)
    if key is not None:
        message.update(_bytes_field("key", key))
    if partition is not None:
        message["partition"] = partition
    if headers:
        message["headers"] = dict(headers)
    if timestamp is not None:
        message["timestamp"] = timestamp
    return message


def _as_bytes(data: bytes | str | None) -> bytes | None:
    return data.encode("utf-8") if isinstance(data, str) else data


def encode_record(
    value: bytes | str | None,
    key: bytes | str | None = None,
    *,
    headers: dict[str, str] | None = None,
    timestamp: int | None = None,
) -> Record:
    """The record a batching producer puts in its own batch for one message."""
    return Record(
        _as_bytes(value),
        _as_bytes(key),
        tuple((name, _as_bytes(v)) for name, v in headers.items()) if headers else (),
        timestamp,
    )


def _decoded(obj: dict[str, Any], name: str) -> bytes | None:
    if f"{name}_b64" in obj:
        return base64.b64decode(obj[f"{name}_b64"])
    text = obj.get(name)
    return None if text is None else str(text).encode("utf-8")


def parse_fetch(body: dict[str, Any]) -> FetchResult:
    messages = [
        Message(
            partition=int(m["partition"]),
            offset=int(m["offset"]),
            timestamp=int(m.get("timestamp") or 0),
            key=_decoded(m, "key"),
            value=_decoded(m, "value"),
            headers=dict(m.get("headers") or {}),
        )
        for m in body.get("messages", [])
    ]
    return FetchResult(
        messages,
        int(body["next_offset"]),
        int(body["log_start_offset"]),
        int(body["high_watermark"]),
    )


@dataclass(slots=True)
class _Answer:
    """A successful HTTP answer: headers (lower-case names) and the raw body."""

    headers: dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return orjson.loads(self.raw) if self.raw else {}


@dataclass(slots=True)
class _Request:
    params: dict[str, str] | None = None
    payload: bytes | bytearray | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _json_request(body: Any, params: dict[str, str] | None) -> _Request:
    if body is None:
        return _Request(params)
    return _Request(params, json.dumps(body).encode("utf-8"), {"Content-Type": "application/json"})


def _batch_request(partition: int, records: Sequence[Record | bytes], acks: str) -> _Request:
    params = {"partition": str(partition), "acks": acks}
    headers = {"Content-Type": BATCH_CONTENT_TYPE}
    # The bytearray the batch was built in goes out as it is: no copy of the values into bytes.
    return _Request(params, build_batch_buffer(records), headers)


def _values_request(
    partition: int, values: Sequence[bytes | str | None], key: bytes | str | None, acks: str
) -> _Request:
    if not values:
        raise ValueError("a batch needs at least one value")
    items: Sequence[Record | bytes]
    if key is None and set(map(type, values)) == {bytes}:
        items = values  # type: ignore[assignment]  # build_batch_buffer takes plain values as is
    else:
        raw_key = _as_bytes(key)
        items = [Record(_as_bytes(value), raw_key) for value in values]
    return _batch_request(partition, items, acks)


def _batch_acked(answer: dict[str, Any], partition: int, count: int) -> BatchAcked:
    if "base_offset" not in answer:  # acks=none
        return BatchAcked(partition, None, count)
    return BatchAcked(int(answer["partition"]), int(answer["base_offset"]), int(answer["count"]))


def _batch_acks(answer: dict[str, Any]) -> list[Acked]:
    if "base_offset" not in answer:  # acks=none
        return []
    partition, base = int(answer["partition"]), int(answer["base_offset"])
    return [Acked(partition, base + i) for i in range(int(answer["count"]))]


def _fetch_request(
    wire: str, offset: int | str, max_messages: int, max_bytes: int, wait_ms: int
) -> _Request:
    params = _fetch_params(offset, max_messages, max_bytes, wait_ms)
    return _Request(params, headers={"Accept": BATCH_CONTENT_TYPE} if wire == "batch" else {})


def _is_batch_answer(answer: _Answer) -> bool:
    """Whole batches, or JSON (what a node that forwarded the fetch answers)."""
    return answer.headers.get("content-type", "").split(";")[0] == BATCH_CONTENT_TYPE


def _answer_records(
    answer: _Answer, offset: int | str, max_messages: int, values: bool = False
) -> tuple[list[list[Any]], int, int, int]:
    """A batch answer's data records (with `values`, only their values) from `offset` on, at
    most max_messages, one list per batch; then the next offset to fetch, the log start offset
    and the high watermark."""
    headers = answer.headers
    next_offset = int(headers["raftline-next-offset"])
    log_start = int(headers["raftline-log-start-offset"])
    high_watermark = int(headers["raftline-high-watermark"])
    # The node resolved earliest/latest; batches it returned for "latest" start after it anyway.
    start = offset if isinstance(offset, int) else log_start
    chunks: list[list[Any]] = []
    room = max_messages
    view = memoryview(answer.raw)
    for position, header in iter_headers(view):
        if header.is_control:
            continue
        whole = view[position : position + header.size]
        if values and header.base_offset >= start and header.records_count <= room:
            chunks.append(batch_values(whole, header))  # all of it: no record objects needed
            room -= header.records_count
            continue
        records = decode_batch(whole).records
        if header.base_offset < start:  # only the first batch may begin before it
            records = [r for r in records if r.offset >= start]
        if len(records) > room:  # whole batches came; keep the asked number
            kept = records[:room]
            chunks.append(list(map(_value_of, kept)) if values else kept)
            return chunks, records[room].offset, log_start, high_watermark
        chunks.append(list(map(_value_of, records)) if values else records)
        room -= len(records)
    return chunks, next_offset, log_start, high_watermark


def _message(partition: int, record: DecodedRecord) -> Message:
    headers = {
        name: None if value is None else value.decode("utf-8", "replace")
        for name, value in record.headers
    }
    return Message(partition, record.offset, record.timestamp, record.key, record.value, headers)


def _fetch_answer(
    answer: _Answer, partition: int, offset: int | str, max_messages: int
) -> FetchResult:
    """A fetch answer in either format as Messages."""
    if not _is_batch_answer(answer):
        return parse_fetch(answer.json())
    chunks, next_offset, log_start, high_watermark = _answer_records(answer, offset, max_messages)
    messages = [_message(partition, record) for records in chunks for record in records]
    return FetchResult(messages, next_offset, log_start, high_watermark)


def _fetched_values(answer: _Answer, offset: int | str, max_messages: int) -> FetchedValues:
    """The values of a fetch answer in either format, at most max_messages of them."""
    if not _is_batch_answer(answer):
        result = parse_fetch(answer.json())
        values = [m.value for m in result.messages]
        return FetchedValues(
            values, result.next_offset, result.log_start_offset, result.high_watermark
        )
    chunks, next_offset, log_start, high_watermark = _answer_records(
        answer, offset, max_messages, values=True
    )
    values: list[bytes | None] = []
    for chunk in chunks:
        values += chunk
    return FetchedValues(values, next_offset, log_start, high_watermark)


def _fetch_params(
    offset: int | str, max_messages: int, max_bytes: int, wait_ms: int
) -> dict[str, str]:
    return {
        "offset": str(offset),
        "max_messages": str(max_messages),
        "max_bytes": str(max_bytes),
        "wait_ms": str(wait_ms),
    }


def _topic_path(topic: str, *rest: str) -> str:
    return "/".join(["/v1/topics", urllib.parse.quote(topic, safe=""), *rest])


def _messages_path(topic: str, partition: int | None = None) -> str:
    """Produce goes to the topic; fetch names its partition."""
    if partition is None:
        return _topic_path(topic, "messages")
    return _topic_path(topic, "partitions", str(partition), "messages")


def _topic_body(
    name: str, partitions: int, replication_factor: int | None, config: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "partitions": partitions}
    if replication_factor is not None:
        body["replication_factor"] = replication_factor
    if config:
        body["config"] = config
    return body


def _json_acks(answer: dict[str, Any]) -> list[Acked]:
    return [Acked(int(o["partition"]), int(o["offset"])) for o in answer.get("offsets", [])]


@dataclass(slots=True)
class RetryPolicy:
    """Exponential backoff with jitter for retryable errors. A retried produce whose first try
    reached the leader may be written twice (no idempotent producer yet)."""

    retries: int = 5
    backoff_ms: int = 100
    max_backoff_ms: int = 2000

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        base = min(self.max_backoff_ms, self.backoff_ms * 2**attempt) / 1000
        if retry_after is not None:
            base = min(max(base, retry_after), self.max_backoff_ms / 1000)
        return base * random.uniform(0.5, 1.0)


def _retry_after(error: RaftlineError) -> float | None:
    # Leader elections typically settle well under a second; the header's 1 s is an upper bound.
    return 0.2 if error.code == "leader_unavailable" else None


def _backoff(policy: RetryPolicy, error: RaftlineError, attempt: int) -> float:
    """Seconds to wait before retrying after `error`; re-raises it when no retry is due."""
    if not error.retryable or attempt >= policy.retries:
        raise error
    return policy.delay(attempt, _retry_after(error))


class _Metadata:
    """Partition counts and leaders of topics, and the HTTP address of every node."""

    def __init__(self) -> None:
        self.partitions: dict[str, int] = {}
        self.leaders: dict[tuple[str, int], int | None] = {}
        self.nodes: dict[int, str] = {}
        self.expires: dict[str, float] = {}
        # Leader URLs this client could not connect to (a node may advertise an address only
        # its peers reach, as in docker-compose): skipped until the next update.
        self.unreachable: set[str] = set()

    def fresh(self, topic: str) -> bool:
        return self.expires.get(topic, 0.0) > time.monotonic()

    def update(self, description: dict[str, Any], cluster: dict[str, Any]) -> None:
        topic = description["name"]
        self.partitions[topic] = len(description["partitions"])
        for part in description["partitions"]:
            self.leaders[(topic, int(part["partition"]))] = part.get("leader")
        self.nodes = {
            int(n["id"]): str(n["http"]) for n in cluster.get("nodes", []) if n.get("http")
        }
        self.expires[topic] = time.monotonic() + METADATA_TTL_S
        self.unreachable.clear()

    def invalidate(self, topic: str) -> None:
        self.expires.pop(topic, None)

    def leader_url(self, topic: str, partition: int) -> str | None:
        leader = self.leaders.get((topic, partition))
        address = self.nodes.get(leader) if leader is not None else None
        url = f"http://{address}" if address else None
        return None if url in self.unreachable else url


class _Partitioner:
    """Explicit partition > murmur2 of the key > one sticky partition until its batch is sent."""

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}
        self._counter = itertools.count(random.randrange(1 << 16))

    def choose(
        self, topic: str, partitions: int, key: bytes | str | None, partition: int | None
    ) -> int:
        if partition is not None:
            return partition
        if key is not None:
            raw = key.encode("utf-8") if isinstance(key, str) else key
            return partition_for_key(raw, partitions)
        if topic not in self._sticky:
            self._sticky[topic] = next(self._counter) % partitions
        return self._sticky[topic]

    def batch_sent(self, topic: str) -> None:
        self._sticky.pop(topic, None)


def _queued_message(
    wire: str,
    value: bytes | str | None,
    key: bytes | str | None,
    partition: int,
    headers: dict[str, str] | None,
    timestamp: int | None,
) -> dict[str, Any] | Record:
    """What a producer queues for one message: a record for its own batch, or a JSON object."""
    if wire == "batch":
        return encode_record(value, key, headers=headers, timestamp=timestamp)
    return encode_message(value, key, partition=partition, headers=headers, timestamp=timestamp)


@dataclass(slots=True)
class _Pending:
    message: Any  # a Record (wire "batch") or a JSON message object (wire "json")
    size: int
    future: Any  # concurrent.futures.Future or asyncio.Future of Acked


def _settle(batch: list[_Pending], acked: list[Acked]) -> None:
    # A caller may have cancelled a future meanwhile; its message was sent all the same.
    for pending, where in itertools.zip_longest(batch, acked):
        if not pending.future.done():
            pending.future.set_result(where)


def _fail(batch: list[_Pending], error: BaseException) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)


class _Accumulator:
    """Messages waiting per partition; a batch is ready when full or older than linger_ms."""

    def __init__(self, linger_ms: float, batch_bytes: int, batch_messages: int) -> None:
        self.linger_s = linger_ms / 1000
        self.batch_bytes = batch_bytes
        self.batch_messages = batch_messages
        self.batches: dict[int, list[_Pending]] = {}
        self.started: dict[int, float] = {}
        self.sizes: dict[int, int] = {}  # bytes queued per partition, kept as messages arrive
        self.queued = 0

    def add(self, partition: int, pending: _Pending) -> bool:
        """Queue one message; True when its partition's batch became full."""
        batch = self.batches.setdefault(partition, [])
        if not batch:
            self.started[partition] = time.monotonic()
            self.sizes[partition] = 0
        batch.append(pending)
        self.sizes[partition] += pending.size
        self.queued += 1
        return self._full(partition)

    def _full(self, partition: int) -> bool:
        return (
            len(self.batches[partition]) >= self.batch_messages
            or self.sizes[partition] >= self.batch_bytes
        )

    def next_deadline(self) -> float | None:
        return min((t + self.linger_s for t in self.started.values()), default=None)

    def drain(self, everything: bool) -> list[tuple[int, list[_Pending]]]:
        now = time.monotonic()
        ready = [
            p
            for p in self.batches
            if everything or self._full(p) or now >= self.started[p] + self.linger_s
        ]
        out = [(p, self.batches.pop(p)) for p in ready]
        for p, batch in out:
            self.started.pop(p, None)
            self.sizes.pop(p, None)
            self.queued -= len(batch)
        return out

    def __len__(self) -> int:
        return self.queued


class _ProducerBatches:
    """The I/O-free part of both producers: partition choice, queued messages, ready batches."""

    def __init__(
        self, topic: str, wire: str, linger_ms: float, batch_bytes: int, batch_messages: int
    ) -> None:
        self.topic = topic
        self.wire = wire
        self._partitioner = _Partitioner()
        self._accumulator = _Accumulator(linger_ms, batch_bytes, batch_messages)

    @property
    def linger_s(self) -> float:
        return self._accumulator.linger_s

    def add(
        self,
        partitions: int,
        value: bytes | str | None,
        key: bytes | str | None,
        partition: int | None,
        headers: dict[str, str] | None,
        timestamp: int | None,
        future: Any,
    ) -> bool:
        """Queue one message for `future`; True when its partition's batch became full."""
        chosen = self._partitioner.choose(self.topic, partitions, key, partition)
        message = _queued_message(self.wire, value, key, chosen, headers, timestamp)
        size = len(value or b"") + len(key or b"") + 64
        full = self._accumulator.add(chosen, _Pending(message, size, future))
        if full:
            self._partitioner.batch_sent(self.topic)
        return full

    def partition_of_batch(
        self, partitions: int, key: bytes | str | None, partition: int | None
    ) -> int:
        """The partition of a whole batch from send_batch; the next keyless one picks anew."""
        chosen = self._partitioner.choose(self.topic, partitions, key, partition)
        self._partitioner.batch_sent(self.topic)
        return chosen

    def drain(self, everything: bool) -> list[tuple[int, list[_Pending]]]:
        """Batches ready to send (all when `everything`); keyless messages then pick anew."""
        batches = self._accumulator.drain(everything)
        if batches:
            self._partitioner.batch_sent(self.topic)
        return batches

    def next_deadline(self) -> float | None:
        return self._accumulator.next_deadline()

    def __len__(self) -> int:
        return len(self._accumulator)


class _ClientCore:
    """The I/O-free state of both clients: bootstrap nodes, retry policy, body format, metadata."""

    def __init__(self, url: str, retry: RetryPolicy | None, wire: str) -> None:
        keep_large_buffers()  # batches of large messages: no fresh pages per buffer
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        self.retry = retry or RetryPolicy()
        self.wire = _checked_wire(wire)
        self.metadata = _Metadata()
        self._current = 0

    def _base_url(self, url: str | None) -> str:
        return url or self.urls[self._current % len(self.urls)]

    def _unreachable(self, url: str | None, base: str, exc: BaseException) -> RaftlineError:
        if url is None:
            self._current += 1  # next bootstrap node on the next try
        else:
            self.metadata.unreachable.add(url)  # ask the bootstrap nodes instead
        return _connection_error(base, exc)

    @staticmethod
    def _answer(status: int, headers: dict[str, str], raw: bytes) -> _Answer:
        """A successful answer; raises the error an HTTP error status carries."""
        if status >= 400:
            raise _error_from(status, raw)
        return _Answer(headers, raw)


def _checked_wire(wire: str) -> str:
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
    return wire


# ---- sync --------------------------------------------------------------------------------


class _ConnectionPool:
    """Idle keep-alive http.client connections per host, shared by threads."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def request(
        self,
        url: str,
        method: str,
        path: str,
        body: bytes | bytearray | None,
        headers: dict[str, str],
    ) -> tuple[int, dict[str, str], bytes]:
        parsed = urllib.parse.urlsplit(url)
        host = parsed.netloc
        for reused in (True, False):
            connection = self._take(host) if reused else None
            fresh = connection is None
            if connection is None:
                connection = http.client.HTTPConnection(host, timeout=self.timeout)
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                raw = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                if fresh:
                    raise
                continue  # a stale idle connection the server had closed: once more, fresh
            except BaseException:
                connection.close()
                raise
            if response.will_close:
                connection.close()
            else:
                self._give(host, connection)
            return response.status, dict(response.getheaders()), raw
        raise ConnectionError(f"{url}: no connection")

    def _take(self, host: str) -> http.client.HTTPConnection | None:
        with self._lock:
            idle = self._idle.get(host)
            return idle.pop() if idle else None

    def _give(self, host: str, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.setdefault(host, []).append(connection)

    def close(self) -> None:
        with self._lock:
            for idle in self._idle.values():
                for connection in idle:
                    connection.close()
            self._idle.clear()


class Client(_ClientCore):
    """Blocking client. `url` may list several nodes separated by commas (bootstrap order)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        wire: str = "batch",
    ) -> None:
        super().__init__(url, retry, wire)
        self._pool = _ConnectionPool(timeout)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _once(self, method: str, path: str, request: _Request, url: str | None) -> _Answer:
        base = self._base_url(url)
        params = request.params
        target = path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            status, headers, raw = self._pool.request(
                base, method, target, request.payload, request.headers
            )
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(url, base, exc) from exc
        return self._answer(status, {name.lower(): value for name, value in headers.items()}, raw)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        url: str | None = None,
    ) -> Any:
        """One JSON request with retries on retryable errors; raises RaftlineError."""
        return self.exchange(method, path, _json_request(body, params), url).json()

    def exchange(
        self, method: str, path: str, request: _Request, url: str | None = None
    ) -> _Answer:
        """One request of any body format, with retries on retryable errors."""
        for attempt in itertools.count():
            try:
                return self._once(method, path, request, url)
            except RaftlineError as error:
                time.sleep(_backoff(self.retry, error, attempt))
                url = None  # after a failure, ask any node (it forwards to the leader)
        raise AssertionError("unreachable")

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = _topic_body(name, partitions, replication_factor, config)
        return self.call("POST", "/v1/topics", body)

    def list_topics(self) -> list[dict[str, Any]]:
        return self.call("GET", "/v1/topics")["topics"]

    def describe_topic(self, name: str) -> dict[str, Any]:
        return self.call("GET", _topic_path(name))

    def delete_topic(self, name: str) -> None:
        self.call("DELETE", _topic_path(name))

    def cluster(self) -> dict[str, Any]:
        return self.call("GET", "/v1/cluster")

    def produce(
        self, topic: str, messages: list[dict[str, Any]], acks: str = "all", url: str | None = None
    ) -> list[Acked]:
        """Send already-encoded messages (see encode_message) in one request."""
        body = {"acks": acks, "messages": messages}
        return _json_acks(self.call("POST", _messages_path(topic), body, url=url))

    def produce_records(
        self,
        topic: str,
        partition: int,
        records: list[Record],
        acks: str = "all",
        url: str | None = None,
    ) -> list[Acked]:
        """Send records (see encode_record) to one partition as one batch built here."""
        request = _batch_request(partition, records, acks)
        answer = self.exchange("POST", _messages_path(topic), request, url)
        return _batch_acks(answer.json())

    def produce_batch(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | str | None],
        acks: str = "all",
        *,
        key: bytes | str | None = None,
        url: str | None = None,
    ) -> BatchAcked:
        """Send values (all with `key`) to one partition as one record batch (whatever the
        wire); one answer for all."""
        request = _values_request(partition, values, key, acks)
        answer = self.exchange("POST", _messages_path(topic), request, url)
        return _batch_acked(answer.json(), partition, len(values))

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int | str = "earliest",
        *,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
        url: str | None = None,
    ) -> FetchResult:
        answer = self.exchange(
            "GET",
            _messages_path(topic, partition),
            _fetch_request(self.wire, offset, max_messages, max_bytes, wait_ms),
            url,
        )
        return _fetch_answer(answer, partition, offset, max_messages)

    def fetch_values(
        self,
        topic: str,
        partition: int,
        offset: int | str = "earliest",
        *,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
        url: str | None = None,
    ) -> FetchedValues:
        """As fetch, but only the values: no Message per record. `url` names the node to ask
        (consumers give the partition leader: a forwarded fetch comes back as JSON)."""
        answer = self.exchange(
            "GET",
            _messages_path(topic, partition),
            _fetch_request(self.wire, offset, max_messages, max_bytes, wait_ms),
            url,
        )
        return _fetched_values(answer, offset, max_messages)

    def refresh_metadata(self, topic: str) -> None:
        self.metadata.update(self.describe_topic(topic), self.cluster())

    def partition_count(self, topic: str) -> int:
        if not self.metadata.fresh(topic):
            self.refresh_metadata(topic)
        return self.metadata.partitions[topic]

    def producer(self, topic: str, **options: Any) -> Producer:
        return Producer(self, topic, **options)

    def consumer(self, topic: str, **options: Any) -> Consumer:
        return Consumer(self, topic, **options)


class Producer:
    """Batches messages per partition (linger_ms, batch_bytes) and sends each batch to the
    partition leader from a background thread. send() returns a Future of Acked."""

    def __init__(
        self,
        client: Client,
        topic: str,
        *,
        acks: str = "all",
        linger_ms: float = 5,
        batch_bytes: int = 256 * 1024,
        batch_messages: int = 1000,
    ) -> None:
        self.client = client
        self.topic = topic
        self.acks = acks
        self._batches = _ProducerBatches(topic, client.wire, linger_ms, batch_bytes, batch_messages)
        self._wake = threading.Condition()
        self._closed = False
        self._in_flight = 0
        self._flush_requested = False
        # Whole batches from send_batch, sent by the thread after the messages queued before.
        self._whole: list[tuple[int, Sequence[bytes | str | None], Any, Any]] = []
        self._thread = threading.Thread(target=self._run, name="raftline-producer", daemon=True)
        self._thread.start()

    def send(
        self,
        value: bytes | str | None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        timestamp: int | None = None,
    ) -> concurrent.futures.Future[Acked]:
        partitions = self.client.partition_count(self.topic)
        future: concurrent.futures.Future[Acked] = concurrent.futures.Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("producer is closed")
            self._batches.add(partitions, value, key, partition, headers, timestamp, future)
            self._wake.notify()
        return future

    def send_batch(
        self,
        values: Sequence[bytes | str | None],
        *,
        partition: int | None = None,
        key: bytes | str | None = None,
    ) -> concurrent.futures.Future[BatchAcked]:
        """Send `values` (all with `key`) to one partition as one batch, without linger;
        returns one Future of BatchAcked for the whole batch, failed if the batch is."""
        if not values:
            raise ValueError("a batch needs at least one value")
        partitions = self.client.partition_count(self.topic)
        future: concurrent.futures.Future[BatchAcked] = concurrent.futures.Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("producer is closed")
            chosen = self._batches.partition_of_batch(partitions, key, partition)
            self._whole.append((chosen, values, key, future))
            self._wake.notify()
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait for the answers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wake:
            self._flush_requested = True
            self._wake.notify()
            while len(self._batches) or self._whole or self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("flush timed out")
                self._wake.wait(remaining)

    def close(self) -> None:
        self.flush()
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            with self._wake:
                while True:
                    # Messages queued before a whole batch leave before it.
                    everything = self._flush_requested or self._closed or bool(self._whole)
                    batches = self._batches.drain(everything)
                    whole, self._whole = self._whole, []
                    if batches or whole or (self._closed and not len(self._batches)):
                        break
                    deadline = self._batches.next_deadline()
                    self._wake.wait(None if deadline is None else deadline - time.monotonic())
                self._flush_requested = False
                self._in_flight += len(batches) + len(whole)
                if not batches and not whole:
                    return
            for partition, batch in batches:
                self._send_batch(partition, batch)
                self._sent_one()
            for item in whole:
                self._send_values(*item)
                self._sent_one()

    def _sent_one(self) -> None:
        with self._wake:
            self._in_flight -= 1
            self._wake.notify_all()

    def _send_batch(self, partition: int, batch: list[_Pending]) -> None:
        messages = [p.message for p in batch]

        def produce(url: str | None) -> list[Acked]:
            if self.client.wire == "batch":
                return self.client.produce_records(
                    self.topic, partition, messages, self.acks, url=url
                )
            return self.client.produce(self.topic, messages, self.acks, url=url)

        try:
            acked = self._to_leader(partition, produce)
        except Exception as exc:
            _fail(batch, exc)
            return
        _settle(batch, acked)

    def _send_values(
        self,
        partition: int,
        values: Sequence[bytes | str | None],
        key: bytes | str | None,
        future: concurrent.futures.Future[BatchAcked],
    ) -> None:
        try:
            acked = self._to_leader(
                partition,
                lambda url: self.client.produce_batch(
                    self.topic, partition, values, self.acks, key=key, url=url
                ),
            )
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(acked)

    def _to_leader(self, partition: int, produce: Callable[[str | None], _T]) -> _T:
        """Run `produce` against the partition's leader; a retryable failure drops the
        metadata so that the next batch looks the leader up again."""
        if not self.client.metadata.fresh(self.topic):
            self.client.refresh_metadata(self.topic)
        try:
            return produce(self.client.metadata.leader_url(self.topic, partition))
        except RaftlineError as error:
            if error.retryable:
                self.client.metadata.invalidate(self.topic)
            raise


class _Positions:
    """Per-partition next offsets of a consumer and which partition long-polls next."""

    def __init__(self, partitions: list[int], start: int | str) -> None:
        self.next: dict[int, int | str] = dict.fromkeys(partitions, start)
        self._turn = itertools.cycle(partitions)

    def advance(self, partition: int, result: FetchResult | FetchedValues) -> None:
        self.next[partition] = result.next_offset

    def long_poll_partition(self) -> int:
        return next(self._turn)


class Consumer:
    """Reads partitions of a topic by offset; iterating long-polls forever."""

    def __init__(
        self,
        client: Client,
        topic: str,
        *,
        partitions: list[int] | None = None,
        offset: int | str = "earliest",
        wait_ms: int = 1000,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
    ) -> None:
        self.client = client
        self.topic = topic
        chosen = (
            partitions if partitions is not None else list(range(client.partition_count(topic)))
        )
        self.positions = _Positions(chosen, offset)
        self.wait_ms = wait_ms
        self.max_messages = max_messages
        self.max_bytes = max_bytes

    def _fetch(self, partition: int, wait_ms: int, values: bool) -> list[Any]:
        fetch = self.client.fetch_values if values else self.client.fetch
        metadata = self.client.metadata
        if not metadata.fresh(self.topic):
            self.client.refresh_metadata(self.topic)
        try:
            result = fetch(
                self.topic,
                partition,
                self.positions.next[partition],
                max_messages=self.max_messages,
                max_bytes=self.max_bytes,
                wait_ms=wait_ms,
                url=metadata.leader_url(self.topic, partition),
            )
        except RaftlineError as error:
            if error.retryable:  # the leader may have moved: look it up again next time
                metadata.invalidate(self.topic)
            raise
        self.positions.advance(partition, result)
        return result.values if isinstance(result, FetchedValues) else result.messages

    def _poll(self, values: bool) -> list[Any]:
        if len(self.positions.next) == 1:  # its long poll answers at once when data is there
            return self._fetch(self.positions.long_poll_partition(), self.wait_ms, values)
        found = [m for p in list(self.positions.next) for m in self._fetch(p, 0, values)]
        if found or self.wait_ms == 0:
            return found
        return self._fetch(self.positions.long_poll_partition(), self.wait_ms, values)

    def poll(self) -> list[Message]:
        """Whatever is available on every partition; long-polls one partition when none has any."""
        return self._poll(values=False)

    def poll_values(self) -> list[bytes | None]:
        """As poll, but only the values in offset order per partition (no Message objects).
        Decoding still makes a few objects per record: at hundreds of thousands of messages a
        second, raise the collector's thresholds (gc.set_threshold) in the consuming process."""
        return self._poll(values=True)

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield from self.poll()


# ---- asyncio -----------------------------------------------------------------------------


class AsyncClient(_ClientCore):
    """asyncio client over one aiohttp ClientSession (keep-alive connections are reused)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        wire: str = "batch",
    ) -> None:
        super().__init__(url, retry, wire)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _once(self, method: str, path: str, request: _Request, url: str | None) -> _Answer:
        base = self._base_url(url)
        try:
            async with self._http().request(
                method,
                base + path,
                data=request.payload,
                params=request.params,
                headers=request.headers,
            ) as response:
                raw = await read_whole_body(response.content, response.content_length)
                status = response.status
                headers = {name.lower(): value for name, value in response.headers.items()}
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._unreachable(url, base, exc) from exc
        return self._answer(status, headers, raw)

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        url: str | None = None,
    ) -> Any:
        """One JSON request with retries on retryable errors; raises RaftlineError."""
        return (await self.exchange(method, path, _json_request(body, params), url)).json()

    async def exchange(
        self, method: str, path: str, request: _Request, url: str | None = None
    ) -> _Answer:
        """One request of any body format, with retries on retryable errors."""
        for attempt in itertools.count():
            try:
                return await self._once(method, path, request, url)
            except RaftlineError as error:
                await asyncio.sleep(_backoff(self.retry, error, attempt))
                url = None  # after a failure, ask any node (it forwards to the leader)
        raise AssertionError("unreachable")

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = _topic_body(name, partitions, replication_factor, config)
        return await self.call("POST", "/v1/topics", body)

    async def list_topics(self) -> list[dict[str, Any]]:
        return (await self.call("GET", "/v1/topics"))["topics"]

    async def describe_topic(self, name: str) -> dict[str, Any]:
        return await self.call("GET", _topic_path(name))

    async def delete_topic(self, name: str) -> None:
        await self.call("DELETE", _topic_path(name))

    async def cluster(self) -> dict[str, Any]:
        return await self.call("GET", "/v1/cluster")

    async def produce(
        self, topic: str, messages: list[dict[str, Any]], acks: str = "all", url: str | None = None
    ) -> list[Acked]:
        body = {"acks": acks, "messages": messages}
        return _json_acks(await self.call("POST", _messages_path(topic), body, url=url))

    async def produce_records(
        self,
        topic: str,
        partition: int,
        records: list[Record],
        acks: str = "all",
        url: str | None = None,
    ) -> list[Acked]:
        """Send records (see encode_record) to one partition as one batch built here."""
        request = _batch_request(partition, records, acks)
        answer = await self.exchange("POST", _messages_path(topic), request, url)
        return _batch_acks(answer.json())

    async def produce_batch(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | str | None],
        acks: str = "all",
        *,
        key: bytes | str | None = None,
        url: str | None = None,
    ) -> BatchAcked:
        """Send values (all with `key`) to one partition as one record batch (whatever the
        wire); one answer for all."""
        request = _values_request(partition, values, key, acks)
        answer = await self.exchange("POST", _messages_path(topic), request, url)
        return _batch_acked(answer.json(), partition, len(values))

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int | str = "earliest",
        *,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
        url: str | None = None,
    ) -> FetchResult:
        answer = await self.exchange(
            "GET",
            _messages_path(topic, partition),
            _fetch_request(self.wire, offset, max_messages, max_bytes, wait_ms),
            url,
        )
        return _fetch_answer(answer, partition, offset, max_messages)

    async def fetch_values(
        self,
        topic: str,
        partition: int,
        offset: int | str = "earliest",
        *,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
        url: str | None = None,
    ) -> FetchedValues:
        """As fetch, but only the values: no Message per record. `url` names the node to ask
        (consumers give the partition leader: a forwarded fetch comes back as JSON)."""
        answer = await self.exchange(
            "GET",
            _messages_path(topic, partition),
            _fetch_request(self.wire, offset, max_messages, max_bytes, wait_ms),
            url,
        )
        return _fetched_values(answer, offset, max_messages)

    async def refresh_metadata(self, topic: str) -> None:
        self.metadata.update(await self.describe_topic(topic), await self.cluster())

    async def partition_count(self, topic: str) -> int:
        if not self.metadata.fresh(topic):
            await self.refresh_metadata(topic)
        return self.metadata.partitions[topic]

    def producer(self, topic: str, **options: Any) -> AsyncProducer:
        return AsyncProducer(self, topic, **options)

    def consumer(self, topic: str, **options: Any) -> AsyncConsumer:
        return AsyncConsumer(self, topic, **options)


class AsyncProducer:
    """asyncio twin of Producer: `await send(...)` queues and returns a Future of Acked."""

    def __init__(
        self,
        client: AsyncClient,
        topic: str,
        *,
        acks: str = "all",
        linger_ms: float = 5,
        batch_bytes: int = 256 * 1024,
        batch_messages: int = 1000,
    ) -> None:
        self.client = client
        self.topic = topic
        self.acks = acks
        self._batches = _ProducerBatches(topic, client.wire, linger_ms, batch_bytes, batch_messages)
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Task[None]] = set()

    async def send(
        self,
        value: bytes | str | None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        timestamp: int | None = None,
    ) -> asyncio.Future[Acked]:
        metadata = self.client.metadata
        if metadata.fresh(self.topic):  # skips a coroutine per message on the common path
            partitions = metadata.partitions[self.topic]
        else:
            partitions = await self.client.partition_count(self.topic)
        future: asyncio.Future[Acked] = asyncio.get_running_loop().create_future()
        if self._batches.add(partitions, value, key, partition, headers, timestamp, future):
            self._dispatch(everything=False)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._batches.linger_s, self._dispatch, False
            )
        return future

    async def send_batch(
        self,
        values: Sequence[bytes | str | None],
        *,
        partition: int | None = None,
        key: bytes | str | None = None,
    ) -> asyncio.Future[BatchAcked]:
        """Send `values` (all with `key`) to one partition as one batch, at once and without
        linger; returns one Future of BatchAcked for the whole batch, failed if the batch is."""
        if not values:
            raise ValueError("a batch needs at least one value")
        partitions = await self.client.partition_count(self.topic)
        chosen = self._batches.partition_of_batch(partitions, key, partition)
        if len(self._batches):  # messages queued before this batch leave before it
            self._dispatch(everything=True)
        future: asyncio.Future[BatchAcked] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._send_values(chosen, values, key, future))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return future

    async def _send_values(
        self,
        partition: int,
        values: Sequence[bytes | str | None],
        key: bytes | str | None,
        future: asyncio.Future[BatchAcked],
    ) -> None:
        try:
            acked = await self._to_leader(
                partition,
                lambda url: self.client.produce_batch(
                    self.topic, partition, values, self.acks, key=key, url=url
                ),
            )
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(acked)

    async def _to_leader(
        self, partition: int, produce: Callable[[str | None], Awaitable[_T]]
    ) -> _T:
        """Run `produce` against the partition's leader; a retryable failure drops the
        metadata so that the next batch looks the leader up again."""
        if not self.client.metadata.fresh(self.topic):
            await self.client.refresh_metadata(self.topic)
        try:
            return await produce(self.client.metadata.leader_url(self.topic, partition))
        except RaftlineError as error:
            if error.retryable:
                self.client.metadata.invalidate(self.topic)
            raise

    def _dispatch(self, everything: bool) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batches = self._batches.drain(everything)
        for partition, batch in batches:
            task = asyncio.ensure_future(self._send_batch(partition, batch))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
        deadline = self._batches.next_deadline()
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, deadline - time.monotonic()), self._dispatch, False
            )

    async def _send_batch(self, partition: int, batch: list[_Pending]) -> None:
        messages = [p.message for p in batch]

        def produce(url: str | None) -> Awaitable[list[Acked]]:
            if self.client.wire == "batch":
                return self.client.produce_records(
                    self.topic, partition, messages, self.acks, url=url
                )
            return self.client.produce(self.topic, messages, self.acks, url=url)

        try:
            acked = await self._to_leader(partition, produce)
        except Exception as exc:
            _fail(batch, exc)
            return
        _settle(batch, acked)

    async def flush(self) -> None:
        self._dispatch(everything=True)
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def close(self) -> None:
        await self.flush()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncConsumer:
    """asyncio twin of Consumer; `async for message in consumer` long-polls forever."""

    def __init__(
        self,
        client: AsyncClient,
        topic: str,
        *,
        partitions: list[int] | None = None,
        offset: int | str = "earliest",
        wait_ms: int = 1000,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
    ) -> None:
        self.client = client
        self.topic = topic
        self._partitions = partitions
        self._start = offset
        self._positions: _Positions | None = None
        self.wait_ms = wait_ms
        self.max_messages = max_messages
        self.max_bytes = max_bytes

    async def _ensure_positions(self) -> _Positions:
        if self._positions is None:
            chosen = (
                self._partitions
                if self._partitions is not None
                else list(range(await self.client.partition_count(self.topic)))
            )
            self._positions = _Positions(chosen, self._start)
        return self._positions

    async def _fetch(
        self, positions: _Positions, partition: int, wait_ms: int, values: bool
    ) -> list[Any]:
        fetch = self.client.fetch_values if values else self.client.fetch
        metadata = self.client.metadata
        if not metadata.fresh(self.topic):
            await self.client.refresh_metadata(self.topic)
        try:
            result = await fetch(
                self.topic,
                partition,
                positions.next[partition],
                max_messages=self.max_messages,
                max_bytes=self.max_bytes,
                wait_ms=wait_ms,
                url=metadata.leader_url(self.topic, partition),
            )
        except RaftlineError as error:
            if error.retryable:  # the leader may have moved: look it up again next time
                metadata.invalidate(self.topic)
            raise
        positions.advance(partition, result)
        return result.values if isinstance(result, FetchedValues) else result.messages

    async def _poll(self, values: bool) -> list[Any]:
        positions = await self._ensure_positions()
        waiting = positions.long_poll_partition
        if len(positions.next) == 1:  # its long poll answers at once when data is there
            return await self._fetch(positions, waiting(), self.wait_ms, values)
        found = [
            x for p in list(positions.next) for x in await self._fetch(positions, p, 0, values)
        ]
        if found or self.wait_ms == 0:
            return found
        return await self._fetch(positions, waiting(), self.wait_ms, values)

    async def poll(self) -> list[Message]:
        """Whatever is available on every partition; long-polls one partition when none has any."""
        return await self._poll(values=False)

    async def poll_values(self) -> list[bytes | None]:
        """As poll, but only the values in offset order per partition (no Message objects).
        Decoding still makes a few objects per record: at hundreds of thousands of messages a
        second, raise the collector's thresholds (gc.set_threshold) in the consuming process."""
        return await self._poll(values=True)

    async def __aiter__(self) -> AsyncIterator[Message]:
        while True:
            for message in await self.poll():
                yield message
