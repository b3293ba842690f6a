"""The HTTP API as the client speaks it: requests built, answers decoded, errors raised.

Owns the request and answer shapes (`Request`, `Answer`), paths, JSON and record-batch bodies,
the client's result types (Message, FetchResult, Acked, ...) and RaftlineError. No I/O here.
"""

from __future__ import annotations

import base64
import json
import operator
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from raftline.api.codec import BATCH_CONTENT_TYPE
from raftline.raftlog.batch import iter_headers
from raftline.raftlog.compression import Codec
from raftline.raftlog.records import (
    DecodedRecord,
    Record,
    batch_values,
    build_batch_buffer,
    decode_batch,
)

WIRES = ("batch", "json")  # body formats of produce and fetch; see raftline.clients.client
_value_of = operator.attrgetter("value")

# A header value: text when it is UTF-8, else the bytes; None for a null header.
HeaderValue = str | bytes | None


class RaftlineError(Exception):
    """An error answer (or a failed connection) carrying the contract's error code.

    `node` is the base URL of the node that answered or could not be reached, when known."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        body: dict[str, Any] | None = None,
        node: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status
        self.body = body or {}
        self.node = node


def error_from(status: int, raw: bytes, node: str | None = None) -> RaftlineError:
    """The error an HTTP error answer carries (its contract body, or the status alone)."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        text = raw[:200].decode("utf-8", "replace")
        return RaftlineError(
            "http_error",
            f"HTTP {status}: {text}",
            retryable=status >= 500,
            status=status,
            node=node,
        )
    return RaftlineError(
        str(error.get("code", "unknown")),
        str(error.get("message", "")),
        retryable=bool(error.get("retryable", False)),
        status=status,
        body=body,
        node=node,
    )


def connection_error(url: str, exc: BaseException) -> RaftlineError:
    return RaftlineError("connection_failed", f"{url}: {exc}", retryable=True, node=url)


@dataclass(slots=True)
class Message:
    """One fetched message. `key`/`value` are bytes (None when absent or a tombstone); header
    values are text when they are UTF-8, else bytes. `topic` is set by group consumers (they
    may read several topics) and None otherwise."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, HeaderValue] = field(default_factory=dict)
    topic: str | None = None

    @property
    def text(self) -> str | None:
        return None if self.value is None else self.value.decode("utf-8", "replace")


@dataclass(slots=True)
class FetchResult:
    messages: list[Message]
    next_offset: int
    log_start_offset: int
    high_watermark: int


class ProducerFields(NamedTuple):
    """An idempotent producer's numbers for one batch: id, epoch, first sequence."""

    producer_id: int
    producer_epoch: int
    sequence: int

    def json_fields(self) -> dict[str, int]:
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "sequence": self.sequence,
        }


def transactional_fields(transactional_id: str | None) -> dict[str, Any]:
    """What a produce request of a transactional producer adds (JSON body fields)."""
    if transactional_id is None:
        return {}
    return {"transactional": True, "transactional_id": transactional_id}


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


@dataclass(slots=True)
class Answer:
    """A successful HTTP answer: headers (lower-case names) and the raw body."""

    headers: dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return orjson.loads(self.raw) if self.raw else {}


@dataclass(slots=True)
class Request:
    """What goes with one HTTP request besides its method and path; `retry=False`: one try
    only (its caller decides what a failure means)."""

    params: dict[str, str] | None = None
    payload: bytes | bytearray | None = None
    headers: dict[str, str] = field(default_factory=dict)
    retry: bool = True


def answer(status: int, headers: dict[str, str], raw: bytes, node: str) -> Answer:
    """A successful answer (`headers` with any case of names); raises the error an HTTP error
    status carries."""
    if status >= 400:
        raise error_from(status, raw, node)
    return Answer({name.lower(): value for name, value in headers.items()}, raw)


def checked_wire(wire: str) -> str:
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
    return wire


# ---- requests ------------------------------------------------------------------------------


def _as_bytes(data: bytes | str | None) -> bytes | None:
    return data.encode("utf-8") if isinstance(data, str) else data


def _text_or_b64(data: bytes | str) -> tuple[str, bool]:
    """`data` as JSON text: itself or its UTF-8 decoding, else base64 (then True)."""
    if isinstance(data, str):
        return data, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def _bytes_field(name: str, data: bytes | str | None) -> dict[str, Any]:
    if data is None:
        return {name: None}
    text, is_b64 = _text_or_b64(data)
    return {f"{name}_b64": text} if is_b64 else {name: text}


