"""The broker process: drives many Raft groups on one asyncio loop.

Owns the transport between nodes, disk scheduling, the metadata group and partition replicas.
"""
