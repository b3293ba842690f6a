"""The read_committed view of a range of a partition's log, as a Kafka consumer computes it.

Owns dropping the batches of aborted transactions (given the aborted list a fetch returns) and
every control batch from a fetched range that ends at or below the last stable offset.
Invariants: a data batch is dropped exactly when its producer's transaction containing it was
aborted (it lies in [first_offset, last_offset] of an aborted entry of its producer id, before
that producer's abort marker); non-transactional batches and committed transactions pass.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from .markers import BatchMeta
from .producer_state import AbortedTxn

T = TypeVar("T")


def read_committed(
    batches: Iterable[tuple[int, BatchMeta, T]], aborted: Sequence[AbortedTxn]
) -> Iterator[T]:
    """The payloads of the (base offset, meta, payload) batches, in log order, that a
    read_committed reader sees. `aborted`: the aborts with data in [range start, LSO), from the
    log's transaction index (raftlog/txnindex.py) or the bucket's copy of it."""
    pending = [(a.first_offset, a.producer_id) for a in aborted]
    heapq.heapify(pending)
    aborting: set[int] = set()
    for base_offset, meta, payload in batches:
        last_offset = base_offset + meta.last_offset_delta
        while pending and pending[0][0] <= last_offset:
            aborting.add(heapq.heappop(pending)[1])
        if meta.is_control:
            if meta.marker is not None and not meta.marker.commit:
                aborting.discard(meta.producer_id)
            continue
        if meta.is_transactional and meta.producer_id in aborting:
            continue
        yield payload
