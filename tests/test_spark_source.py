"""The `raftline` Spark data source against a real local SparkSession and a real S3 server
(SeaweedFS): batch reads, offsets and splits, streaming, and bad options.

The buckets are written with tiered storage's own layout code (spark_harness.BucketWriter);
the expected rows come from the records the test built, not from the reader.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from seaweedfs import SeaweedServer
from spark_harness import BucketWriter, reader_options, row_tuple

from raftline.raftlog.records import (
    RAFT_NOOP,
    Codec,
    Record,
    build_batch,
    build_control_batch,
    build_txn_marker,
)

TS = 1_700_000_000_000


@dataclass
class Partition:
    batches: list[bytes]
    expected: list[tuple]  # (offset, key, value, headers, timestamp ms, timestamp type)


def generate(seed: int, batches: int = 40) -> Partition:
    """A partition's log with every codec, headers, null keys and values, offset gaps (as
    compaction leaves), Raft no-op control batches, LogAppendTime, and transactions of two
    producers, some committed and some aborted."""
    rng = random.Random(seed)
    out, expected = [], []
    offset = 0
    for n in range(batches):
        kind = rng.choice(["plain", "plain", "txn-commit", "txn-abort", "noop", "append-time"])
        codec = list(Codec)[n % len(Codec)]
        if kind == "noop":
            out.append(build_control_batch(RAFT_NOOP, b"", base_offset=offset, timestamp=TS))
            offset += 1
            continue
        records, rows = [], []
        delta = 0
        for i in range(rng.randint(1, 30)):
            key = None if rng.random() < 0.2 else b"key-%d" % rng.randint(0, 9)
            value = None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, 120))
            headers = [(f"h{j}", rng.choice([None, b"x" * j])) for j in range(rng.randint(0, 2))]
            stamp = TS + n * 1000 + i
            records.append(Record(value, key, headers, stamp, delta))
            rows.append([offset + delta, key, value, headers, stamp, 0])
            delta += rng.choice([1, 1, 1, 3])  # gaps: offsets compaction removed
        last = offset + records[-1].offset_delta
        if kind == "append-time":
            out.append(
                build_batch(records, base_offset=offset, codec=codec, log_append_time=TS + 7)
            )
            for row in rows:
                row[4], row[5] = TS + 7, 1
            expected += [tuple(r) for r in rows]
        elif kind.startswith("txn"):
            pid = 1000 + n % 2
            out.append(
                build_batch(
                    records,
                    base_offset=offset,
                    codec=codec,
                    producer_id=pid,
                    producer_epoch=0,
                    base_sequence=0,
                    transactional=True,
                )
            )
            commit = kind == "txn-commit"
            out.append(
                build_txn_marker(
                    commit, 0, producer_id=pid, producer_epoch=0, base_offset=last + 1, timestamp=TS
                )
            )
            if commit:
                expected += [tuple(r) for r in rows]
            last += 1
        else:
            out.append(build_batch(records, base_offset=offset, codec=codec))
            expected += [tuple(r) for r in rows]
        offset = last + 1
    return Partition(out, expected)


@pytest.fixture(scope="module")
def orders(seaweed: SeaweedServer, bucket: str) -> dict[int, Partition]:
    """Topic `orders`, 3 partitions, segments of about 4 KiB."""
    writer = BucketWriter(seaweed, bucket)
    writer.create_topic("orders", 3)
    data = {p: generate(seed=p) for p in range(3)}
    for p, partition in data.items():
        writer.upload("orders", p, partition.batches, segment_bytes=4096)
    return data


def load(spark, seaweed, bucket, **options):
    return spark.read.format("raftline").options(**reader_options(seaweed, bucket, **options))


def as_tuples(rows) -> list[tuple]:
    return sorted(row_tuple(r) for r in rows)


def expected_rows(data: dict[int, Partition]) -> list[tuple]:
    return sorted((p, *row) for p, partition in data.items() for row in partition.expected)


def test_a_batch_read_returns_exactly_the_committed_records(spark, seaweed, bucket, orders):
    df = load(spark, seaweed, bucket, subscribe="orders", includeHeaders="true").load()
    assert as_tuples(df.collect()) == expected_rows(orders)
    assert {r.topic for r in df.select("topic").distinct().collect()} == {"orders"}


def test_there_is_one_spark_partition_per_segment_object(spark, seaweed, bucket, orders):
    from raftline.spark.options import parse
    from raftline.spark.plan import Planner

    planner = Planner(parse(reader_options(seaweed, bucket, subscribe="orders"), streaming=False))
    segments = sum(len(m.segments) for m in planner.refresh().values())
    df = load(spark, seaweed, bucket, subscribe="orders").load()
    assert df.rdd.getNumPartitions() == segments > 3


def test_a_large_segment_is_split_by_its_offset_index_into_several_spark_partitions(spark, seaweed):
    bucket = seaweed.create_bucket()
    writer = BucketWriter(seaweed, bucket)
    writer.create_topic("big", 1)
    data = {0: generate(seed=9, batches=300)}
    writer.upload("big", 0, data[0].batches, segment_bytes=1 << 30)  # one segment object
    whole = load(spark, seaweed, bucket, subscribe="big", includeHeaders="true").load()
    split = load(
        spark, seaweed, bucket, subscribe="big", includeHeaders="true", maxPartitionBytes="32768"
    ).load()
    assert whole.rdd.getNumPartitions() == 1
    assert split.rdd.getNumPartitions() > 4
    assert as_tuples(split.collect()) == expected_rows(data)


def test_per_partition_offsets_json_bounds_the_range(spark, seaweed, bucket, orders):
    df = load(
        spark, seaweed, bucket, subscribe="orders", includeHeaders="true",
        startingOffsets='{"orders": {"0": 30, "1": -2, "2": -2}}',
        endingOffsets='{"orders": {"0": 90, "1": 50, "2": -1}}',
    ).load()  # fmt: skip
    got = as_tuples(df.collect())
    want = [r for r in expected_rows(orders) if (r[0], 30 <= r[1] < 90) == (0, True)]
    want += [r for r in expected_rows(orders) if r[0] == 1 and r[1] < 50]
    want += [r for r in expected_rows(orders) if r[0] == 2]
    assert got == sorted(want)


def test_assign_reads_only_the_listed_partitions(spark, seaweed, bucket, orders):
    df = load(spark, seaweed, bucket, assign='{"orders": [1]}').load()
    assert {r.partition for r in df.select("partition").distinct().collect()} == {1}
    assert df.count() == len(orders[1].expected)


def test_subscribe_pattern_matches_whole_topic_names(spark, seaweed, bucket, orders):
    assert load(spark, seaweed, bucket, subscribePattern="ord.*").load().count() == len(
        expected_rows(orders)
    )
    assert load(spark, seaweed, bucket, subscribePattern="ord").load().count() == 0


def test_starting_timestamp_starts_at_the_first_record_at_or_after_it(
    spark, seaweed, bucket, orders
):
    when = TS + 20 * 1000
    df = load(spark, seaweed, bucket, assign='{"orders": [0]}', startingTimestamp=str(when))
    first = min(r[0] for r in orders[0].expected if r[4] >= when and r[5] == 0)
    offsets = [r.offset for r in df.load().select("offset").collect()]
    assert min(offsets) == first


def error_of(spark, seaweed, bucket, **options) -> str:
    with pytest.raises(Exception) as caught:
        load(spark, seaweed, bucket, **options).load().count()
    return str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "missing"}, "unknown topic(s) missing in bucket"),
        ({"subscribe": "orders", "startingOffsets": "{oops"}, "startingOffsets is neither"),
        ({"subscribe": "orders", "endingOffsets": '{"orders": {"0": "x"}}'}, "endingOffsets:"),
        ({"subscribe": "orders", "kafka.bootstrap.servers": "x:9092"}, "unknown option(s)"),
        ({"startingOffsets": "earliest"}, "set exactly one of subscribe"),
        ({"subscribe": "orders", "startingOffsets": "latest"}, "makes no sense for a batch"),
    ],
)
def test_bad_options_fail_with_a_message_naming_the_problem(
    spark, seaweed, bucket, orders, options, message
):
    text = error_of(spark, seaweed, bucket, **options)
    assert message in text
    assert "at org.apache" not in text  # a Python message, not a stack of Java frames


def test_an_unreachable_bucket_fails_with_a_message_naming_the_endpoint(spark, seaweed, bucket):
    options = reader_options(seaweed, bucket, subscribe="orders")
    options["s3.endpoint"] = "http://127.0.0.1:1"
    with pytest.raises(Exception) as caught:
        spark.read.format("raftline").options(**options).load().count()
    text = str(caught.value)
    assert "cannot list topics in bucket" in text and "http://127.0.0.1:1" in text
    assert "at org.apache" not in text


def test_offsets_removed_by_retention_fail_unless_fail_on_data_loss_is_off(spark, seaweed):
    bucket = seaweed.create_bucket()
    writer = BucketWriter(seaweed, bucket)
    writer.create_topic("old", 1)
    batches = [build_batch([b"v"] * 10, base_offset=b * 10, timestamp=TS) for b in range(6)]
    writer.upload("old", 0, batches, segment_bytes=200)
    writer.truncate("old", 0, 20)
    start = '{"old": {"0": 0}}'
    text = error_of(spark, seaweed, bucket, subscribe="old", startingOffsets=start)
    assert "below the bucket's start 20" in text
    df = load(
        spark, seaweed, bucket, subscribe="old", startingOffsets=start, failOnDataLoss="false"
    )
    assert sorted(r.offset for r in df.load().collect()) == list(range(20, 60))


def stream_reader(seaweed, bucket, **options):
    from raftline.spark.options import parse
    from raftline.spark.source import StreamReader

    return StreamReader(parse(reader_options(seaweed, bucket, **options), streaming=True))


def test_a_stream_starts_at_latest_by_default_and_at_earliest_when_asked(seaweed, bucket, orders):
    ends = {str(p): orders[p].batches and None for p in range(3)}
    latest = stream_reader(seaweed, bucket, subscribe="orders").initialOffset()
    earliest = stream_reader(
        seaweed, bucket, subscribe="orders", startingOffsets="earliest"
    ).initialOffset()
    assert set(latest["orders"]) == set(ends)
    assert all(latest["orders"][p] > earliest["orders"][p] == 0 for p in ends)


@pytest.mark.parametrize("signature", ["spark-4.0: latestOffset()", "4.2+: (start, limit)"])
def test_max_offsets_per_trigger_moves_every_partition_and_never_past_the_end(
    seaweed, bucket, orders, signature
):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    reader = stream_reader(
        seaweed, bucket, subscribe="orders", startingOffsets="earliest", maxOffsetsPerTrigger="30"
    )
    start = reader.initialOffset()
    final = stream_reader(seaweed, bucket, subscribe="orders").initialOffset()
    seen = []
    for _ in range(100):
        if signature.startswith("spark-4.0"):
            end = reader.latestOffset()
        else:
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            assert reader.getDefaultReadLimit() == ReadMaxRows(30)
        moved = sum(end["orders"][p] - start["orders"][p] for p in end["orders"])
        assert moved <= 30
        if moved == 0:
            break
        seen.append(end)
        start = end
    assert start == final
    assert len(seen) > 3


def test_read_all_available_ignores_max_offsets_per_trigger(seaweed, bucket, orders):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = stream_reader(
        seaweed, bucket, subscribe="orders", startingOffsets="earliest", maxOffsetsPerTrigger="5"
    )
    start = reader.initialOffset()
    final = stream_reader(seaweed, bucket, subscribe="orders").initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == final


def test_available_now_stops_at_what_was_there_when_it_began(seaweed):
    bucket = seaweed.create_bucket()
    writer = BucketWriter(seaweed, bucket)
    writer.create_topic("grow", 1)
    writer.upload("grow", 0, [build_batch([b"a"] * 10, base_offset=0, timestamp=TS)])
    reader = stream_reader(seaweed, bucket, subscribe="grow", startingOffsets="earliest")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    writer.upload("grow", 0, [build_batch([b"b"] * 10, base_offset=10, timestamp=TS)])
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == {"grow": {"0": 10}}
    after = stream_reader(seaweed, bucket, subscribe="grow").initialOffset()
    assert after == {"grow": {"0": 20}}
