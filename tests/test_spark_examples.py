"""spark/examples/ run against a bucket: what each job computes is what its records say."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from spark_harness import BucketWriter, reader_options

from raftline.raftlog.records import Record, build_batch

EXAMPLES = Path(__file__).resolve().parent.parent / "spark" / "examples"


@pytest.fixture(scope="module")
def examples() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


def test_counts_per_key_counts_every_committed_record_of_the_topic(spark, seaweed, examples):
    from counts_per_key import counts_per_key

    bucket = seaweed.create_bucket()
    writer = BucketWriter(seaweed, bucket)
    writer.create_topic("clicks", 2)
    keys = {p: [f"user-{(i * (p + 3)) % 7}".encode() for i in range(300)] for p in range(2)}
    for p, partition_keys in keys.items():
        batches = [
            build_batch([Record(b"v", key=k) for k in partition_keys[i : i + 50]], base_offset=i)
            for i in range(0, 300, 50)
        ]
        writer.upload("clicks", p, batches, segment_bytes=2048)
    got = {
        r.key: r["count"]
        for r in counts_per_key(spark, reader_options(seaweed, bucket), "clicks").collect()
    }
    want = Counter(k.decode() for ks in keys.values() for k in ks)
    assert got == dict(want)


def test_streaming_to_parquet_writes_the_per_minute_counts_of_closed_windows(
    spark, seaweed, examples, tmp_path
):
    from streaming_to_parquet import start

    bucket = seaweed.create_bucket()
    writer = BucketWriter(seaweed, bucket)
    writer.create_topic("events", 1)
    minute = 60_000
    base = 1_700_000_000_000 // minute * minute
    stamps = [base + i * 1200 for i in range(500)]  # in order: none later than the watermark
    records = [Record(b"v", key=b"k%d" % (i % 3), timestamp=t) for i, t in enumerate(stamps)]
    batches = [build_batch(records[i : i + 50], base_offset=i) for i in range(0, 500, 50)]
    writer.upload("events", 0, batches, segment_bytes=4096)
    args = SimpleNamespace(
        topic="events", max_offsets=120, once=True,
        output=str(tmp_path / "out"), checkpoint=str(tmp_path / "checkpoint"),
    )  # fmt: skip
    query = start(spark, reader_options(seaweed, bucket), args)
    query.awaitTermination(300)
    assert query.exception() is None
    written = spark.read.parquet(args.output).collect()
    want = Counter(((t // minute) * minute, f"k{i % 3}") for i, t in enumerate(stamps))
    got = {(int(r.minute.timestamp() * 1000), r.key): r["count"] for r in written}
    assert got  # windows the watermark closed were written
    assert all(want[window] == count for window, count in got.items())
