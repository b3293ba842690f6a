"""Reading a topic straight from the bucket: the `raftline` Spark source against a plain Python
loop that downloads and decodes the same segment objects.

Owns issue 17's speed measurement. Run from the repository root:
`python -m bench.spark_read [--records 1000000] [--value-bytes 100] [--codec none]`
(starts and stops `weed mini` and a local[2] SparkSession). Rows, in the same run:
- spark: `spark.read.format("raftline")` summing length(value) over every record, best of
  --runs after --warmups queries of each Spark source (the first starts the Python workers,
  the next ones let the JVM compile the scan and the aggregation: the first queries of a
  fresh SparkSession run several times slower);
- columnar loop: one Python process downloads each object and walks it with the Spark
  source's decoder (spark/columns.py, C), no Spark;
- plain loop: one Python process downloads each object and decodes it with
  raftlog.records.iter_batches into record objects, skipping control batches;
- spark ceiling: the same Spark query over a data source whose workers yield one prebuilt
  RecordBatch of the same rows again and again: what Spark itself takes in from Python
  workers on this machine, with no download and no decoding;
- query fixed cost: the ceiling query over 2 rows, the seconds every Spark query pays
  whatever it reads (planning in a Python process on the driver, scheduling the tasks).
The readers take turns within each run, so a change of the machine's load hits them alike.
records/s counts data records; MB/s counts segment object bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from raftline.raftlog.records import Codec, Record, build_batch, iter_batches
from raftline.spark.bucket import Bucket
from raftline.spark.columns import SPARK_DDL, record_batches
from raftline.spark.options import parse
from raftline.spark.plan import Planner
from tests.seaweedfs import running_seaweedfs
from tests.spark_harness import BucketWriter, local_spark_session, reader_options

TOPIC = "bench"
RECORDS_PER_BATCH = 1000


def write_topic(writer: BucketWriter, records: int, value_bytes: int, codec: Codec, parts: int):
    writer.create_topic(TOPIC, parts)
    value = os.urandom(value_bytes)
    per_partition = records // parts
    for p in range(parts):
        batches = [
            build_batch(
                [Record(value, key=b"key-%d" % (i % 100)) for i in range(RECORDS_PER_BATCH)],
                base_offset=base,
                codec=codec,
            )
            for base in range(0, per_partition, RECORDS_PER_BATCH)
        ]
        writer.upload(TOPIC, p, batches, segment_bytes=32 << 20)


def objects(options: dict[str, str]) -> list[str]:
    planner = Planner(parse({**options, "subscribe": TOPIC}, streaming=False))
    return [s.object for m in planner.refresh().values() for s in m.segments]


def downloaded(options: dict[str, str], keys: list[str]) -> Iterator[bytes]:
    """Each segment object's bytes, one GET after the other."""
    bucket = Bucket(parse({**options, "subscribe": TOPIC}, streaming=False).bucket)
    for key in keys:
        yield bucket.get(key)


def columnar_loop(options: dict[str, str], keys: list[str]) -> tuple[int, int]:
    rows = size = 0
    for data in downloaded(options, keys):
        size += len(data)
        rows += sum(b.num_rows for b in record_batches(data, topic=TOPIC, partition=0))
    return rows, size


def plain_loop(options: dict[str, str], keys: list[str]) -> tuple[int, int]:
    rows = size = 0
    for data in downloaded(options, keys):
        size += len(data)
        rows += sum(len(b.records) for b in iter_batches(data) if not b.header.is_control)
    return rows, size


def spark_query(spark, options: dict[str, str]) -> int:
    df = spark.read.format("raftline").options(**options, subscribe=TOPIC).load()
    (row,) = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()
    return int(row.n)


class CeilingSource(DataSource):
    """Spark's intake of Arrow batches from Python workers: the raftline schema, rows that
    cost nothing to make (one decoded batch yielded again and again)."""

    @classmethod
    def name(cls) -> str:
        return "raftline_ceiling"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return CeilingReader(int(self.options["rows"]), int(self.options["parts"]))


