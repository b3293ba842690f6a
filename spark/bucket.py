"""The read side of a tiered-storage bucket (tiered/FORMAT.md, version 1) for the Spark reader.

Owns finding topics and partition manifests, reading segment objects whole or by byte range,
and parsing the offset and transaction index objects; synchronous calls over
tiered/store.py's ObjectStore, so that Spark's driver and Python workers can use them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from raftline.raftlog.index import OFFSET_ENTRY
from raftline.tiered.layout import AbortedRange, read_txn_index
from raftline.tiered.manifest import FORMAT_VERSION, ManifestState, SegmentMeta
from raftline.tiered.store import (
    DEFAULT_REGION,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    S3Config,
)

TOPICS_PREFIX = "topics/"

T = TypeVar("T")


class BucketError(Exception):
    """The bucket cannot be read as asked: unreachable, refused, missing or malformed objects.
    The message says which and where, for a person to act on."""


@dataclass(frozen=True)
class BucketSpec:
    """Where the bucket is and how to sign requests: plain picklable fields, shipped to
    Spark's workers inside every input partition."""

    endpoint: str
    bucket: str
    region: str = DEFAULT_REGION
    prefix: str = ""
    access_key_id: str | None = None
    secret_access_key: str | None = None
    attempts: int = 3

    @classmethod
    def resolve(cls, endpoint: str, bucket: str, **settings: Any) -> BucketSpec:
        """Credentials given, else the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment
        variables (as every S3 tool reads them), else unsigned requests."""
        settings.setdefault("access_key_id", os.environ.get("AWS_ACCESS_KEY_ID"))
        settings.setdefault("secret_access_key", os.environ.get("AWS_SECRET_ACCESS_KEY"))
        return cls(endpoint, bucket, **settings)

    def config(self) -> S3Config:
        return S3Config(
            self.endpoint,
            self.bucket,
            region=self.region,
            prefix=self.prefix,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            attempts=self.attempts,
            backoff_max_s=1.0,
            connect_timeout_s=3.0,
        )


@dataclass(frozen=True)
class Manifest:
    """A partition's manifest as a reader needs it."""

    topic: str
    partition: int
    start_offset: int  # the first offset a reader may return
    next_offset: int  # one past the last offset the bucket holds
    segments: tuple[SegmentMeta, ...]


@dataclass(frozen=True)
class TopicObject:
    topic: str
    topic_id: int
    partitions: int
    manifests: tuple[str, ...]  # by partition
    created_ms: int


class Bucket:
    """Synchronous reads of one bucket. One per process (driver or worker task); not shared
    between threads."""

    def __init__(self, spec: BucketSpec) -> None:
        self.spec = spec
        try:
            self._store = ObjectStore(spec.config())
        except (ValueError, ObjectStoreError) as exc:
            raise BucketError(f"bucket {spec.bucket!r} at {spec.endpoint}: {exc}") from exc
        self._loop = asyncio.new_event_loop()

    def close(self) -> None:
        self._loop.close()

    def _run(self, what: str, call: Coroutine[Any, Any, T]) -> T:
        try:
            return self._loop.run_until_complete(call)
        except ObjectNotFound:
            raise
        except Exception as exc:  # obstore's and ObjectStore's errors: say where and what
            raise BucketError(
                f"cannot {what} in bucket {self.spec.bucket!r} at {self.spec.endpoint}: "
                f"{_first_line(exc)}"
            ) from exc

    def get(self, key: str) -> bytes:
        return self._run(f"read {key}", self._store.get(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._run(f"read {key}", self._store.get_range(key, start, end))

    def _json(self, key: str) -> dict[str, Any]:
        raw = self.get(key)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BucketError(f"{key} is not JSON: {exc}") from exc
        version = body.get("format_version")
        if version != FORMAT_VERSION:
            raise BucketError(
                f"{key} has format_version {version}; this reader knows {FORMAT_VERSION}"
            )
        return body

    def topics(self) -> dict[str, TopicObject]:
        """The current incarnation of every topic in the bucket (largest created_ms)."""
        listing = self._run("list topics", self._store.list(TOPICS_PREFIX))
        found: dict[str, TopicObject] = {}
        for info in listing:
            if not info.key.endswith("/topic.json"):
                continue
            body = self._json(info.key)
            topic = TopicObject(
                body["topic"],
                int(body["topic_id"]),
                int(body["partitions"]),
                tuple(body["manifests"]),
                int(body.get("created_ms", 0)),
            )
            known = found.get(topic.topic)
            if known is None or topic.created_ms > known.created_ms:
                found[topic.topic] = topic
        return found

    def manifest(self, topic: TopicObject, partition: int) -> Manifest:
        """The partition's manifest; an empty one when it has uploaded nothing yet."""
        key = topic.manifests[partition]
        try:
            state = ManifestState.from_document(self._json(key))
        except ObjectNotFound:
            return Manifest(topic.topic, partition, 0, 0, ())
        except (KeyError, TypeError, ValueError) as exc:
            raise BucketError(f"{key} is not a valid manifest: {exc!r}") from exc
        start = state.start_offset if state.segments else state.next_offset
        return Manifest(topic.topic, partition, start, state.next_offset, tuple(state.segments))

    def offset_index(self, key: str) -> list[tuple[int, int]]:
        """(relative last offset of a batch, byte position of that batch) entries."""
        raw = self.get(key)
        usable = len(raw) - len(raw) % OFFSET_ENTRY.size
        return list(OFFSET_ENTRY.iter_unpack(raw[:usable]))

    def aborted(self, key: str | None) -> list[AbortedRange]:
        """A transaction index's aborted transactions (none without an index)."""
        if key is None:
            return []
        try:
            return read_txn_index(self.get(key))
        except ValueError as exc:
            raise BucketError(f"{key}: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
