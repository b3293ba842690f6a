"""The S3 client layer of tiered storage: async put (plain and conditional), get, list, delete.

Owns the connection settings (endpoint, bucket, region, key prefix, credentials from the
environment), per-request timeouts and the retry policy (exponential backoff with jitter on
transient failures only). Built on obstore (Rust object_store): measured fastest of obstore,
aiobotocore and boto3 against SeaweedFS here (bench/s3_clients.py, figures in bench/README.md).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NamedTuple, TypeVar

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

T = TypeVar("T")

DEFAULT_REGION = "us-east-1"


class ObjectStoreError(Exception):
    """A request that failed for good: retries exhausted, or refused (credentials, bucket)."""


class ObjectNotFound(ObjectStoreError):
    """The key does not exist."""


class ObjectInfo(NamedTuple):
    key: str  # relative to the store's prefix
    size: int


@dataclass(frozen=True, slots=True)
class S3Config:
    """Where the bucket is. Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY."""

    endpoint: str
    bucket: str
    region: str = DEFAULT_REGION
    prefix: str = ""  # every key is written under it; normalised to end with "/"
    request_timeout_s: float = 30.0  # one HTTP request, whole body included
    connect_timeout_s: float = 5.0
    attempts: int = 5  # tries per call on transient failures
    backoff_base_s: float = 0.1  # first retry waits up to this; doubles each try
    backoff_max_s: float = 5.0
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"S3 endpoint must be an http(s) URL, got {self.endpoint!r}")
        if not self.bucket:
            raise ValueError("S3 bucket name is empty")
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")
        prefix = self.prefix.strip("/")
        object.__setattr__(self, "prefix", f"{prefix}/" if prefix else "")

    @classmethod
    def from_env(cls, endpoint: str, bucket: str, **settings: object) -> S3Config:
        """Settings plus credentials from the process environment (as every S3 tool reads them)."""
        return cls(
            endpoint,
            bucket,
            access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            **settings,  # type: ignore[arg-type]
        )


_PERMANENT = (
    FileExistsError,
    AlreadyExistsError,
    PreconditionError,
    PermissionDeniedError,
    UnauthenticatedError,
)


class ObjectStore:
    """One bucket (under one prefix). Every method retries transient failures (5xx, resets,
    timeouts) `attempts` times with backoff, then raises ObjectStoreError; a missing key raises
    ObjectNotFound at once. Safe to share between tasks of one event loop."""

    def __init__(self, config: S3Config) -> None:
        self.config = config
        credentials: dict[str, str] = {}
        if config.access_key_id and config.secret_access_key:
            credentials = {
                "access_key_id": config.access_key_id,
                "secret_access_key": config.secret_access_key,
            }
        else:
            credentials = {"skip_signature": "true"}
        self._store = S3Store(
            config.bucket,
            endpoint=config.endpoint,
            region=config.region,
            virtual_hosted_style_request=False,
            client_options={
                "allow_http": config.endpoint.startswith("http://"),
                "timeout": _millis(config.request_timeout_s),
                "connect_timeout": _millis(config.connect_timeout_s),
            },
            # Retries are ours (counted, and the same for every call); obstore's are off.
            retry_config={
                "max_retries": 0,
                "retry_timeout": timedelta(seconds=config.request_timeout_s),
            },
            **credentials,  # type: ignore[arg-type]
        )
        self.requests = 0
        self.retries = 0
        self.failures = 0

    def _path(self, key: str) -> str:
        return self.config.prefix + key

    async def _call(self, what: str, key: str, request: Callable[[], Awaitable[T]]) -> T:
        config = self.config
        delay = config.backoff_base_s
        for attempt in range(1, config.attempts + 1):
            self.requests += 1
            try:
                return await request()
            except (NotFoundError, FileNotFoundError) as exc:  # obstore raises the latter
                raise ObjectNotFound(f"{key}: not found in bucket {config.bucket}") from exc
            except _PERMANENT:
                raise
            except Exception as exc:  # transient: 5xx, connection reset, timeout
                if attempt == config.attempts:
                    self.failures += 1
                    raise ObjectStoreError(
                        f"{what} {key}: failed {attempt} times, last: {_brief(exc)}"
                    ) from exc
                self.retries += 1
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, config.backoff_max_s)
        raise AssertionError("unreachable")

    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Write (or overwrite) `key`."""
        path = self._path(key)
        await self._call("put", key, lambda: obstore.put_async(self._store, path, data))

    async def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Write `key` unless it exists (If-None-Match: *). True: written now; False: it was
        there already (possibly from an earlier attempt of this call whose answer was lost)."""
        path = self._path(key)

        async def put() -> bool:
            try:
                await obstore.put_async(self._store, path, data, mode="create")
            except (AlreadyExistsError, PreconditionError):
                return False
            return True

        return await self._call("put-if-absent", key, put)

    async def put_if_match(self, key: str, data: bytes | memoryview, etag: str) -> bool:
        """Replace `key` only if its current ETag is `etag` (If-Match): a compare-and-swap.
        False: the object changed (or vanished) since that ETag was read."""
        path = self._path(key)

        async def put() -> bool:
            try:
                await obstore.put_async(self._store, path, data, mode={"e_tag": etag})
            except (PreconditionError, NotFoundError, FileNotFoundError):
                return False
            return True

        return await self._call("put-if-match", key, put)

    async def get_versioned(self, key: str) -> tuple[bytes, str | None]:
        """The object and its ETag (for a later put_if_match)."""
        path = self._path(key)

        async def get() -> tuple[bytes, str | None]:
            result = await obstore.get_async(self._store, path)
            etag = result.meta.get("e_tag")
            return bytes(await result.bytes_async()), etag

        return await self._call("get", key, get)

    async def get(self, key: str) -> bytes:
        path = self._path(key)

        async def get() -> bytes:
            result = await obstore.get_async(self._store, path)
            return bytes(await result.bytes_async())

        return await self._call("get", key, get)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `key` (fewer when the object ends first)."""
        if not 0 <= start < end:
            raise ValueError(f"bad range [{start}, {end})")
        path = self._path(key)

        async def get_range() -> bytes:
            return bytes(await obstore.get_range_async(self._store, path, start=start, end=end))

        return await self._call("get-range", key, get_range)

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, keys relative to the store's prefix."""
        strip = len(self.config.prefix)
        path = self._path(prefix)

        async def list_all() -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            async for chunk in obstore.list(self._store, path):
                found.extend(ObjectInfo(meta["path"][strip:], meta["size"]) for meta in chunk)
            return found

        return await self._call("list", prefix, list_all)

    async def delete(self, keys: list[str]) -> None:
        """Delete `keys`; a key already gone is not an error (S3 semantics)."""
        if not keys:
            return
        paths = [self._path(key) for key in keys]
        await self._call("delete", keys[0], lambda: obstore.delete_async(self._store, paths))


def _millis(seconds: float) -> str:
    return f"{int(seconds * 1000)}ms"


def _brief(exc: BaseException) -> str:
    """The first line of an obstore error (they carry multi-line debug dumps)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
