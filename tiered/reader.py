"""Reads of a partition's uploaded segments: the node-wide chunk cache with read-ahead.

Owns fetching byte ranges of segment objects in fixed-size chunks (ranged GETs), a node-wide
LRU of chunks bounded in bytes, one GET per chunk however many readers wait for it, the chunks
a sequential reader needs next (across objects), and cutting whole batches out of the chunks
exactly as the local log's read does (same bytes, same first batch, same limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import OrderedDict
from typing import NamedTuple

from raftline.raftlog.batch import LOG_OVERHEAD

from .layout import INDEX_INTERVAL_BYTES, AbortedRange, offset_index_floor, read_txn_index
from .manifest import SegmentMeta
from .store import ObjectStore

CHUNK_BYTES = 4 << 20  # one ranged GET; large enough that request overhead stays small
DEFAULT_CACHE_BYTES = 64 << 20
READ_AHEAD_BYTES = 16 << 20  # what a sequential reader's next reads will want, loaded now
# baseOffset, batchLength, (partitionLeaderEpoch, magic, crc, attributes), lastOffsetDelta
_BATCH_HEAD = struct.Struct(">qi11xi")
_HEAD_BYTES = _BATCH_HEAD.size


class RemoteRead(NamedTuple):
    data: bytes  # whole batches, as the local log would return them
    aborted: list[AbortedRange]  # the segment's aborted transactions (read_committed)
    end_position: int  # where in the object the read stopped
    next_offset: int  # the offset after the last batch returned


class ChunkCache:
    """Chunks of objects, LRU, at most `limit_bytes` held (in-flight GETs aside)."""

    def __init__(self, store: ObjectStore, limit_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.store = store
        self.limit_bytes = limit_bytes
        self._chunks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._loading: dict[tuple[str, int], asyncio.Future[bytes]] = {}
        self._small: OrderedDict[str, bytes] = OrderedDict()  # index and txn-index objects
        self._held = 0
        self._ahead: set[asyncio.Task[None]] = set()
        self.hits = 0
        self.misses = 0

    @property
    def held_bytes(self) -> int:
        return self._held

    async def chunk(self, key: str, number: int, size: int) -> bytes:
        """Chunk `number` of object `key` (of `size` bytes)."""
        slot = (key, number)
        cached = self._chunks.get(slot)
        if cached is not None:
            self._chunks.move_to_end(slot)
            self.hits += 1
            return cached
        loading = self._loading.get(slot)
        if loading is None:
            self.misses += 1
            start = number * CHUNK_BYTES
            end = min(start + CHUNK_BYTES, size)
            loading = asyncio.ensure_future(self.store.get_range(key, start, end))
            self._loading[slot] = loading
            loading.add_done_callback(lambda done: self._loaded(slot, done))
        return await asyncio.shield(loading)

    def _loaded(self, slot: tuple[str, int], done: asyncio.Future[bytes]) -> None:
        self._loading.pop(slot, None)
        if done.cancelled() or done.exception() is not None:
            return
        data = done.result()
        self._chunks[slot] = data
        self._held += len(data)
        while self._held > self.limit_bytes and len(self._chunks) > 1:
            _, evicted = self._chunks.popitem(last=False)
            self._held -= len(evicted)

    def prefetch(self, key: str, number: int, size: int) -> None:
        """Start loading chunk `number` of an object in the background (read-ahead)."""
        slot = (key, number)
        if slot not in self._chunks and slot not in self._loading:
            task = asyncio.ensure_future(self._prefetch(key, number, size))
            self._ahead.add(task)
            task.add_done_callback(self._ahead.discard)

    async def _prefetch(self, key: str, number: int, size: int) -> None:
        with contextlib.suppress(Exception):  # a reader that needs it retries the GET
            await self.chunk(key, number, size)

    async def small(self, key: str) -> bytes:
        """A whole small object (an index), cached beside the chunks (at most 256 of them)."""
        cached = self._small.get(key)
        if cached is not None:
            self._small.move_to_end(key)
            return cached
        data = await self.store.get(key)
        self._small[key] = data
        if len(self._small) > 256:
            self._small.popitem(last=False)
        return data

    async def read_range(self, key: str, size: int, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the object, through the chunks (a view: no copy when they
        lie in one chunk)."""
        first, last = start // CHUNK_BYTES, (end - 1) // CHUNK_BYTES
        parts = [await self.chunk(key, n, size) for n in range(first, last + 1)]
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        base = first * CHUNK_BYTES
        return memoryview(joined)[start - base : end - base]

    def drop_all(self) -> None:
        """Forget every cached chunk (benchmarks measure a cold cache with it)."""
        self._chunks.clear()
        self._small.clear()
        self._held = 0

    def close(self) -> None:
        for task in list(self._ahead):
            task.cancel()


async def read_segment(
    cache: ChunkCache, segment: SegmentMeta, offset: int, max_bytes: int, upto: int
) -> RemoteRead:
    """Whole batches of `segment` from the one containing `offset`: at least one batch, then
    as many as fit in `max_bytes`, none at or past `upto` (the local log's read rules)."""
    position = 0
    if offset > segment.base_offset:
        index = await cache.small(segment.index)
        position = offset_index_floor(index, offset - segment.base_offset)
    size = segment.size_bytes
    out: list[memoryview] = []
    taken = 0
    end_offset = offset
    done = False
    while not done and position < size:
        # A window past the start position: the batches wanted plus those skipped to reach
        # `offset` (at most one index interval) usually fit in one.
        end = min(size, position + max(max_bytes, LOG_OVERHEAD) + INDEX_INTERVAL_BYTES)
        window = await cache.read_range(segment.object, size, position, end)
        at = 0
        while at + _HEAD_BYTES <= len(window):
            base, length, last_delta = _BATCH_HEAD.unpack_from(window, at)
            batch_size = length + LOG_OVERHEAD
            next_offset = base + last_delta + 1
            # As the local read: never the batch holding `upto`, the first batch whatever its
            # size, then only whole batches within `max_bytes`.
            if next_offset > upto or (out and taken + batch_size > max_bytes):
                done = True
                break
            if at + batch_size > len(window):
                if at == 0:  # one batch larger than the window: read exactly it
                    window = await cache.read_range(
                        segment.object, size, position, position + batch_size
                    )
                    continue
                break
            if next_offset > offset:  # batches before the one holding `offset` are skipped
                out.append(window[at : at + batch_size])
                taken += batch_size
                end_offset = next_offset
            at += batch_size
        position += at
        if at == 0:
            break
    aborted: list[AbortedRange] = []
    if segment.txn_index is not None:
        aborted = read_txn_index(await cache.small(segment.txn_index))
    return RemoteRead(b"".join(out), aborted, position, end_offset)


def chunks_ahead(
    segments: list[SegmentMeta], index: int, position: int, budget: int = READ_AHEAD_BYTES
) -> list[tuple[str, int, int]]:
    """(object, chunk, object size) of the next `budget` bytes after `position` in
    segments[index], continuing into the following segments."""
    out = []
    number = position // CHUNK_BYTES + 1
    while budget > 0 and index < len(segments):
        segment = segments[index]
        last = (segment.size_bytes - 1) // CHUNK_BYTES
        while number <= last and budget > 0:
            out.append((segment.object, number, segment.size_bytes))
            budget -= CHUNK_BYTES
            number += 1
        index, number = index + 1, 0
    return out
