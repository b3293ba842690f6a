"""Side-by-side benchmarks of Raftline against NATS JetStream, RabbitMQ and Redis Streams.

Owns nothing at import time; run `python -m bench compare --quick` from the repository root.
"""
