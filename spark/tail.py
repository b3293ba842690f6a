"""The broker tail: the committed records a partition has not uploaded yet, read over HTTP.

Owns asking the brokers for a partition's last stable offset and reading an offset range with
read_committed as whole batches (aborted transactions already left out by the leader), decoded
by the same columnar walk as the bucket's segments.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pyarrow as pa

from raftline.api.codec import BATCH_CONTENT_TYPE
from raftline.clients.client import Client, RaftlineError
from raftline.clients.wire import messages_path
from raftline.spark.columns import record_batches

FETCH_BYTES = 8 * 1024 * 1024
ATTEMPTS = 20  # fetches answered by a node that is no longer the leader, before giving up
RETRY_WAIT_S = 0.25


class TailError(Exception):
    """The brokers could not serve the tail; the message says which partition and why."""


def _client(brokers: Sequence[str]) -> Client:
    return Client(",".join(brokers))


def last_stable_offset(brokers: Sequence[str], topic: str, partition: int) -> int:
    """The partition's last stable offset: read_committed readers see everything below it."""
    params = {"offset": "latest", "isolation": "read_committed", "max_messages": "1"}
    try:
        with _client(brokers) as client:
            answer = client.call("GET", messages_path(topic, partition), params=params)
    except (RaftlineError, OSError) as exc:
        raise TailError(f"{topic}-{partition}: brokers {', '.join(brokers)}: {exc}") from exc
    return int(answer["last_stable_offset"])


def read(
    brokers: Sequence[str],
    topic: str,
    partition: int,
    start: int,
    end: int,
    include_headers: bool,
) -> Iterator[pa.RecordBatch]:
    """Records of [start, end) that read_committed consumers see, as RecordBatches."""
    offset = start
    misses = 0
    with _client(brokers) as client:
        while offset < end:
            try:
                answer = client.fetch_batches(
                    topic, partition, offset, max_bytes=FETCH_BYTES, isolation="read_committed"
                )
            except (RaftlineError, OSError) as exc:
                raise TailError(f"{topic}-{partition} at {offset}: {exc}") from exc
            if answer.headers.get("content-type", "").split(";")[0] != BATCH_CONTENT_TYPE:
                misses += 1  # a forwarded (JSON) answer: the leader moved; ask again
                if misses == ATTEMPTS:
                    raise TailError(f"{topic}-{partition}: no leader answered with batches")
                client.metadata.invalidate(topic)
                time.sleep(RETRY_WAIT_S)
                continue
            next_offset = int(answer.headers["raftline-next-offset"])
            yield from record_batches(
                answer.raw,
                topic=topic,
                partition=partition,
                start_offset=offset,
                end_offset=end,
                include_headers=include_headers,
            )
            if next_offset <= offset:
                raise TailError(f"{topic}-{partition}: the brokers end at {offset}, before {end}")
            offset = next_offset
