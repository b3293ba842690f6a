"""What the examples share: command-line options naming the bucket and a SparkSession with the
`raftline` source registered. Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--s3-endpoint", required=True, help="e.g. http://127.0.0.1:8333")
    p.add_argument("--bucket", required=True, help="the bucket the brokers tier to")
    p.add_argument("--s3-prefix", default="", help="the brokers' --s3-prefix, if any")
    p.add_argument("--topic", required=True)
    return p


def source_options(args: argparse.Namespace) -> dict[str, str]:
    return {"s3.endpoint": args.s3_endpoint, "bucket": args.bucket, "s3.prefix": args.s3_prefix}


def session(app: str) -> Any:
    """A local SparkSession (use spark-submit's master instead on a cluster)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from raftline.spark.source import register

    spark = (
        SparkSession.builder.appName(app)
        .master(os.environ.get("SPARK_MASTER", "local[2]"))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    register(spark)
    return spark
