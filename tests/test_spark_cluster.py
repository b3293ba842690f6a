"""The `raftline` Spark source against what a real node uploaded: Spark's rows equal the
broker's read_committed fetch of the same range, record for record, for compressed batches and
transactions with aborts; the broker tail; streaming micro-batches with a checkpoint.

One `raftline serve` process tiers to a real SeaweedFS; Spark reads only the bucket (and the
brokers' HTTP API where a test asks for the tail).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, running_cluster
from seaweedfs import SeaweedServer
from spark_harness import reader_options, row_tuple

from raftline.clients.client import Client
from raftline.spark.options import parse
from raftline.spark.plan import Planner

pytestmark = pytest.mark.cluster

TIERED = {"remote.storage.enable": "true", "segment.bytes": "4096"}
PARTITIONS = 2


@pytest.fixture(scope="module")
def tiered_node(
    tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedServer, bucket: str
) -> Iterator[Cluster]:
    """One node uploading sealed segments to the bucket (flags through RAFTLINE_* env)."""
    env = {**seaweed.env(), "RAFTLINE_S3_ENDPOINT": seaweed.endpoint, "RAFTLINE_S3_BUCKET": bucket}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        with running_cluster(Path(tmp_path_factory.mktemp("node")), size=1) as cluster:
            yield cluster


def produce_mixed(client: Client, topic: str, rounds: int, tag: str) -> None:
    """Per round: zstd and gzip batches with keys and headers, a committed and an aborted
    transaction (lz4), on every partition."""
    plain = {c: client.producer(topic, compression=c, linger_ms=1) for c in ("zstd", "gzip")}
    txn = client.producer(topic, compression="lz4", transactional_id=f"{topic}-{tag}")
    for r in range(rounds):
        for p in range(PARTITIONS):
            for codec, producer in plain.items():
                for i in range(20):
                    headers = {"round": str(r), "codec": codec}
                    key = None if i % 7 == 0 else f"k{i % 5}"
                    producer.send(f"{tag}-{r}-{i}-{codec}" * 3, key, partition=p, headers=headers)
            for producer in plain.values():
                producer.flush()
        for outcome in ("commit", "abort"):
            for p in range(PARTITIONS):
                for i in range(10):
                    txn.send(f"{tag}-{r}-{i}-{outcome}", f"t{i}", partition=p)
            txn.commit() if outcome == "commit" else txn.abort()
    for producer in (*plain.values(), txn):
        producer.close()


def planner_for(seaweed: SeaweedServer, bucket: str, topic: str) -> Planner:
    planner = Planner(parse(reader_options(seaweed, bucket, subscribe=topic), streaming=False))
    planner.refresh()
    return planner


def wait_uploaded(seaweed, bucket, topic: str, at_least: int, timeout: float = 60) -> dict:
    """Waits until every partition's manifest reaches `at_least`; returns the next offsets."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            manifests = planner_for(seaweed, bucket, topic).manifests
        except Exception:  # the topic object is not there yet
            manifests = {}
        ends = {tp: m.next_offset for tp, m in manifests.items()}
        if len(ends) == PARTITIONS and min(ends.values()) >= at_least:
            return ends
        assert time.monotonic() < deadline, f"uploads reached only {ends}"
        time.sleep(0.5)


def broker_rows(client: Client, topic: str, partition: int, start: int, end: int) -> list[tuple]:
    """The broker's read_committed fetch of [start, end)."""
    rows: list[tuple] = []
    offset = start
    consumer = client.consumer(
        topic, partitions=[partition], offset=start, isolation="read_committed", wait_ms=0
    )
    while offset < end:
        for m in consumer.poll():
            if m.offset < end:
                rows.append((partition, m.offset, m.key, m.value, _headers(m), m.timestamp))
        before, offset = offset, consumer.positions.next[partition]
        if offset == before:
            break  # the partition ends before `end`
    return rows


def _headers(message: Any) -> list[tuple[str, bytes]]:
    return sorted((k, v.encode() if isinstance(v, str) else v) for k, v in message.headers.items())


def spark_rows(df) -> list[tuple]:
    """Rows as broker_rows makes them (the fetch answer has no timestamp type)."""
    return sorted(row_tuple(r)[:-1] for r in df.collect())


def test_spark_reads_exactly_the_brokers_read_committed_view_of_the_uploaded_range(
    spark: Any, seaweed: SeaweedServer, bucket: str, tiered_node: Cluster
) -> None:
    with Client(tiered_node.urls) as client:
        client.create_topic("mixed", PARTITIONS, config=TIERED)
        produce_mixed(client, "mixed", rounds=6, tag="a")
        ends = wait_uploaded(seaweed, bucket, "mixed", at_least=150)
        df = (
            spark.read.format("raftline")
            .options(**reader_options(seaweed, bucket, subscribe="mixed", includeHeaders="true"))
            .load()
        )
        got = spark_rows(df)
        want = sorted(
            row for (_, p), end in ends.items() for row in broker_rows(client, "mixed", p, 0, end)
        )
    assert got == want
    values = [row[3] for row in got]
    assert any(b"-commit" in v for v in values)
    assert not any(b"-abort" in v for v in values)  # aborted transactions never show


