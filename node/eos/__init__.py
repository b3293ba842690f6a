"""Exactly-once cores: pure, I/O-free state machines applied from Raft logs (issue #15).

Owns the per-partition producer state, the transaction coordinator, producer id allocation,
transaction markers, partition-side transaction verification and the read_committed filter.
Nothing here reads a clock, a socket or a file: the runtime feeds committed entries and times.
"""
