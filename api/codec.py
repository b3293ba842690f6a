"""Translation between API messages and Kafka record batches (via raftlog.records).

Owns building one batch per partition from produce messages, checking batches that producers
built themselves (the binary body), turning fetched batches into JSON or whole batches, and
reading a whole HTTP body (a batch, mostly) with one copy, for the node and the client alike.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import StreamReader

from raftline.api.errors import ApiError, invalid
from raftline.api.validation import ProduceMessage, ProducerFields
from raftline.node.filters import Predicate
from raftline.raftlog.batch import HEADER_SIZE, MAX_BATCH_SIZE, CorruptBatchError, parse_header
from raftline.raftlog.records import Codec, Record, build_batch, check_batch, decode_batch

# Body type of a produce request holding one Kafka v2 record batch that the client built, and of
# a fetch answer holding whole stored batches: the broker neither decodes nor re-encodes them.
BATCH_CONTENT_TYPE = "application/vnd.raftline.batch"
# A produce stream frame's header (api/produce_stream.py): request id, partition; a batch follows.
PRODUCE_FRAME_HEADER = struct.Struct(">QI")

Buffer = bytes | memoryview  # a stored batch: fetches hand out slices of one read

# A topic's compression.type when its config names none: Kafka's default, a batch is stored as
# its producer compressed it (and the HTTP API, producing for JSON bodies, sends it plain).
DEFAULT_COMPRESSION = "producer"

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
    messages: list[Any]  # JSON-ready message objects, or whole batches (select_batches)
    next_offset: int


async def read_whole_body(
    content: StreamReader, declared: int | None, limit: int | None = None
) -> bytes:
    """An HTTP body (`declared`: its Content-Length, if any) copied once out of the chunks it
    arrived in; aiohttp's read() copies a 1 MB batch twice more (into a growing bytearray,
    then into bytes). The socket is not paused while a declared length arrives. A body over
    `limit` bytes raises message_too_large."""
    if limit is not None and declared is not None and declared > limit:
        raise _body_too_large(limit)
    # A declared length of a body that is not decompressed on its way in is all that will be
    # buffered: with aiohttp's limit raised to it, reading never pauses.
    whole = bool(declared) and content.total_compressed_bytes is None
    if declared:
        content.set_read_chunk_size(declared)
    chunks: list[bytes] = []
    size = 0
    # at_eof, not an empty chunk, ends the body: aiohttp's shared empty body answers an empty
    # chunk marked as a chunk end on every read after its first.
    while not content.at_eof():
        if whole and size == content.total_bytes and not content.is_eof():
            # All that arrived is taken: wait once for the rest of the declared length, not
            # once per socket read (~8 for 1 MB). Taking what was buffered first matters: it
            # resumes reading if the buffer passed aiohttp's limit before it was raised here.
            await content.wait_eof()
            continue
        chunk, _ = await content.readchunk()
        size += len(chunk)
        if limit is not None and size > limit:
            raise _body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _body_too_large(limit: int) -> ApiError:
    return ApiError("message_too_large", f"request body exceeds {limit} bytes")


def encode_batch(
    messages: list[ProduceMessage],
    compression: str,
    now_ms: int,
    producer: ProducerFields | None = None,
) -> bytes:
    """One batch holding `messages` in order (they get consecutive offsets); an idempotent
    producer's id, epoch and first sequence go in its header."""
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
    fields: dict[str, Any] = {}
    if producer is not None:
        fields = {
            "producer_id": producer.producer_id,
            "producer_epoch": producer.producer_epoch,
            "base_sequence": producer.sequence,
            "transactional": producer.transactional_id is not None,
        }
    codec = CODECS.get(compression, Codec.NONE)
    try:
        return build_batch(records, codec=codec, timestamp=now_ms, **fields)
    except ValueError as exc:
        raise ApiError("invalid_request", f"messages cannot form a record batch: {exc}") from None


def produced_batch(
    body: bytes, max_message_bytes: int, compression: str, transactional: bool = False
) -> tuple[bytes, int]:
    """The batch to store for a producer-built `body`, and its record count.

    The body is checked as strictly as a fetch would decode it (CRC and every record field),
    so nothing stored can fail to decode later. A record's encoded size counts against
    max.message.bytes. It is stored as sent unless the topic forces another compression.
    """
    try:
        header, largest = check_batch(body)
    except CorruptBatchError as exc:
        raise invalid(f"body is not one valid record batch: {exc}") from None
    if header.is_control:
        raise invalid("producers cannot write control batches")
    if header.is_transactional != transactional:
        raise invalid(
            "a transactional batch goes with the transactional_id query parameter (and only it)"
        )
    if header.records_count != header.offset_count:
        raise invalid("record offset deltas must run 0, 1, 2, ... without gaps")
    if largest > max_message_bytes:
        raise ApiError(
            "message_too_large",
            f"a record of {largest} bytes exceeds the topic's {max_message_bytes} "
            "(max.message.bytes)",
        )
    codec = CODECS.get(compression, Codec.NONE)
    if compression == "producer" or header.codec == codec:
        return body, header.records_count
    records = [
        Record(value=r.value, key=r.key, headers=r.headers, timestamp=r.timestamp)
        for r in decode_batch(body).records
    ]
    rebuilt = build_batch(
        records,
        codec=codec,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.is_transactional,
    )
    return rebuilt, header.records_count


