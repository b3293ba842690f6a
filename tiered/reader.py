"""Reads of a partition's uploaded segments: the node-wide chunk cache with read-ahead.

Owns fetching byte ranges of segment objects in fixed-size chunks (ranged GETs), a node-wide
LRU of chunks bounded in bytes, one GET per chunk however many readers wait for it, read-ahead
for readers that move forward through an object, and cutting whole batches out of the chunks
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

CHUNK_BYTES = 1 << 20
DEFAULT_CACHE_BYTES = 64 << 20
READ_AHEAD_CHUNKS = 4
_BATCH_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength
_LAST_OFFSET_DELTA = 23  # position of lastOffsetDelta in a batch


class RemoteRead(NamedTuple):
    data: bytes  # whole batches, as the local log would return them
    aborted: list[AbortedRange]  # the segment's aborted transactions (read_committed)


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
        self._last_chunk: dict[str, int] = {}  # object -> last chunk a reader asked for
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

    def read_ahead(self, key: str, number: int, size: int) -> None:
        """A reader asked for chunk `number`: if it moves forward through the object, start
        loading the next chunks in the background."""
        previous = self._last_chunk.get(key)
        self._last_chunk[key] = number
        if len(self._last_chunk) > 1024:
            self._last_chunk.pop(next(iter(self._last_chunk)))
        if previous is None or not previous <= number <= previous + 1:
            return
        last_chunk = (size - 1) // CHUNK_BYTES
        for ahead in range(number + 1, min(number + READ_AHEAD_CHUNKS, last_chunk) + 1):
            slot = (key, ahead)
            if slot in self._chunks or slot in self._loading:
                continue
            task = asyncio.ensure_future(self._prefetch(key, ahead, size))
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

    async def read_range(self, key: str, size: int, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object, through the chunks."""
        first, last = start // CHUNK_BYTES, (end - 1) // CHUNK_BYTES
        self.read_ahead(key, last, size)
        parts = [await self.chunk(key, n, size) for n in range(first, last + 1)]
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        base = first * CHUNK_BYTES
        return joined[start - base : end - base]

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
    done = False
    while not done and position < size:
        # A window past the start position: the batches wanted plus those skipped to reach
        # `offset` (at most one index interval) usually fit in one.
        end = min(size, position + max(max_bytes, LOG_OVERHEAD) + INDEX_INTERVAL_BYTES)
        window = memoryview(await cache.read_range(segment.object, size, position, end))
        at = 0
        while True:
            if at + LOG_OVERHEAD > len(window):
                break
            base, length = _BATCH_PREFIX.unpack_from(window, at)
            batch_size = length + LOG_OVERHEAD
            if base >= upto or (out and taken + batch_size > max_bytes):
                done = True
                break
            if at + batch_size > len(window):
                if at == 0:  # one batch larger than the window: read exactly it
                    whole = await cache.read_range(
                        segment.object, size, position, position + batch_size
                    )
                    window, at = memoryview(whole), 0
                    continue
                break
            batch = window[at : at + batch_size]
            if base + _last_offset_delta(batch) >= offset:
                out.append(batch)
                taken += batch_size
            at += batch_size
        position += at
        if at == 0:
            break
    aborted: list[AbortedRange] = []
    if segment.txn_index is not None:
        aborted = read_txn_index(await cache.small(segment.txn_index))
    return RemoteRead(b"".join(out), aborted)


def _last_offset_delta(batch: memoryview) -> int:
    return int.from_bytes(batch[_LAST_OFFSET_DELTA : _LAST_OFFSET_DELTA + 4], "big")
