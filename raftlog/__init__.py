"""Raft core and the segment log: the partition log that is also each group's Raft log.

Owns record batch bytes on disk, the sans-I/O Raft state machine and its simulator.
"""
