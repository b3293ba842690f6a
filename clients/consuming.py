"""The consumer's decisions, written once for both shells: which partitions, from where, how long.

Owns the consumer's positions (next offset per partition), the order of its fetches (every
partition without waiting, then one long poll in turn when none had anything) and their
direction to each partition's leader. No I/O here: `polled` is an Op the shell drives.
"""

from __future__ import annotations

import itertools
from typing import Any

from raftline.clients.core import ClientApi, ClientCore, Op, Returns
from raftline.clients.streaming import StreamCursor, batch_frame
from raftline.clients.wire import (
    FetchedValues,
    FetchResult,
    Message,
    RaftlineError,
    fetch_answer,
    fetched_values,
    json_message,
    topic_path,
)

MAX_FRAME = 1 << 30  # a binary stream frame holds what its credit allowed: decode all of it


class Positions:
    """Per-partition next offsets of a consumer and which partition long-polls next."""

    def __init__(self, partitions: list[int], start: int | str) -> None:
        self.next: dict[int, int | str] = dict.fromkeys(partitions, start)
        self._turn = itertools.cycle(partitions)

    def advance(self, partition: int, result: FetchResult | FetchedValues) -> None:
        self.next[partition] = result.next_offset

    def long_poll_partition(self) -> int:
        return next(self._turn)


class ConsumerCore:
    """Reads partitions of a topic by offset (all of them unless `partitions` names some)."""

    def __init__(
        self,
        client: ClientCore,
        topic: str,
        *,
        partitions: list[int] | None = None,
        offset: int | str = "earliest",
        wait_ms: int = 1000,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        isolation: str = "read_uncommitted",
        filter: str | None = None,
        stream: bool = False,
        prefetch: int | None = None,
    ) -> None:
        """`isolation="read_committed"`: only messages of committed transactions (and
        non-transactional ones), up to each partition's last stable offset. `filter`: only
        the records this expression matches (README "Filters"; the node skips the others).
        `stream=True`: the node pushes messages over a WebSocket as they come, at most
        `prefetch` (default max_messages) ahead of what poll has returned; where the server
        or a proxy does not allow it, the consumer long-polls."""
        if isolation not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                f"isolation must be read_uncommitted or read_committed, not {isolation!r}"
            )
        self.isolation = isolation
        self.client = client
        self.topic = topic
        self._partitions = partitions
        self._start = offset
        self.positions: Positions | None = None
        self.wait_ms = wait_ms
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.record_filter = filter
        self.stream = StreamCursor(stream, prefetch or max_messages, client.nodes)

    def positioned(self) -> Op[Positions]:
        """The positions, made at the first call (looking the partition count up if needed)."""
        if self.positions is None:
            chosen = self._partitions
            if chosen is None:
                chosen = list(range((yield from self.client.counted(self.topic))))
            self.positions = Positions(chosen, self._start)
        return self.positions

    def _fetched(self, partition: int, wait_ms: int, values: bool) -> Op[list[Any]]:
        positions = yield from self.positioned()
        client, topic = self.client, self.topic

        def fetch(url: str | None) -> Op[FetchResult | FetchedValues]:
            offset = positions.next[partition]
            return client.fetched(
                topic,
                partition,
                offset,
                self.max_messages,
                self.max_bytes,
                wait_ms,
                url,
                values,
                self.isolation,
                self.record_filter,
            )

        result = yield from client.to_leader(topic, partition, fetch)
        positions.advance(partition, result)
        return result.values if isinstance(result, FetchedValues) else result.messages

    def polled(self, values: bool) -> Op[list[Any]]:
        """Whatever is available on every partition; long-polls one partition when none has
        any (or waits for the stream's next frame). With `values`, only the values."""
        if self.stream.active():
            streamed = yield from self._streamed(values)
            if streamed is not None:
                return streamed
        positions = yield from self.positioned()
        if len(positions.next) == 1:  # its long poll answers at once when data is there
            partition = positions.long_poll_partition()
            return (yield from self._fetched(partition, self.wait_ms, values))
        found: list[Any] = []
        for partition in list(positions.next):
            found += yield from self._fetched(partition, 0, values)
        if found or self.wait_ms == 0:
            return found
        partition = positions.long_poll_partition()
        return (yield from self._fetched(partition, self.wait_ms, values))

    def _streamed(self, values: bool) -> Op[list[Any] | None]:
        """The next frame of the stream, opened from the positions when it is not open; None
        when the upgrade was refused (then long-poll). A lost stream answers nothing now and
        is opened again at the next poll from the positions reached: nothing is skipped or
        repeated."""
        positions = yield from self.positioned()
        params = {
            "partitions": ",".join(str(p) for p in positions.next),
            "max_messages": str(self.max_messages),
            "max_bytes": str(self.max_bytes),
            "isolation": self.isolation,
            **{f"offset.{p}": str(offset) for p, offset in positions.next.items()},
        }
        if self.record_filter is not None:
            params["filter"] = self.record_filter
        elif self.client.wire == "batch":
            params["format"] = "batches"  # records read on the node come as stored
        path = topic_path(self.topic, "stream")
        if not (yield from self.stream.opened(path, params)):
            return None
        try:
            frame = yield from self.stream.frame(self.wait_ms / 1000)
        except RaftlineError as error:
            if error.retryable:
                return []
            raise
        if frame is None:
            return []
        if isinstance(frame, bytes):
            partition, next_offset, answer = batch_frame(frame)
            offset = positions.next[partition]
            if values:
                got = fetched_values(answer, offset, MAX_FRAME)
                found: list[Any] = got.values
            else:
                found = fetch_answer(answer, partition, offset, MAX_FRAME).messages
            positions.next[partition] = next_offset
            self.stream.consumed(len(found))
            return found
        for item in frame.get("positions", ()):
            if item.get("offset") is not None and int(item["partition"]) in positions.next:
                positions.next[int(item["partition"])] = int(item["offset"])
        messages = [json_message(m) for m in frame.get("messages", ())]
        self.stream.consumed(len(messages))  # all of them are returned now
        return [m.value for m in messages] if values else messages

    def stopped(self) -> Op[None]:
        yield from self.stream.shut()


class ConsumerApi(ConsumerCore):
    """The polls of Consumer and AsyncConsumer, written once (see ClientApi)."""

    client: ClientApi

    def poll(self) -> Returns[list[Message]]:
        """Whatever is available on every partition; long-polls one partition when none has
        any."""
        return self.client._run(self.polled(values=False))

    def poll_values(self) -> Returns[list[bytes | None]]:
        """As poll, but only the values in offset order per partition (no Message objects).
        Decoding still makes a few objects per record: at hundreds of thousands of messages a
        second, raise the collector's thresholds (gc.set_threshold) in the consuming process."""
        return self.client._run(self.polled(values=True))

    def close(self) -> Returns[None]:
        """Close the consumer's stream, if it has one."""
        return self.client._run(self.stopped())