def select_batches(batches: Sequence[Buffer], offset: int, max_messages: int) -> DecodedFetch:
    """Whole data batches holding offsets at or after `offset`, up to the one that reaches
    `max_messages`, read from their headers only. `next_offset` passes every batch read,
    control batches included (they are not returned)."""
    chosen: list[Buffer] = []
    next_offset = offset
    count = 0
    for raw in batches:
        header = parse_header(raw)
        last = header.last_offset
        if last < offset:
            continue
        next_offset = last + 1
        if header.is_control:
            continue
        chosen.append(raw)
        count += last + 1 - max(offset, header.base_offset)
        if count >= max_messages:
            break
    return DecodedFetch(chosen, next_offset)


def _text_or_b64(data: bytes) -> tuple[str, bool]:
    """`data` as UTF-8 text, else in base64 (then True)."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def _put_text(message: dict[str, Any], name: str, data: bytes | None) -> None:
    """`name`: the UTF-8 text (or null); `name_b64` instead when the bytes are not UTF-8."""
    if data is None:
        message[name] = None
        return
    text, is_b64 = _text_or_b64(data)
    message[f"{name}_b64" if is_b64 else name] = text


def _put_headers(message: dict[str, Any], headers: Sequence[tuple[str, bytes | None]]) -> None:
    """`headers`: the UTF-8 (and null) values as text; `headers_b64` beside it, only when some
    values are not UTF-8, holds those in base64 (the way `value` and `value_b64` work)."""
    plain: dict[str, str | None] = {}
    binary: dict[str, str] = {}
    for name, value in headers:
        if value is None:
            plain[name] = None
            continue
        text, is_b64 = _text_or_b64(value)
        (binary if is_b64 else plain)[name] = text
    message["headers"] = plain
    if binary:
        message["headers_b64"] = binary


def binary_headers(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, str | bytes | None]:
    """Headers for msgpack, in one map: the UTF-8 (and null) values as text, the others as
    bytes (what `binary_headers_inline` makes of `headers` and `headers_b64`)."""
    out: dict[str, str | bytes | None] = {}
    for name, value in headers:
        try:
            out[name] = None if value is None else bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            out[name] = bytes(value)
    return out


def binary_headers_inline(body: dict[str, Any]) -> dict[str, Any]:
    """A fetch answer for msgpack: each message's `headers_b64` values as bytes in `headers`
    (msgpack carries bytes as they are). Changes `body` in place and returns it."""
    for message in body.get("messages", ()):
        binary = message.pop("headers_b64", None)
        if binary:
            headers = message.setdefault("headers", {})
            for name, encoded in binary.items():
                headers[name] = base64.b64decode(encoded)
    return body


def decode_batches(
    batches: Sequence[Buffer],
    partition: int,
    offset: int,
    max_messages: int,
    max_bytes: int,
    matches: Predicate | None = None,
) -> DecodedFetch:
    """Messages at or after `offset` from committed batches, skipping control batches.

    At most `max_messages`; stops once `max_bytes` of payload is reached (always at least one).
    `next_offset` is where the next fetch starts: past the last message returned, or past every
    batch read when none was cut short. With `matches` (a filter), records it refuses are
    passed over like control records: not returned, and `next_offset` goes past them.
    """
    messages: list[dict[str, Any]] = []
    next_offset = offset
    budget = max_bytes
    try:
        for raw in batches:
            header = parse_header(raw)
            if header.is_control or header.last_offset < offset:
                # Nothing to return: only the header is read, the records stay packed.
                next_offset = max(next_offset, header.last_offset + 1)
                continue
            for record in decode_batch(raw).records:
                if record.offset < offset:
                    continue
                if matches is not None and not matches(
                    record.key, record.headers, record.timestamp, record.offset
                ):
                    next_offset = record.offset + 1
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
                _put_text(message, "key", record.key)
                _put_text(message, "value", record.value)
                _put_headers(message, record.headers)
                messages.append(message)
                next_offset = record.offset + 1
            next_offset = max(next_offset, header.last_offset + 1)
            if len(messages) >= max_messages:  # decoding the next batch would be wasted
                return DecodedFetch(messages, next_offset)
    except CorruptBatchError as exc:
        raise ApiError(
            "internal_error", f"stored batch failed to decode: {exc}", retryable=True
        ) from None
    return DecodedFetch(messages, next_offset)
