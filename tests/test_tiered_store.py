"""tiered/store.py against a real SeaweedFS server: each call's S3 semantics, retries, timeouts."""

from __future__ import annotations

import time

import pytest
from seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedServer

from raftline.tiered.store import ObjectNotFound, ObjectStore, ObjectStoreError, S3Config


def store_of(seaweed: SeaweedServer, bucket: str, **settings: object) -> ObjectStore:
    config = S3Config(
        seaweed.endpoint,
        bucket,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        **settings,  # type: ignore[arg-type]
    )
    return ObjectStore(config)


async def test_put_then_get_returns_the_bytes(seaweed: SeaweedServer, bucket: str) -> None:
    store = store_of(seaweed, bucket, prefix="roundtrip")
    await store.put("a/b.log", b"\x00payload\xff")
    assert await store.get("a/b.log") == b"\x00payload\xff"


async def test_ranged_get_returns_the_slice(seaweed: SeaweedServer, bucket: str) -> None:
    store = store_of(seaweed, bucket, prefix="range")
    await store.put("x", bytes(range(100)))
    assert await store.get_range("x", 10, 20) == bytes(range(10, 20))
    assert await store.get_range("x", 95, 200) == bytes(range(95, 100))


async def test_put_if_absent_keeps_the_first_object(seaweed: SeaweedServer, bucket: str) -> None:
    store = store_of(seaweed, bucket, prefix="cond")
    assert await store.put_if_absent("seg", b"first") is True
    assert await store.put_if_absent("seg", b"second") is False
    assert await store.get("seg") == b"first"


async def test_list_is_relative_to_the_prefix(seaweed: SeaweedServer, bucket: str) -> None:
    store = store_of(seaweed, bucket, prefix="/listing/")
    for key in ("t/1", "t/2", "u/1"):
        await store.put(key, b"x")
    assert sorted(info.key for info in await store.list("t/")) == ["t/1", "t/2"]
    assert len(await store.list()) == 3


async def test_delete_removes_and_tolerates_missing_keys(
    seaweed: SeaweedServer, bucket: str
) -> None:
    store = store_of(seaweed, bucket, prefix="del")
    await store.put("k", b"x")
    await store.delete(["k", "never-written"])
    with pytest.raises(ObjectNotFound):
        await store.get("k")


async def test_missing_key_fails_at_once_without_retries(
    seaweed: SeaweedServer, bucket: str
) -> None:
    store = store_of(seaweed, bucket, prefix="missing")
    with pytest.raises(ObjectNotFound):
        await store.get("nothing-here")
    assert store.retries == 0


async def test_unreachable_endpoint_fails_after_bounded_retries() -> None:
    config = S3Config(
        "http://127.0.0.1:9",  # discard port: connection refused
        "bucket",
        attempts=3,
        backoff_base_s=0.05,
        connect_timeout_s=0.5,
        request_timeout_s=1.0,
    )
    store = ObjectStore(config)
    started = time.monotonic()
    with pytest.raises(ObjectStoreError, match="failed 3 times"):
        await store.put("k", b"x")
    assert store.retries == 2
    assert time.monotonic() - started < 5


async def test_stalled_server_times_out(seaweed: SeaweedServer, bucket: str) -> None:
    store = store_of(seaweed, bucket, attempts=1, request_timeout_s=0.5, connect_timeout_s=0.5)
    seaweed.pause()
    try:
        started = time.monotonic()
        with pytest.raises(ObjectStoreError):
            await store.put("stalled", b"x")
        assert time.monotonic() - started < 3
    finally:
        seaweed.resume()
