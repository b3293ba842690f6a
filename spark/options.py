"""The options of the `raftline` Spark data source, checked before any job runs.

Owns option names (Spark's Kafka source names where the meaning is the same), their defaults,
and turning the user's strings into a ReadOptions value, or an OptionError whose message names
the option and what is wrong with it. Knows nothing of Spark or the bucket.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from raftline.spark.bucket import BucketSpec

EARLIEST = -2  # in per-partition offset JSON, as in Spark's Kafka source
LATEST = -1
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024  # as spark.sql.files.maxPartitionBytes

# Every option the source honours; anything else is refused (lower case: Spark's options are
# case-insensitive and arrive in lower case).
KNOWN = {
    "s3.endpoint": "URL of the S3 endpoint",
    "bucket": "the bucket the brokers upload to",
    "s3.region": "S3 region (default us-east-1)",
    "s3.prefix": "the brokers' --s3-prefix (default none)",
    "s3.accesskeyid": "access key (default: AWS_ACCESS_KEY_ID)",
    "s3.secretaccesskey": "secret key (default: AWS_SECRET_ACCESS_KEY)",
    "subscribe": "comma-separated topics",
    "subscribepattern": "a regular expression over topic names",
    "assign": 'JSON {"topic": [partitions]}',
    "startingoffsets": 'earliest, latest or JSON {"topic": {"partition": offset}}',
    "endingoffsets": 'latest or JSON {"topic": {"partition": offset}} (batch only)',
    "startingtimestamp": "milliseconds since the epoch",
    "maxoffsetspertrigger": "most offsets one micro-batch reads (streaming)",
    "includeheaders": "true: add the headers column",
    "includebrokertail": "true: also read what is not uploaded yet from the brokers",
    "brokers": "comma-separated HTTP URLs of Raftline nodes (for includeBrokerTail)",
    "maxpartitionbytes": "split segment objects larger than this (bytes)",
    "failondataloss": "false: start at the bucket's start when offsets asked were deleted",
}


class OptionError(ValueError):
    """An option the source cannot honour; the message is meant for the person who set it."""


Subscription = tuple[str, object]  # ("subscribe", [topics]) | ("pattern", re) | ("assign", {})
OffsetSpec = int | dict[str, dict[int, int]]  # EARLIEST / LATEST, or per topic and partition


@dataclass(frozen=True)
class ReadOptions:
    bucket: BucketSpec
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    max_offsets_per_trigger: int | None
    include_headers: bool
    broker_tail: tuple[str, ...]  # broker URLs when the tail is read, else empty
    max_partition_bytes: int
    fail_on_data_loss: bool


def parse(raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(set(options) - set(KNOWN) - {"path"})
    if unknown:
        raise OptionError(
            f"unknown option(s) {', '.join(unknown)}; the raftline source reads the bucket "
            f"and knows: {', '.join(sorted(KNOWN))}"
        )
    for required in ("s3.endpoint", "bucket"):
        if not options.get(required):
            raise OptionError(f"option {required} is required ({KNOWN[required]})")
    endpoint = options["s3.endpoint"]
    if not endpoint.startswith(("http://", "https://")):
        raise OptionError(f"s3.endpoint must be an http(s) URL, got {endpoint!r}")
    credentials = {}
    if "s3.accesskeyid" in options or "s3.secretaccesskey" in options:
        if not (options.get("s3.accesskeyid") and options.get("s3.secretaccesskey")):
            raise OptionError("set both s3.accessKeyId and s3.secretAccessKey, or neither")
        credentials = {
            "access_key_id": options["s3.accesskeyid"],
            "secret_access_key": options["s3.secretaccesskey"],
        }
    bucket = BucketSpec.resolve(
        endpoint,
        options["bucket"],
        region=options.get("s3.region") or "us-east-1",
        prefix=options.get("s3.prefix", ""),
        **credentials,
    )
    starting = _offsets("startingOffsets", options.get("startingoffsets"), streaming)
    if "startingtimestamp" in options and "startingoffsets" in options:
        raise OptionError("set startingOffsets or startingTimestamp, not both")
    if not streaming and starting == LATEST:
        raise OptionError("startingOffsets=latest makes no sense for a batch query")
    if streaming and "endingoffsets" in options:
        raise OptionError("endingOffsets is for batch queries; a stream has no end")
    ending = _offsets("endingOffsets", options.get("endingoffsets"), streaming, ending=True)
    tail = _flag(options, "includebrokertail")
    brokers = tuple(u.strip() for u in options.get("brokers", "").split(",") if u.strip())
    if tail and not brokers:
        raise OptionError("includeBrokerTail=true needs brokers=http://host:port[,...]")
    if brokers and not tail:
        raise OptionError("brokers is only used with includeBrokerTail=true")
    for url in brokers:
        if not url.startswith(("http://", "https://")):
            raise OptionError(f"brokers must be http(s) URLs, got {url!r}")
    max_per_trigger = _positive(options, "maxoffsetspertrigger")
    if max_per_trigger is not None and not streaming:
        raise OptionError("maxOffsetsPerTrigger is for streaming queries")
    return ReadOptions(
        bucket=bucket,
        subscription=_subscription(options),
        starting=starting,
        ending=ending,
        starting_timestamp=_integer(options, "startingtimestamp"),
        max_offsets_per_trigger=max_per_trigger,
        include_headers=_flag(options, "includeheaders"),
        broker_tail=brokers,
        max_partition_bytes=_positive(options, "maxpartitionbytes") or DEFAULT_MAX_PARTITION_BYTES,
        fail_on_data_loss=_flag(options, "failondataloss", default=True),
    )


def include_headers(raw: Mapping[str, str]) -> bool:
    """Only the option the schema depends on."""
    return _flag({str(k).lower(): str(v) for k, v in raw.items()}, "includeheaders")


def _subscription(options: dict[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribepattern", "assign") if name in options]
    if len(given) != 1:
        raise OptionError(
            "set exactly one of subscribe, subscribePattern, assign"
            + (f" (got {', '.join(given)})" if given else "")
        )
    (name,) = given
    value = options[name]
    if name == "subscribe":
        topics = [t.strip() for t in value.split(",") if t.strip()]
        if not topics:
            raise OptionError("subscribe lists no topic")
        return ("subscribe", topics)
    if name == "subscribepattern":
        try:
            return ("pattern", re.compile(value))
        except re.error as exc:
            raise OptionError(
                f"subscribePattern {value!r} is not a regular expression: {exc}"
            ) from None
    parsed = _json("assign", value)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError('assign must be JSON like {"orders": [0, 1]}')
    assigned: dict[str, list[int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise OptionError(f"assign: {topic!r} must map to a list of partition numbers")
        assigned[topic] = sorted(set(partitions))
    return ("assign", assigned)


def _offsets(name: str, value: str | None, streaming: bool, ending: bool = False) -> OffsetSpec:
    if value is None:
        return LATEST if ending or streaming else EARLIEST
    word = value.strip().lower()
    if word == "earliest":
        if ending:
            raise OptionError("endingOffsets=earliest would read nothing; use latest or JSON")
        return EARLIEST
    if word == "latest":
        return LATEST
    parsed = _json(name, value)
    if not isinstance(parsed, dict):
        raise OptionError(f'{name} must be earliest, latest or JSON like {{"orders": {{"0": 5}}}}')
    spec: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{name}: {topic!r} must map partitions to offsets")
        spec[topic] = {}
        for partition, offset in partitions.items():
            if not (str(partition).isdigit() and isinstance(offset, int)) or offset < EARLIEST:
                raise OptionError(
                    f"{name}: {topic!r} partition {partition!r} -> {offset!r}: partitions are "
                    "numbers and offsets >= 0, or -2 (earliest) / -1 (latest)"
                )
            if ending and offset == EARLIEST:
                raise OptionError(f"{name}: -2 (earliest) is not allowed as an ending offset")
            spec[topic][int(partition)] = offset
    return spec


def _json(name: str, value: str) -> object:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise OptionError(f"{name} is neither a keyword nor valid JSON: {exc}: {value!r}") from None


def _flag(options: dict[str, str], name: str, default: bool = False) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, got {value!r}")
    return value.strip().lower() == "true"


def _integer(options: dict[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise OptionError(f"{name} must be an integer, got {value!r}") from None


def _positive(options: dict[str, str], name: str) -> int | None:
    number = _integer(options, name)
    if number is not None and number <= 0:
        raise OptionError(f"{name} must be positive, got {number}")
    return number
