"""Transactions: the coordinator shards of the internal `__transactions` topic (issue #15)."""