class CeilingReader(DataSourceReader):
    def __init__(self, rows: int, parts: int) -> None:
        self.rows, self.parts = rows, parts

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        value = bytes(100)
        records = [Record(value, key=b"key-%d" % (i % 100)) for i in range(RECORDS_PER_BATCH)]
        data = b"".join(
            build_batch(records, base_offset=b) for b in range(0, 65_536, RECORDS_PER_BATCH)
        )
        (batch,) = record_batches(data, topic=TOPIC, partition=0, max_rows=1 << 20)
        left = self.rows // self.parts
        while left > 0:
            yield batch.slice(0, min(left, batch.num_rows))
            left -= batch.num_rows


def ceiling_query(spark: Any, rows: int) -> int:
    df = spark.read.format("raftline_ceiling").options(rows=str(rows), parts="4").load()
    (row,) = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()
    return int(row.n)


def timed_in_turns(readers: dict[str, Callable[[], tuple[int, int]]], runs: int):
    """Each reader's (best seconds, median seconds, its last result), the readers taking
    turns within each run."""
    times: dict[str, list[float]] = {name: [] for name in readers}
    results: dict[str, tuple[int, int]] = {}
    for _ in range(runs):
        for name, call in readers.items():
            start = time.perf_counter()
            results[name] = call()
            times[name].append(time.perf_counter() - start)
    return {name: (min(t), statistics.median(t), results[name]) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--codec", choices=[c.name.lower() for c in Codec], default="none")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=3)
    args = parser.parse_args()
    codec = Codec[args.codec.upper()]
    # Spark's Python workers import this module (CeilingSource) from the repository root.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_seaweedfs(Path(tmp) / "weed") as server,
        local_spark_session() as spark,
    ):
        bucket = server.create_bucket()
        writer = BucketWriter(server, bucket)
        write_topic(writer, args.records, args.value_bytes, codec, args.partitions)
        options = reader_options(server, bucket)
        keys = objects(options)
        total = sum(len(data) for data in downloaded(options, keys))
        spark.dataSource.register(CeilingSource)
        for _ in range(args.warmups):
            spark_query(spark, options)
            ceiling_query(spark, args.records)
        load_before = os.getloadavg()[0]
        timings = timed_in_turns(
            {
                "spark (local[2])": lambda: (spark_query(spark, options), total),
                "columnar loop (1 process)": lambda: columnar_loop(options, keys),
                "plain loop (1 process)": lambda: plain_loop(options, keys),
                "spark ceiling (no I/O)": lambda: (ceiling_query(spark, args.records), total),
                "query fixed cost": lambda: (ceiling_query(spark, 2), 0),
            },
            args.runs,
        )
    fixed_best, fixed_median, _ = timings.pop("query fixed cost")
    load_after = os.getloadavg()[0]
    print(
        f"{args.records} records of {args.value_bytes} B, codec {args.codec}, "
        f"{len(keys)} segment objects, {total / 1e6:.1f} MB; best of {args.runs}; "
        f"load average {load_before:.1f} before, {load_after:.1f} after; "
        f"Python {sys.version.split()[0]}"
    )
    print(f"| {'reader':<26} | records/s (best) | MB/s (best) | records/s (median) |")
    print(f"|{'-' * 28}|------------------|-------------|--------------------|")
    for name, (best, median, (count, size)) in timings.items():
        assert count == args.records // args.partitions * args.partitions, (name, count)
        print(
            f"| {name:<26} | {count / best:>16,.0f} | {size / best / 1e6:>11.1f} "
            f"| {count / median:>18,.0f} |"
        )
    print(
        f"Spark query fixed cost (ceiling source, 2 rows): {fixed_best:.2f} s best, "
        f"{fixed_median:.2f} s median"
    )


if __name__ == "__main__":
    main()