def encode_headers(headers: dict[str, str | bytes]) -> dict[str, Any]:
    """`headers` (text or bytes values) as the `headers` / `headers_b64` fields of a message."""
    plain: dict[str, str] = {}
    binary: dict[str, str] = {}
    for name, value in headers.items():
        text, is_b64 = _text_or_b64(value)
        (binary if is_b64 else plain)[name] = text
    fields: dict[str, Any] = {"headers": plain} if plain else {}
    if binary:
        fields["headers_b64"] = binary
    return fields


def encode_message(
    value: bytes | str | None,
    key: bytes | str | None = None,
    *,
    partition: int | None = None,
    headers: dict[str, str | bytes] | None = None,
    timestamp: int | None = None,
) -> dict[str, Any]:
    """The JSON object the produce endpoint takes for one message."""
    message = _bytes_field("value", value)
    if key is not None:
        message.update(_bytes_field("key", key))
    if partition is not None:
        message["partition"] = partition
    if headers:
        message.update(encode_headers(headers))
    if timestamp is not None:
        message["timestamp"] = timestamp
    return message


def encode_record(
    value: bytes | str | None,
    key: bytes | str | None = None,
    *,
    headers: dict[str, str | bytes] | None = None,
    timestamp: int | None = None,
) -> Record:
    """The record a batching producer puts in its own batch for one message."""
    return Record(
        _as_bytes(value),
        _as_bytes(key),
        tuple((name, _as_bytes(v)) for name, v in headers.items()) if headers else (),
        timestamp,
    )


def json_request(body: Any, params: dict[str, str] | None = None) -> Request:
    if body is None:
        return Request(params)
    return Request(params, json.dumps(body).encode("utf-8"), {"Content-Type": "application/json"})


def batch_request(
    partition: int,
    records: Sequence[Record | bytes],
    acks: str,
    codec: int = Codec.NONE,
    producer: ProducerFields | None = None,
    transactional_id: str | None = None,
) -> Request:
    params = {"partition": str(partition), "acks": acks}
    headers = {"Content-Type": BATCH_CONTENT_TYPE}
    fields: dict[str, Any] = {}
    if producer is not None:
        fields = {
            "producer_id": producer.producer_id,
            "producer_epoch": producer.producer_epoch,
            "base_sequence": producer.sequence,
        }
    if transactional_id is not None:
        params["transactional_id"] = transactional_id
        fields["transactional"] = True
    # The bytearray the batch was built in goes out as it is: no copy of the values into bytes.
    return Request(params, build_batch_buffer(records, codec=codec, **fields), headers)


def values_request(
    partition: int,
    values: Sequence[bytes | str | None],
    key: bytes | str | None,
    acks: str,
    codec: int = Codec.NONE,
    producer: ProducerFields | None = None,
    transactional_id: str | None = None,
) -> Request:
    if not values:
        raise ValueError("a batch needs at least one value")
    items: Sequence[Record | bytes]
    if key is None and set(map(type, values)) == {bytes}:
        items = values  # type: ignore[assignment]  # build_batch_buffer takes plain values as is
    else:
        raw_key = _as_bytes(key)
        items = [Record(_as_bytes(value), raw_key) for value in values]
    return batch_request(partition, items, acks, codec, producer, transactional_id)


def fetch_request(
    wire: str,
    offset: int | str,
    max_messages: int,
    max_bytes: int,
    wait_ms: int,
    isolation: str = "read_uncommitted",
) -> Request:
    params = {
        "offset": str(offset),
        "max_messages": str(max_messages),
        "max_bytes": str(max_bytes),
        "wait_ms": str(wait_ms),
    }
    if isolation != "read_uncommitted":
        params["isolation"] = isolation
    return Request(params, headers={"Accept": BATCH_CONTENT_TYPE} if wire == "batch" else {})


def topic_path(topic: str, *rest: str) -> str:
    return "/".join(["/v1/topics", urllib.parse.quote(topic, safe=""), *rest])


def messages_path(topic: str, partition: int | None = None) -> str:
    """Produce goes to the topic; fetch names its partition."""
    if partition is None:
        return topic_path(topic, "messages")
    return topic_path(topic, "partitions", str(partition), "messages")


def produce_stream_path(topic: str) -> str:
    """The topic's produce stream: batches as frames instead of POSTs (clients/produce_streams)."""
    return topic_path(topic, "produce-stream")


