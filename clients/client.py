"""Python client for the Raftline HTTP API: sync and asyncio admin, producer and consumer.

Owns the public names, gathered from the modules that implement them: `wire` (requests,
answers, errors), `metadata` and `routing` (leaders, partitioner, bootstrap nodes, retries),
`core`, `producing` and `consuming` (every call, batching and position decision, written once
as Ops: generators that yield requests and are sent answers), and the two shells that drive
them, `blocking` (Client, Producer, Consumer, GroupConsumer) and `aio` (AsyncClient,
AsyncProducer, AsyncConsumer, AsyncGroupConsumer); `grouping` holds the consumer-group member,
`queueing` the queue receiver (Queue, AsyncQueue) and its QueueMessage (ack, release, reject),
`exchanging` exchanges, publish and request/reply (Reply, Responder).
By default producers send Kafka record batches they build themselves (optionally compressed)
and consumers read whole stored batches (`wire="batch"`); `wire="json"` speaks the plain JSON
contract instead. Bulk paths skip per-message objects: `send_batch` sends many values
as one batch behind one future, and `fetch_values`/`poll_values` hand back values only.
"""

from __future__ import annotations

from raftline.clients.aio import (
    AsyncClient,
    AsyncConsumer,
    AsyncGroupConsumer,
    AsyncProducer,
    AsyncQueue,
)
from raftline.clients.blocking import Client, Consumer, GroupConsumer, Producer, Queue
from raftline.clients.core import DEFAULT_URL, Call, ClientApi, ClientCore, Hook, Op, Step
from raftline.clients.exchanging import Reply, Responder, RoutingClientApi
from raftline.clients.grouping import GroupConsumerCore
from raftline.clients.metadata import METADATA_TTL_S, Metadata, Partitioner
from raftline.clients.producing import COMPRESSIONS, Accumulator, Pending, ProducerCore
from raftline.clients.queueing import QueueApi, QueueCore, QueueMessage
from raftline.clients.routing import RetryPolicy
from raftline.clients.wire import (
    WIRES,
    Acked,
    Answer,
    BatchAcked,
    FetchedValues,
    FetchResult,
    Message,
    RaftlineError,
    Request,
    encode_message,
    encode_record,
    error_from,
    parse_fetch,
)

# Earlier private names, kept for code and tests that import them from here.
_Accumulator = Accumulator
_Pending = Pending
_Partitioner = Partitioner
_Metadata = Metadata
_error_from = error_from
_Answer = Answer
_Request = Request

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_URL",
    "METADATA_TTL_S",
    "WIRES",
    "Acked",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncProducer",
    "AsyncQueue",
    "BatchAcked",
    "Call",
    "Client",
    "ClientApi",
    "ClientCore",
    "Consumer",
    "FetchResult",
    "FetchedValues",
    "GroupConsumer",
    "GroupConsumerCore",
    "Hook",
    "Message",
    "Op",
    "Producer",
    "ProducerCore",
    "Queue",
    "QueueApi",
    "QueueCore",
    "QueueMessage",
    "RaftlineError",
    "Reply",
    "Responder",
    "RetryPolicy",
    "RoutingClientApi",
    "Step",
    "encode_message",
    "encode_record",
    "parse_fetch",
]
