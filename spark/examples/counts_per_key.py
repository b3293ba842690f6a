"""Counts of records per key over a whole topic, read straight from the bucket.

python spark/examples/counts_per_key.py --s3-endpoint URL --bucket B --topic orders
"""

from __future__ import annotations

from typing import Any

from common import parser, session, source_options
from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def counts_per_key(spark: Any, options: dict[str, str], topic: str) -> DataFrame:
    """(key as text, count), most frequent first; the committed records only."""
    records = spark.read.format("raftline").options(**options, subscribe=topic).load()
    return (
        records.select(F.col("key").cast("string").alias("key"))
        .groupBy("key")
        .count()
        .orderBy(F.desc("count"), "key")
    )


if __name__ == "__main__":
    args = parser(__doc__.splitlines()[0]).parse_args()
    spark = session("raftline-counts-per-key")
    counts_per_key(spark, source_options(args), args.topic).show(50, truncate=False)
    spark.stop()
