"""The Python client (sync and asyncio) and the `raftline` command line.

Owns producer batching, partitioning, retries, consumer reads and consumer-group membership over
the HTTP API: decided once in a sans-I/O core (wire, metadata, routing, core, producing,
consuming, grouping) and driven by two thin shells (blocking, aio); `client` gathers the public
names, `cli` is the command line.
"""
