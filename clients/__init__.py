"""The Python client (sync and asyncio) and the `raftline` command line.

Owns producer batching, partitioning, retries and consumer reads over the HTTP API.
"""
