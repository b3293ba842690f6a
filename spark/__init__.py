"""PySpark data source reading tiered segments straight from object storage.

Owns the mapping from remote segments to DataFrame partitions and rows.
"""
