"""Consume, transform, write back: read a topic from the bucket, keep and reshape some records,
and produce them to another Raftline topic through the brokers' HTTP API.

    python spark/examples/transform_write_back.py --s3-endpoint URL --bucket B --topic orders \
        --brokers http://127.0.0.1:8080 --to orders-large --min-bytes 100

Each Spark task sends its rows with an idempotent producer (a retried request is never
written twice). A failed task that Spark runs again sends its rows again: for exactly-once
output, make the target topic compacted on a unique key, or use the transactional producer
(transactional_id per Spark partition) and read the target with isolation=read_committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from common import parser, session, source_options
from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def transformed(spark: Any, options: dict[str, str], topic: str, min_bytes: int) -> DataFrame:
    """Records whose value has at least min_bytes bytes, value upper-cased, a header naming
    where each came from."""
    records = spark.read.format("raftline").options(**options, subscribe=topic).load()
    return records.where(F.length("value") >= min_bytes).select(
        "key",
        F.upper(F.col("value").cast("string")).alias("value"),
        F.concat_ws("/", "topic", "partition", "offset").alias("source"),
    )


def write_back(frame: DataFrame, brokers: str, target: str) -> None:
    def send_partition(rows: Iterator[Any]) -> None:
        from raftline.clients.client import Client

        with Client(brokers) as client, client.producer(target, idempotent=True) as producer:
            for row in rows:
                producer.send(row.value, row.key, headers={"source": row.source})

    frame.foreachPartition(send_partition)


if __name__ == "__main__":
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--brokers", required=True, help="HTTP URLs of Raftline nodes, comma-separated")
    p.add_argument("--to", required=True, help="the topic to write to (must exist)")
    p.add_argument("--min-bytes", type=int, default=0)
    args = p.parse_args()
    spark = session("raftline-transform-write-back")
    write_back(
        transformed(spark, source_options(args), args.topic, args.min_bytes), args.brokers, args.to
    )
    spark.stop()
