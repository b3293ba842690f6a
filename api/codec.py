"""Translation between API messages and Kafka record batches (via raftlog.records).

Owns building one batch per partition from produce messages and decoding fetched batches to JSON.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from raftline.api.errors import ApiError
from raftline.api.validation import ProduceMessage
from raftline.raftlog.batch import HEADER_SIZE, MAX_BATCH_SIZE, CorruptBatchError
from raftline.raftlog.records import Codec, Record, build_batch, iter_batches

# Topic compression.type -> batch codec ("producer": the API is the producer; it sends plain).
CODECS: dict[str, Codec] = {
    "none": Codec.NONE,
    "uncompressed": Codec.NONE,
    "producer": Codec.NONE,
    "gzip": Codec.GZIP,
    "snappy": Codec.SNAPPY,
    "lz4": Codec.LZ4,
    "zstd": Codec.ZSTD,
}


@dataclass(slots=True)
class DecodedFetch:
    messages: list[dict[str, Any]]
    next_offset: int


def encode_batch(messages: list[ProduceMessage], compression: str, now_ms: int) -> bytes:
    """One batch holding `messages` in order (they get consecutive offsets)."""
    # Varint lengths, deltas and attributes: generous upper bounds per record and header.
    bound = HEADER_SIZE + sum(m.size + 40 + 10 * len(m.headers) for m in messages)
    if bound > MAX_BATCH_SIZE:
        raise ApiError(
            "message_too_large",
            f"{len(messages)} messages for one partition exceed the {MAX_BATCH_SIZE}-byte "
            "batch limit; send them in several requests",
        )
    records = [
        Record(value=m.value, key=m.key, headers=tuple(m.headers), timestamp=m.timestamp)
        for m in messages
    ]
    try:
        return build_batch(records, codec=CODECS.get(compression, Codec.NONE), timestamp=now_ms)
    except ValueError as exc:
        raise ApiError("invalid_request", f"messages cannot form a record batch: {exc}") from None


def _text_field(name: str, data: bytes | None) -> dict[str, Any]:
    """`name`: the UTF-8 text (or null); `name_b64` instead when the bytes are not UTF-8."""
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode("ascii")}


def decode_batches(
    batches: list[bytes], partition: int, offset: int, max_messages: int, max_bytes: int
) -> DecodedFetch:
    """Messages at or after `offset` from committed batches, skipping control batches.

    At most `max_messages`; stops once `max_bytes` of payload is reached (always at least one).
    `next_offset` is where the next fetch starts: past the last message returned, or past every
    batch read when none was cut short.
    """
    messages: list[dict[str, Any]] = []
    next_offset = offset
    budget = max_bytes
    try:
        for raw in batches:
            for decoded in iter_batches(raw):
                if decoded.header.is_control:
                    next_offset = max(next_offset, decoded.header.last_offset + 1)
                    continue
                for record in decoded.records:
                    if record.offset < offset:
                        continue
                    size = len(record.key or b"") + len(record.value or b"")
                    if len(messages) >= max_messages or (messages and size > budget):
                        return DecodedFetch(messages, next_offset)
                    budget -= size
                    message: dict[str, Any] = {
                        "partition": partition,
                        "offset": record.offset,
                        "timestamp": record.timestamp,
                    }
                    message.update(_text_field("key", record.key))
                    message.update(_text_field("value", record.value))
                    message["headers"] = {
                        name: value.decode("utf-8", "replace") if value is not None else None
                        for name, value in record.headers
                    }
                    messages.append(message)
                    next_offset = record.offset + 1
                next_offset = max(next_offset, decoded.header.last_offset + 1)
                if len(messages) >= max_messages:  # decoding the next batch would be wasted
                    return DecodedFetch(messages, next_offset)
    except CorruptBatchError as exc:
        raise ApiError(
            "internal_error", f"stored batch failed to decode: {exc}", retryable=True
        ) from None
    return DecodedFetch(messages, next_offset)
