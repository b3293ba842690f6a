"""Planning a read: which topic-partitions, which offset range of each, and the slices (byte
ranges of segment objects, or a broker tail) that Spark tasks read.

Owns resolving a subscription and offset options against the bucket's topics and manifests,
per-partition offsets as Spark checkpoints them ({"topic": {"partition": offset}}), the
maxOffsetsPerTrigger split, and cutting segments into slices by their offset index. Runs on
Spark's driver; knows nothing of Spark itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from raftline.spark import tail
from raftline.spark.bucket import Bucket, Manifest, TopicObject
from raftline.spark.columns import record_batches
from raftline.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, ReadOptions
from raftline.tiered.manifest import SegmentMeta

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


@dataclass(frozen=True)
class SegmentSlice:
    """Bytes [byte_start, byte_end) of a segment object: whole batches, whose records in
    [start_offset, end_offset) are rows."""

    topic: str
    partition: int
    object_key: str
    byte_start: int
    byte_end: int
    start_offset: int
    end_offset: int
    txn_index: str | None


@dataclass(frozen=True)
class TailSlice:
    """Offsets [start_offset, end_offset) of a partition not uploaded yet, read from the brokers
    with read_committed."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int


Slice = SegmentSlice | TailSlice


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Offsets as Spark checkpoints them (the Kafka source's layout)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(offsets: dict[str, dict[str, int]]) -> Offsets:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


class Planner:
    """The driver's view of the subscribed partitions; manifests are read again on refresh()."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.bucket = Bucket(options.bucket)
        self.manifests: dict[TopicPartition, Manifest] = {}

    # ---- what to read -------------------------------------------------------------------

    def refresh(self) -> dict[TopicPartition, Manifest]:
        topics = self.bucket.topics()
        selected = self._select(topics)
        self.manifests = {(topic.topic, p): self.bucket.manifest(topic, p) for topic, p in selected}
        return self.manifests

    def _select(self, topics: dict[str, TopicObject]) -> list[tuple[TopicObject, int]]:
        kind, value = self.options.subscription
        where = f"bucket {self.options.bucket.bucket!r}"
        known = ", ".join(sorted(topics)) or "none"
        if kind == "pattern":
            names = [t for t in sorted(topics) if value.fullmatch(t)]  # type: ignore[union-attr]
            return [(topics[t], p) for t in names for p in range(topics[t].partitions)]
        wanted = value if kind == "subscribe" else list(value)  # type: ignore[arg-type]
        missing = [t for t in wanted if t not in topics]
        if missing:
            raise OptionError(
                f"unknown topic(s) {', '.join(missing)} in {where} (topics there: {known}); "
                "a topic appears once its first segment is uploaded"
            )
        if kind == "subscribe":
            return [(topics[t], p) for t in wanted for p in range(topics[t].partitions)]
        chosen = []
        for t, partitions in value.items():  # type: ignore[union-attr]
            for p in partitions:
                if p >= topics[t].partitions:
                    raise OptionError(f"assign: topic {t!r} has {topics[t].partitions} partitions")
                chosen.append((topics[t], p))
        return chosen

    # ---- offsets -----------------------------------------------------------------------

    def earliest(self, tp: TopicPartition) -> int:
        return self.manifests[tp].start_offset

    def latest(self, tp: TopicPartition) -> int:
        """The end of what can be read now: the bucket's next offset, or with the broker
        tail the partition's last stable offset."""
        end = self.manifests[tp].next_offset
        if self.options.broker_tail:
            end = max(end, tail.last_stable_offset(self.options.broker_tail, *tp))
        return end

    def starting(self) -> Offsets:
        if self.options.starting_timestamp is not None:
            return {tp: self._offset_for_time(tp) for tp in self.manifests}
        return self._resolve(self.options.starting, "startingOffsets", EARLIEST)

    def ending(self) -> Offsets:
        return self._resolve(self.options.ending, "endingOffsets", LATEST)

    def _resolve(self, spec: OffsetSpec, name: str, default: int) -> Offsets:
        if isinstance(spec, dict):
            extra = [
                f"{t}-{p}"
                for t, parts in spec.items()
                for p in parts
                if (t, p) not in self.manifests
            ]
            if extra:
                raise OptionError(f"{name} names partitions not subscribed: {', '.join(extra)}")
        resolved = {}
        for tp in self.manifests:
            wanted = spec.get(tp[0], {}).get(tp[1], default) if isinstance(spec, dict) else spec
            if wanted == EARLIEST:
                resolved[tp] = self.earliest(tp)
            elif wanted == LATEST:
                resolved[tp] = self.latest(tp)
            else:
                resolved[tp] = wanted
        return resolved

    def _offset_for_time(self, tp: TopicPartition) -> int:
        """The first offset whose record has a timestamp >= startingTimestamp (the end of the
        bucket when none has)."""
        when = self.options.starting_timestamp
        assert when is not None
        manifest = self.manifests[tp]
        for segment in manifest.segments:
            if segment.max_timestamp < when or segment.last_offset < manifest.start_offset:
                continue
            data = self.bucket.get(segment.object)
            aborted = self.bucket.aborted(segment.txn_index)
            micros = when * 1000
            for batch in record_batches(
                data,
                topic=tp[0],
                partition=tp[1],
                start_offset=manifest.start_offset,
                aborted=aborted,
            ):
                stamps = batch.column("timestamp").cast("int64").to_pylist()
                for i, stamp in enumerate(stamps):
                    if stamp >= micros:
                        return int(batch.column("offset")[i].as_py())
        return self.latest(tp)

    def check_range(self, tp: TopicPartition, start: int, end: int) -> int:
        """The start to read from, after checking [start, end) against what exists."""
        manifest = self.manifests[tp]
        topic, partition = tp
        if start < manifest.start_offset:
            if self.options.fail_on_data_loss:
                raise OptionError(
                    f"{topic}-{partition}: offset {start} is below the bucket's start "
                    f"{manifest.start_offset} (removed by retention); set failOnDataLoss=false "
                    "to start there instead"
                )
            start = manifest.start_offset
        if end < start:
            raise OptionError(f"{topic}-{partition}: ending offset {end} is below start {start}")
        return start

    # ---- slices ------------------------------------------------------------------------

    def slices(self, start: Offsets, end: Offsets) -> list[Slice]:
        out: list[Slice] = []
        for tp, stop in sorted(end.items()):
            begin = self.check_range(tp, start.get(tp, self.earliest(tp)), stop)
            out += self._partition_slices(tp, begin, stop)
        return out

    def _partition_slices(self, tp: TopicPartition, start: int, end: int) -> Iterable[Slice]:
        if start >= end:
            return
        manifest = self.manifests[tp]
        bucket_end = min(end, manifest.next_offset)
        for segment in manifest.segments:
            if segment.last_offset >= start and segment.base_offset < bucket_end:
                yield from self._segment_slices(tp, segment, start, bucket_end)
        tail_start = max(start, manifest.next_offset)
        if end > tail_start:
            if not self.options.broker_tail:
                raise OptionError(
                    f"{tp[0]}-{tp[1]}: offsets up to {end} asked, the bucket ends at "
                    f"{manifest.next_offset}; set includeBrokerTail=true to read the rest"
                )
            yield TailSlice(tp[0], tp[1], tail_start, end)

    def _segment_slices(
        self, tp: TopicPartition, segment: SegmentMeta, start: int, end: int
    ) -> Iterable[SegmentSlice]:
        cuts = [0]
        limit = self.options.max_partition_bytes
        mid_start = start > segment.base_offset
        if segment.index and (segment.size_bytes > limit or mid_start):
            entries = self.bucket.offset_index(segment.index)
            if mid_start:
                # from the last indexed batch wholly before `start` (read, then skipped)
                before = [pos for rel, pos in entries if segment.base_offset + rel < start]
                cuts = [before[-1]] if before else [0]
            for _, position in entries:
                if position > cuts[-1] and position - cuts[-1] >= limit:
                    cuts.append(position)
        cuts.append(segment.size_bytes)
        for byte_start, byte_end in itertools.pairwise(cuts):
            if byte_end > byte_start:
                yield SegmentSlice(
                    tp[0],
                    tp[1],
                    segment.object,
                    byte_start,
                    byte_end,
                    start,
                    end,
                    segment.txn_index,
                )

    # ---- streaming limits --------------------------------------------------------------

    @staticmethod
    def capped(start: Offsets, latest: Offsets, max_offsets: int | None) -> Offsets:
        """`latest`, or when more than `max_offsets` offsets lie between `start` and it, an end
        that spreads max_offsets over the partitions in proportion to their backlog (every
        partition with a backlog moves by at least one)."""
        backlog = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
        total = sum(backlog.values())
        if max_offsets is None or total <= max_offsets:
            return dict(latest)
        capped = {}
        for tp, end in latest.items():
            begin = start.get(tp, end)
            share = backlog[tp] * max_offsets // total
            capped[tp] = min(end, begin + max(share, 1 if backlog[tp] else 0))
        return capped
