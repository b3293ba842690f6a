"""A streaming aggregation into Parquet: records per key per minute, as segments are uploaded.

    python spark/examples/streaming_to_parquet.py --s3-endpoint URL --bucket B --topic orders \
        --output /data/orders-per-minute --checkpoint /data/orders-per-minute.checkpoint

Each micro-batch reads the segments uploaded since the last one (at most --max-offsets offsets).
The checkpoint holds the per-partition offsets: a restart continues where the last committed
micro-batch ended, and Parquet's file sink writes each window once (append mode, after the
watermark passes it). --once reads what is there now and stops (Trigger.AvailableNow).
"""

from __future__ import annotations

from typing import Any

from common import parser, session, source_options
from pyspark.sql import functions as F


def start(spark: Any, options: dict[str, str], args: Any) -> Any:
    records = (
        spark.readStream.format("raftline")
        .options(**options, subscribe=args.topic, startingOffsets="earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .load()
    )
    per_minute = (
        records.withWatermark("timestamp", "2 minutes")
        .groupBy(F.window("timestamp", "1 minute"), F.col("key").cast("string").alias("key"))
        .count()
        .select(F.col("window.start").alias("minute"), "key", "count")
    )
    writer = (
        per_minute.writeStream.format("parquet")
        .outputMode("append")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
    )
    return writer.trigger(availableNow=True).start() if args.once else writer.start()


if __name__ == "__main__":
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--max-offsets", type=int, default=1_000_000)
    p.add_argument("--once", action="store_true")
    args = p.parse_args()
    spark = session("raftline-per-minute")
    start(spark, source_options(args), args).awaitTermination()