TRANSPORTS = ("http", "stream")  # how a producer sends its batches: POSTs, or produce streams


def streams_batches(
    transport: str, wire: str, acks: str, transactional_id: str | None = None
) -> bool:
    """Whether a producer sends its batches on produce streams (`transport="stream"`): record
    batches only, with an answer to wait for, outside transactions (the stream takes none)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if transport == "http":
        return False
    if wire != "batch":
        raise ValueError("transport='stream' sends record batches: it needs wire='batch'")
    if acks not in ("all", "leader"):
        raise ValueError(f'transport="stream" needs acks "all" or "leader", got {acks!r}')
    if transactional_id is not None:
        raise ValueError('a transactional producer sends by POST: drop transport="stream"')
    return True


def group_path(group: str, *rest: str) -> str:
    return "/".join(["/v1/groups", urllib.parse.quote(group, safe=""), *rest])


def member_path(group: str, member_id: str, *rest: str) -> str:
    return group_path(group, "members", urllib.parse.quote(member_id, safe=""), *rest)


def topic_body(
    name: str, partitions: int, replication_factor: int | None, config: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "partitions": partitions}
    if replication_factor is not None:
        body["replication_factor"] = replication_factor
    if config:
        body["config"] = config
    return body


# ---- answers -------------------------------------------------------------------------------


def json_acks(answer: dict[str, Any]) -> list[Acked]:
    return [Acked(int(o["partition"]), int(o["offset"])) for o in answer.get("offsets", [])]


def batch_acks(answer: dict[str, Any]) -> list[Acked]:
    if "base_offset" not in answer:  # acks=none
        return []
    partition, base = int(answer["partition"]), int(answer["base_offset"])
    return [Acked(partition, base + i) for i in range(int(answer["count"]))]


def batch_acked(answer: dict[str, Any], partition: int, count: int) -> BatchAcked:
    if "base_offset" not in answer:  # acks=none
        return BatchAcked(partition, None, count)
    return BatchAcked(int(answer["partition"]), int(answer["base_offset"]), int(answer["count"]))


def _decoded(obj: dict[str, Any], name: str) -> bytes | None:
    if f"{name}_b64" in obj:
        return base64.b64decode(obj[f"{name}_b64"])
    text = obj.get(name)
    return None if text is None else str(text).encode("utf-8")


def _json_headers(obj: dict[str, Any]) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = dict(obj.get("headers") or {})
    for name, encoded in (obj.get("headers_b64") or {}).items():
        headers[name] = base64.b64decode(encoded)
    return headers


def json_message(m: dict[str, Any]) -> Message:
    """One message of a JSON fetch answer (a group fetch's carry their topic)."""
    return Message(
        partition=int(m["partition"]),
        offset=int(m["offset"]),
        timestamp=int(m.get("timestamp") or 0),
        key=_decoded(m, "key"),
        value=_decoded(m, "value"),
        headers=_json_headers(m),
        topic=m.get("topic"),
    )


def parse_fetch(body: dict[str, Any]) -> FetchResult:
    messages = [json_message(m) for m in body.get("messages", [])]
    return FetchResult(
        messages,
        int(body["next_offset"]),
        int(body["log_start_offset"]),
        int(body["high_watermark"]),
    )


def _is_batch_answer(answer: Answer) -> bool:
    """Whole batches, or JSON (what a node that forwarded the fetch answers)."""
    return answer.headers.get("content-type", "").split(";")[0] == BATCH_CONTENT_TYPE


def _answer_records(
    answer: Answer, offset: int | str, max_messages: int, values: bool = False
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


def _header_value(value: bytes | None) -> HeaderValue:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _message(partition: int, record: DecodedRecord) -> Message:
    headers = {name: _header_value(value) for name, value in record.headers}
    return Message(partition, record.offset, record.timestamp, record.key, record.value, headers)


def fetch_answer(
    answer: Answer, partition: int, offset: int | str, max_messages: int
) -> FetchResult:
    """A fetch answer in either format as Messages."""
    if not _is_batch_answer(answer):
        return parse_fetch(answer.json())
    chunks, next_offset, log_start, high_watermark = _answer_records(answer, offset, max_messages)
    messages = [_message(partition, record) for records in chunks for record in records]
    return FetchResult(messages, next_offset, log_start, high_watermark)


def fetched_values(answer: Answer, offset: int | str, max_messages: int) -> FetchedValues:
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
