"""Queues: shared consumption with per-message acknowledgement over a topic's partitions (share
groups). The replicated queue state machine, receipts, the shard replicas that apply it (the
partitions of the internal `__queues` topic) and the shard leader's duties (locks, expiry,
dead-lettering)."""