def test_the_broker_tail_adds_what_is_not_uploaded_yet(
    spark: Any, seaweed: SeaweedServer, bucket: str, tiered_node: Cluster
) -> None:
    with Client(tiered_node.urls) as client:
        client.create_topic("tailed", PARTITIONS, config=TIERED)
        produce_mixed(client, "tailed", rounds=6, tag="b")
        wait_uploaded(seaweed, bucket, "tailed", at_least=1)
        options = reader_options(
            seaweed, bucket, subscribe="tailed", includeHeaders="true",
            includeBrokerTail="true", brokers=tiered_node.urls,
        )  # fmt: skip
        df = spark.read.format("raftline").options(**options).load()
        got = spark_rows(df)
        ends = {
            p: int(client.call("GET", f"/v1/topics/tailed/partitions/{p}/messages",
                               params={"offset": "latest", "isolation": "read_committed"})
                   ["last_stable_offset"])
            for p in range(PARTITIONS)
        }  # fmt: skip
        want = sorted(
            row for p in range(PARTITIONS) for row in broker_rows(client, "tailed", p, 0, ends[p])
        )
        bucket_ends = {
            tp[1]: m.next_offset
            for tp, m in planner_for(seaweed, bucket, "tailed").manifests.items()
        }
    assert got == want
    assert any(ends[p] > bucket_ends[p] for p in range(PARTITIONS))  # the tail was not empty


def test_a_stream_turns_new_uploads_into_micro_batches_exactly_once(
    spark: Any, seaweed: SeaweedServer, bucket: str, tiered_node: Cluster, tmp_path: Path
) -> None:
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    options = reader_options(
        seaweed,
        bucket,
        subscribe="streamed",
        startingOffsets="earliest",
        # Cuts each run's backlog into a few micro-batches, each a Spark job of its own (100
        # made twice as many for the same proof).
        maxOffsetsPerTrigger="200",
    )

    def run_available_now() -> None:
        stream = spark.readStream.format("raftline").options(**options).load()
        query = (
            stream.select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None

    with Client(tiered_node.urls) as client:
        client.create_topic("streamed", PARTITIONS, config=TIERED)
        produce_mixed(client, "streamed", rounds=6, tag="c")
        first = wait_uploaded(seaweed, bucket, "streamed", at_least=100)
        run_available_now()
        produce_mixed(client, "streamed", rounds=6, tag="d")
        second = wait_uploaded(seaweed, bucket, "streamed", at_least=max(first.values()) + 100)
        run_available_now()
        written = spark.read.parquet(str(output))
        got = sorted((r.partition, r.offset, bytes(r.value)) for r in written.collect())
        assert len(got) == len(set(got))  # nothing twice across the two runs
        for p in range(PARTITIONS):
            read = [row for row in got if row[0] == p]
            # past its last row Spark read only aborted or control offsets, if any; and it read
            # at least what was uploaded before the second run
            end = max(read[-1][1] + 1, second[("streamed", p)])
            want = [(p, o, v) for _, o, _, v, _, _ in broker_rows(client, "streamed", p, 0, end)]
            assert read == want
    micro_batches = len([f for f in (checkpoint / "commits").iterdir() if f.name.isdigit()])
    assert micro_batches > 2  # maxOffsetsPerTrigger cut the backlog


def test_the_transform_write_back_example_produces_the_transformed_records(
    spark: Any, seaweed: SeaweedServer, bucket: str, tiered_node: Cluster
) -> None:
    examples = str(Path(__file__).resolve().parent.parent / "spark" / "examples")
    sys.path.insert(0, examples)
    try:
        from transform_write_back import transformed, write_back
    finally:
        sys.path.remove(examples)
    with Client(tiered_node.urls) as client:
        client.create_topic("source", PARTITIONS, config=TIERED)
        client.create_topic("target", 1)
        with client.producer("source", linger_ms=1) as producer:
            for i in range(600):
                producer.send("x" * (i % 40) + f"-{i}", f"k{i % 4}", partition=i % PARTITIONS)
        ends = wait_uploaded(seaweed, bucket, "source", at_least=100)
        upto = json.dumps({"source": {str(p): end for (_, p), end in ends.items()}})
        options = reader_options(seaweed, bucket, endingOffsets=upto)  # uploads go on meanwhile
        frame = transformed(spark, options, "source", min_bytes=30)
        write_back(frame, tiered_node.urls, "target")
        source = [
            r for (_, p), end in ends.items() for r in broker_rows(client, "source", p, 0, end)
        ]
        want = sorted(
            (key, value.decode().upper().encode(), f"source/{p}/{offset}".encode())
            for p, offset, key, value, _, _ in source
            if len(value) >= 30
        )
        got = sorted(
            (key, value, headers[0][1])
            for _, _, key, value, headers, _ in broker_rows(client, "target", 0, 0, 2**62)
        )
    assert got == want and want
