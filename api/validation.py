"""Parsing and checking of request bodies and query parameters into typed values.

Owns every `invalid_request` decision: types, ranges, topic names, value/value_b64, base64, fields.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

from raftline.api.errors import invalid
from raftline.tiered import topic_config as tiered_config

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
ACKS = ("all", "leader", "none")
MAX_PARTITIONS = 10_000
MAX_REPLICATION_FACTOR = 16
MAX_WAIT_MS = 60_000
DEFAULT_MAX_MESSAGES = 500
MAX_MAX_MESSAGES = 100_000
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
LIMIT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024

MESSAGE_FIELDS = frozenset(
    {"key", "key_b64", "value", "value_b64", "headers", "headers_b64", "partition", "timestamp"}
)
# The shape almost every producer sends; such messages skip the field-by-field checks.
COMMON_MESSAGE_FIELDS = frozenset({"key", "value", "partition"})
PRODUCE_FIELDS = frozenset(
    {
        "acks",
        "messages",
        "producer_id",
        "producer_epoch",
        "sequence",
        "transactional",
        "transactional_id",
    }
)
TRANSACTIONAL_ID = re.compile(r"^[A-Za-z0-9._~:@-]{1,249}$")
END_TXN_FIELDS = frozenset({"producer_id", "producer_epoch"})
PRODUCER_FIELDS = frozenset({"transactional_id", "transaction_timeout_ms"})
MAX_PRODUCER_ID = 2**63 - 1
MAX_PRODUCER_EPOCH = 2**15 - 1
MAX_SEQUENCE = 2**31 - 1
CREATE_FIELDS = frozenset({"name", "partitions", "replication_factor", "config"})

CLEANUP_POLICIES = frozenset({"delete", "compact", "compact,delete", "delete,compact"})
COMPRESSION_TYPES = frozenset({"producer", "none", "uncompressed", "gzip", "snappy", "lz4", "zstd"})
# Kafka topic configs the broker accepts; the value check returns the canonical string or raises.
_INT_AT_LEAST_MINUS_ONE = ("retention.ms", "retention.bytes")


@dataclass(slots=True)
class ProduceMessage:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None
    timestamp: int | None = None

    @property
    def size(self) -> int:
        """Bytes this message adds to a batch, roughly as Kafka counts it (payload only)."""
        size = len(self.key or b"") + len(self.value or b"")
        if self.headers:
            size += sum(len(k) + len(v) for k, v in self.headers)
        return size


@dataclass(frozen=True, slots=True)
class ProducerFields:
    """An idempotent producer's id, epoch and the sequence of the request's first message."""

    producer_id: int
    producer_epoch: int
    sequence: int
    transactional_id: str | None = None  # set: the request writes inside its transaction


@dataclass(slots=True)
class ProduceRequest:
    acks: str
    messages: list[ProduceMessage]
    producer: ProducerFields | None = None


@dataclass(slots=True)
class CreateTopicRequest:
    name: str
    partitions: int
    replication_factor: int | None
    config: dict[str, str]


@dataclass(slots=True)
class FetchRequest:
    offset: int | str  # a number, "earliest" or "latest"
    max_messages: int
    max_bytes: int
    wait_ms: int
    timestamp: int | None = None  # start at the first message at or after this time (ms)
    isolation: str = "read_uncommitted"  # or read_committed: up to the last stable offset


def is_int(value: Any) -> bool:
    # bool is an int subclass in Python; JSON true must not count as 1.
    return isinstance(value, int) and not isinstance(value, bool)


def topic_name(name: Any) -> str:
    if not isinstance(name, str) or not TOPIC_NAME.match(name) or name in (".", ".."):
        raise invalid(
            f"invalid topic name {name!r}: 1-249 characters of [A-Za-z0-9._-], not '.' or '..'"
        )
    return name


def partition_index(text: str) -> int:
    if not text.isdigit() or len(text) > 9:
        raise invalid(f"invalid partition {text!r}: a non-negative integer")
    return int(text)


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid(f"{what} must be an object")
    return body


def _no_unknown(obj: dict[str, Any], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise invalid(f"unknown field(s) in {what}: {', '.join(unknown)}")


def _text_or_bytes(obj: dict[str, Any], plain: str, b64: str, where: str) -> bytes | None:
    """The bytes of `plain` (UTF-8 text, or raw bytes from msgpack) or of `b64` (base64)."""
    if plain in obj and b64 in obj:
        raise invalid(f"{where}: give either {plain} or {b64}, not both")
    if b64 in obj:
        return _base64(obj[b64], f"{where}: {b64}")
    value = obj.get(plain)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(f"{where}: {plain} is not valid UTF-8 text") from None
    if isinstance(value, bytes):
        return value
    raise invalid(f"{where}: {plain} must be a string")


def _base64(encoded: Any, what: str) -> bytes:
    if not isinstance(encoded, str):
        raise invalid(f"{what} must be a base64 string")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{what} is not valid base64") from None


def _headers(raw: Any, raw_b64: Any, where: str) -> list[tuple[str, bytes]]:
    """`headers` (text values, or bytes from msgpack) then `headers_b64` (base64 values, for
    bytes that are not UTF-8); a name may stand in only one of them."""
    headers: list[tuple[str, bytes]] = []
    for field_name, fields in (("headers", raw), ("headers_b64", raw_b64)):
        if fields is None:
            continue
        if not isinstance(fields, dict):
            raise invalid(f"{where}: {field_name} must be an object of string values")
        for name, value in fields.items():
            if not isinstance(name, str):
                raise invalid(f"{where}: header names must be strings")
            if field_name == "headers_b64":
                encoded = _base64(value, f"{where}: headers_b64 {name!r}")
            elif isinstance(value, str):
                encoded = value.encode("utf-8", "surrogatepass")
            elif isinstance(value, bytes):
                encoded = value
            else:
                raise invalid(f"{where}: header {name!r} must have a string value")
            headers.append((name, encoded))
    if raw and raw_b64 and raw.keys() & raw_b64.keys():
        raise invalid(f"{where}: a header is in both headers and headers_b64")
    return headers


def _common_message(raw: Any) -> ProduceMessage | None:
    """The message when `raw` has the common shape (text value, optional text key, optional
    non-negative partition, nothing else); None sends it through the full checks."""
    if type(raw) is not dict or not raw.keys() <= COMMON_MESSAGE_FIELDS:
        return None
    value = raw.get("value")
    key = raw.get("key")
    partition = raw.get("partition")
    if type(value) is not str or (key is not None and type(key) is not str):
        return None
    if partition is not None and (type(partition) is not int or partition < 0):
        return None
    try:
        return ProduceMessage(
            None if key is None else key.encode("utf-8"), value.encode("utf-8"), [], partition
        )
    except UnicodeEncodeError:  # a lone surrogate: the full checks word the error
        return None


def _message(raw: Any, index: int) -> ProduceMessage:
    common = _common_message(raw)
    if common is not None:
        return common
    where = f"messages[{index}]"
    obj = _object(raw, where)
    _no_unknown(obj, MESSAGE_FIELDS, where)
    if "value" not in obj and "value_b64" not in obj:
        raise invalid(f"{where}: value or value_b64 is required (null for a tombstone)")
    partition = obj.get("partition")
    if partition is not None and (not is_int(partition) or partition < 0):
        raise invalid(f"{where}: partition must be a non-negative integer")
    timestamp = obj.get("timestamp")
    if timestamp is not None and (not is_int(timestamp) or not 0 <= timestamp < 1 << 63):
        raise invalid(f"{where}: timestamp must be a non-negative integer (ms since epoch)")
    return ProduceMessage(
        key=_text_or_bytes(obj, "key", "key_b64", where),
        value=_text_or_bytes(obj, "value", "value_b64", where),
        headers=_headers(obj.get("headers"), obj.get("headers_b64"), where),
        partition=partition,
        timestamp=timestamp,
    )


def produce_request(body: Any) -> ProduceRequest:
    obj = _object(body, "request body")
    _no_unknown(obj, PRODUCE_FIELDS, "request body")
    acks = obj.get("acks", "all")
    if acks not in ACKS:
        raise invalid(f"acks must be one of {', '.join(ACKS)}")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty array")
    return ProduceRequest(
        acks=acks,
        messages=[_message(m, i) for i, m in enumerate(messages)],
        producer=producer_fields(obj),
    )


def producer_fields(obj: dict[str, Any]) -> ProducerFields | None:
    """The idempotent producer fields of a produce body: all three or none; with
    "transactional": true also the transactional_id the producer was initialised with."""
    transactional = obj.get("transactional", False)
    if not isinstance(transactional, bool):
        raise invalid("transactional must be true or false")
    names = ("producer_id", "producer_epoch", "sequence")
    present = [name for name in names if name in obj]
    tid = obj.get("transactional_id")
    if transactional:
        if len(present) != len(names) or tid is None:
            raise invalid(
                "a transactional request carries transactional_id, producer_id, "
                "producer_epoch and sequence"
            )
        tid = transactional_id(tid)
    elif tid is not None:
        raise invalid('transactional_id goes with "transactional": true')
    if not present:
        return None
    if len(present) != len(names):
        raise invalid("producer_id, producer_epoch and sequence go together")
    limits = (MAX_PRODUCER_ID, MAX_PRODUCER_EPOCH, MAX_SEQUENCE)
    values = []
    for name, high in zip(names, limits, strict=True):
        value = obj[name]
        if type(value) is not int or not 0 <= value <= high:
            raise invalid(f"{name} must be an integer in 0..{high}")
        values.append(value)
    return ProducerFields(*values, transactional_id=tid)


def transactional_id(value: Any) -> str:
    if not isinstance(value, str) or not TRANSACTIONAL_ID.match(value):
        raise invalid("transactional_id must be 1-249 of [A-Za-z0-9._~:@-]")
    return value


def new_producer_request(body: Any) -> tuple[str | None, int]:
    """`POST /v1/producers`: `{}` for an idempotent producer, or a transactional_id (and its
    transaction_timeout_ms, default 60000) for a transactional one."""
    obj = _object({} if body is None else body, "request body")
    _no_unknown(obj, PRODUCER_FIELDS, "request body")
    timeout = obj.get("transaction_timeout_ms", 60_000)
    if type(timeout) is not int or not 0 < timeout <= 15 * 60 * 1000:
        raise invalid("transaction_timeout_ms must be an integer in 1..900000")
    tid = obj.get("transactional_id")
    return (None if tid is None else transactional_id(tid)), timeout


TXN_OFFSETS_FIELDS = frozenset(
    {"producer_id", "producer_epoch", "group", "offsets", "member_id", "generation"}
)
GROUP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def txn_member(body: Any) -> dict[str, Any]:
    """The optional consumer-group member of `POST /v1/transactions/{id}/offsets` (KIP-447):
    {"member_id", "generation"} given together, or {} when neither is."""
    obj = _object(body, "request body")
    member_id, generation = obj.get("member_id"), obj.get("generation")
    if member_id is None and generation is None:
        return {}
    if not isinstance(member_id, str) or not member_id or len(member_id) > 255:
        raise invalid("member_id must be a non-empty string (with generation)")
    if type(generation) is not int or generation < 0:
        raise invalid("generation must be a non-negative integer (with member_id)")
    return {"member_id": member_id, "generation": generation}


def txn_offsets_request(body: Any) -> tuple[int, int, str, list[list[Any]]]:
    """`POST /v1/transactions/{id}/offsets`: (producer id, epoch, group, [[t, p, offset]]);
    txn_member reads the optional member fields."""
    obj = _object(body, "request body")
    _no_unknown(obj, TXN_OFFSETS_FIELDS, "request body")
    pid, epoch = end_txn_request({k: obj.get(k) for k in END_TXN_FIELDS})
    group = obj.get("group")
    if not isinstance(group, str) or not GROUP_NAME.match(group):
        raise invalid("group must be 1-249 of [A-Za-z0-9._-]")
    items = obj.get("offsets")
    if not isinstance(items, list) or not items:
        raise invalid("offsets must be a non-empty array")
    offsets = []
    seen = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid(f"offsets[{i}] must be an object")
        _no_unknown(item, frozenset({"topic", "partition", "offset"}), f"offsets[{i}]")
        topic = topic_name(item.get("topic"))
        partition, offset = item.get("partition"), item.get("offset")
        if type(partition) is not int or type(offset) is not int or partition < 0 or offset < 0:
            raise invalid(f"offsets[{i}]: partition and offset must be non-negative integers")
        if (topic, partition) in seen:
            raise invalid(f"offsets names {topic}/{partition} twice")
        seen.add((topic, partition))
        offsets.append([topic, partition, offset])
    return pid, epoch, group, offsets


def end_txn_request(body: Any) -> tuple[int, int]:
    obj = _object(body, "request body")
    _no_unknown(obj, END_TXN_FIELDS, "request body")
    pid, epoch = obj.get("producer_id"), obj.get("producer_epoch")
    if type(pid) is not int or not 0 <= pid <= MAX_PRODUCER_ID:
        raise invalid(f"producer_id must be an integer in 0..{MAX_PRODUCER_ID}")
    if type(epoch) is not int or not 0 <= epoch <= MAX_PRODUCER_EPOCH:
        raise invalid(f"producer_epoch must be an integer in 0..{MAX_PRODUCER_EPOCH}")
    return pid, epoch


def _config_int(key: str, value: str, low: int, high: int | None = None) -> str:
    try:
        number = int(value)
    except ValueError:
        raise invalid(f"config {key} must be an integer") from None
    if number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid(f"config {key} must be {bound}")
    return str(number)


def _config_value(key: str, value: str) -> str:
    if key in _INT_AT_LEAST_MINUS_ONE:
        return _config_int(key, value, -1)
    if key == "max.message.bytes":
        return _config_int(key, value, 1, LIMIT_MAX_MESSAGE_BYTES)
    if key == "segment.bytes":
        return _config_int(key, value, 1024)
    if key in (
        "segment.ms",
        "min.compaction.lag.ms",
        "max.compaction.lag.ms",
        "delete.retention.ms",
    ):
        return _config_int(key, value, 0)
    if key == "min.insync.replicas":
        return _config_int(key, value, 1)
    if key == "min.cleanable.dirty.ratio":
        try:
            ratio = float(value)
        except ValueError:
            raise invalid(f"config {key} must be a number") from None
        if not 0.0 <= ratio <= 1.0:
            raise invalid(f"config {key} must be between 0 and 1")
        return value
    if key == "cleanup.policy":
        if value not in CLEANUP_POLICIES:
            raise invalid("config cleanup.policy must be delete or compact")
        return value
    if key == "compression.type":
        if value not in COMPRESSION_TYPES:
            raise invalid(f"config compression.type must be one of {sorted(COMPRESSION_TYPES)}")
        return value
    if key in tiered_config.KEYS:
        if (problem := tiered_config.check_value(key, value)) is not None:
            raise invalid(problem)
        return value
    raise invalid(f"unknown topic config {key!r}")


def topic_config(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    obj = _object(raw, "config")
    config: dict[str, str] = {}
    for key, value in obj.items():
        if isinstance(value, bool) and key == tiered_config.REMOTE_STORAGE:
            value = "true" if value else "false"  # JSON's true is what users will write
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise invalid(f"config {key!r} must be a string or a number")
        config[str(key)] = _config_value(str(key), str(value))
    return config


def create_topic_request(body: Any) -> CreateTopicRequest:
    obj = _object(body, "request body")
    _no_unknown(obj, CREATE_FIELDS, "request body")
    partitions = obj.get("partitions", 1)
    if not is_int(partitions) or not 1 <= partitions <= MAX_PARTITIONS:
        raise invalid(f"partitions must be an integer from 1 to {MAX_PARTITIONS}")
    replication = obj.get("replication_factor")
    if replication is not None and (
        not is_int(replication) or not 1 <= replication <= MAX_REPLICATION_FACTOR
    ):
        raise invalid(f"replication_factor must be an integer from 1 to {MAX_REPLICATION_FACTOR}")
    return CreateTopicRequest(
        name=topic_name(obj.get("name")),
        partitions=partitions,
        replication_factor=replication,
        config=topic_config(obj.get("config")),
    )


def _query_int(query: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """An integer of at least `low`; values above `high` are clamped to it (a budget, not an
    error). The length cap keeps int() from parsing megabytes of digits."""
    text = query.get(name)
    if text is None:
        return default
    if len(text) > 20:
        raise invalid(f"{name} must be an integer")
    try:
        number = int(text)
    except ValueError:
        raise invalid(f"{name} must be an integer") from None
    if number < low:
        raise invalid(f"{name} must be at least {low}")
    return min(number, high)


ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def fetch_request(query: dict[str, str]) -> FetchRequest:
    timestamp = None
    if "timestamp" in query:
        if "offset" in query:
            raise invalid("give offset or timestamp, not both")
        timestamp = _query_int(query, "timestamp", 0, 0, 2**63 - 1)
    text = query.get("offset", "earliest")
    offset: int | str
    if len(text) > 20:
        raise invalid("offset must be a non-negative integer, earliest or latest")
    if text in ("earliest", "latest"):
        offset = text
    else:
        try:
            offset = int(text)
        except ValueError:
            raise invalid("offset must be a non-negative integer, earliest or latest") from None
        if offset < 0:
            raise invalid("offset must be a non-negative integer, earliest or latest")
    isolation = query.get("isolation", "read_uncommitted")
    if isolation not in ISOLATION_LEVELS:
        raise invalid(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}")
    return FetchRequest(
        isolation=isolation,
        offset=offset,
        max_messages=_query_int(query, "max_messages", DEFAULT_MAX_MESSAGES, 1, MAX_MAX_MESSAGES),
        max_bytes=_query_int(query, "max_bytes", DEFAULT_MAX_BYTES, 1, MAX_MAX_BYTES),
        wait_ms=_query_int(query, "wait_ms", 0, 0, MAX_WAIT_MS),
        timestamp=timestamp,
    )


def max_message_bytes(config: dict[str, Any]) -> int:
    raw = config.get("max.message.bytes")
    try:
        return int(raw) if raw is not None else DEFAULT_MAX_MESSAGE_BYTES
    except (TypeError, ValueError):
        return DEFAULT_MAX_MESSAGE_BYTES


def fields_of(raw: Any, allowed: frozenset[str], what: str) -> dict[str, Any]:
    """A JSON object whose keys are all in `allowed` (`what` names it in the error)."""
    if not isinstance(raw, dict):
        raise invalid(f"{what} must be a JSON object")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise invalid(f"unknown field(s) in {what}: {', '.join(unknown)}")
    return raw
