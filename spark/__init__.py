"""PySpark data source reading tiered segments straight from object storage.

Owns the mapping from remote segments to DataFrame partitions and rows: options.py (the
source's options), bucket.py (reads of the bucket's layout), plan.py (offsets and slices on
the driver), columns.py (segment bytes to Arrow), tail.py (the brokers' not-yet-uploaded
tail), source.py (the Spark classes; `register(spark)` makes format("raftline") known).
"""
