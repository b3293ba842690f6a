"""The `raftline` PySpark data source: `spark.read.format("raftline")` and `readStream`.

Owns Spark's side of a read: the DataSource registered under the name `raftline`, the batch
reader (one input partition per slice of a segment object or of the broker tail) and the
stream reader (micro-batches of newly uploaded segments, per-partition offsets that Spark
checkpoints, maxOffsetsPerTrigger and Trigger.AvailableNow). Planning runs on Spark's driver
(plan.py); reading runs in Spark's Python workers and yields pyarrow RecordBatches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from raftline.spark import columns, options, tail
from raftline.spark.bucket import Bucket
from raftline.spark.plan import Offsets, Planner, SegmentSlice, Slice, from_json, to_json

NAME = "raftline"


class RaftlineDataSource(DataSource):
    """Kafka-source-shaped rows read straight from the bucket that Raftline brokers tier
    their segments to (tiered/FORMAT.md); see the README's Spark section for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        headers = options.include_headers(self.options)  # the rest is checked by the reader
        return columns.SPARK_DDL_WITH_HEADERS if headers else columns.SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(options.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(options.parse(self.options, streaming=True))


def register(spark: Any) -> None:
    """Make `format("raftline")` known to a SparkSession."""
    spark.dataSource.register(RaftlineDataSource)


class SliceSource:
    """What the batch and stream readers share: the driver's planner (made on first use, never
    shipped to workers) and the worker's read of one slice."""

    def __init__(self, read_options: options.ReadOptions) -> None:
        self.read_options = read_options
        self._planner: Planner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_planner": None}  # the driver's connections stay there

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.read_options)
        return self._planner

    def input_partitions(self, slices: Sequence[Slice]) -> list[InputPartition]:
        return [InputPartition(s) for s in slices]

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        piece: Slice | None = getattr(partition, "value", None)
        if piece is None:  # Spark reads one empty partition when partitions() found none
            return
        headers = self.read_options.include_headers
        if isinstance(piece, SegmentSlice):
            bucket = Bucket(self.read_options.bucket)
            try:
                data = bucket.get_range(piece.object_key, piece.byte_start, piece.byte_end)
                aborted = bucket.aborted(piece.txn_index)
            finally:
                bucket.close()
            yield from columns.record_batches(
                data,
                topic=piece.topic,
                partition=piece.partition,
                start_offset=piece.start_offset,
                end_offset=piece.end_offset,
                aborted=aborted,
                include_headers=headers,
            )
        else:
            yield from tail.read(
                self.read_options.broker_tail,
                piece.topic,
                piece.partition,
                piece.start_offset,
                piece.end_offset,
                headers,
            )


class BatchReader(SliceSource, DataSourceReader):
    def partitions(self) -> Sequence[InputPartition]:
        planner = self.planner
        planner.refresh()
        return self.input_partitions(planner.slices(planner.starting(), planner.ending()))


class StreamReader(SliceSource, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are {"topic": {"partition": next offset}}. latestOffset takes Spark 4.2+'s
    (start, limit) and Spark 4.0's no arguments alike: without a start it continues from the
    end it returned last."""

    def __init__(self, read_options: options.ReadOptions) -> None:
        super().__init__(read_options)
        self._position: Offsets | None = None  # the end latestOffset returned last
        self._target: Offsets | None = None  # Trigger.AvailableNow: read up to here, no further

    def initialOffset(self) -> dict[str, dict[str, int]]:
        planner = self.planner
        planner.refresh()
        self._position = planner.starting()
        return to_json(self._position)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.read_options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available()

    def _available(self) -> Offsets:
        planner = self.planner
        planner.refresh()
        latest = {tp: planner.latest(tp) for tp in planner.manifests}
        if self._target is not None:
            latest = {tp: min(end, self._target.get(tp, end)) for tp, end in latest.items()}
        return latest

    def latestOffset(
        self, start: dict | None = None, limit: ReadLimit | None = None
    ) -> dict[str, dict[str, int]]:
        if start is not None:
            begin = from_json(start)
        elif self._position is not None:
            begin = self._position
        else:
            begin = from_json(self.initialOffset())
        if limit is None:
            limit = self.getDefaultReadLimit()
        latest = self._available()
        planner = self.planner
        # partitions that appeared since (a new topic matching subscribePattern): from earliest
        begin = {**{tp: planner.earliest(tp) for tp in latest}, **begin}
        latest = {tp: max(end, begin[tp]) for tp, end in latest.items()}
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = Planner.capped(begin, latest, cap)
        self._position = {**begin, **end}
        return to_json(self._position)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        planner = self.planner
        if not planner.manifests:
            planner.refresh()
        stop = {tp: o for tp, o in from_json(end).items() if tp in planner.manifests}
        return self.input_partitions(planner.slices(from_json(start), stop))

    def commit(self, end: dict) -> None:
        """Nothing to release: the bucket's objects stay until retention removes them."""
