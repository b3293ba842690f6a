"""The OpenAPI 3 description of the v1 HTTP contract, served at GET /openapi.json.

Owns the schemas of every public endpoint, their parameters, bodies and error answers.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from raftline.api.codec import BATCH_CONTENT_TYPE
from raftline.api.openapi_exchanges import EXCHANGE_SCHEMAS, exchange_paths
from raftline.api.openapi_groups import GROUP_SCHEMAS, group_paths
from raftline.api.openapi_queues import QUEUE_SCHEMAS, queue_paths
from raftline.api.openapi_restore import restore_paths
from raftline.api.openapi_streams import STREAM_SCHEMAS, stream_paths, with_filters

JSON = "application/json"
MSGPACK = "application/msgpack"
BATCH = BATCH_CONTENT_TYPE  # Kafka v2 record batches, passed through untouched
_BINARY = {"schema": {"type": "string", "format": "binary"}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: str, description: str) -> dict[str, Any]:
    content = {kind: {"schema": _ref(schema)} for kind in (JSON, MSGPACK)}
    return {"description": description, "content": content}


def _errors(*statuses: int) -> dict[str, Any]:
    names = {
        400: "invalid_request",
        404: "unknown_topic or unknown_partition",
        409: "topic_exists; on produce out_of_order_sequence or producer_fenced",
        413: "message_too_large",
        416: "offset_out_of_range (body also has log_start_offset and high_watermark)",
        503: "not_enough_replicas or leader_unavailable (retryable; Retry-After header)",
        504: "timeout (retryable)",
    }
    return {str(status): _body("Error", names[status]) for status in statuses}


_TOPIC = {"name": "topic", "in": "path", "required": True, "schema": _ref("TopicName")}
_PARTITION = {
    "name": "partition",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 0},
}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


_SCHEMAS: dict[str, Any] = {
    "TopicName": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"},
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "retryable"],
                "properties": {
                    "code": {
                        "type": "string",
                        "enum": [
                            "invalid_request",
                            "unknown_topic",
                            "unknown_partition",
                            "topic_exists",
                            "offset_out_of_range",
                            "message_too_large",
                            "not_enough_replicas",
                            "leader_unavailable",
                            "timeout",
                        ],
                    },
                    "message": {"type": "string"},
                    "retryable": {"type": "boolean"},
                },
            },
            "log_start_offset": {"type": "integer"},
            "high_watermark": {"type": "integer"},
        },
    },
    "TopicConfig": {
        "type": "object",
        "description": "Kafka topic config names; values as strings or numbers.",
        "properties": {
            "retention.ms": {"type": ["string", "integer"]},
            "retention.bytes": {"type": ["string", "integer"]},
            "cleanup.policy": {
                "type": "string",
                "enum": ["delete", "compact", "compact,delete", "delete,compact"],
                "default": "delete",
                "description": "compact: a background cleaner keeps the latest record per key "
                "in committed sealed segments (offsets kept; retention off unless delete is "
                "also named); records without a key are refused (400 invalid_request)",
            },
            "remote.storage.enable": {
                "type": ["string", "boolean"],
                "enum": ["true", "false", True, False],
                "default": "false",
                "description": "upload every sealed segment to the node's object storage "
                "(tiered/FORMAT.md); refused (400) when the node runs without --s3-endpoint "
                "and --s3-bucket, and on compacted topics",
            },
            "local.retention.ms": {
                "type": ["string", "integer"],
                "minimum": -2,
                "default": -2,
                "description": "with remote storage: how long segments stay on local disk "
                "once uploaded (-2: as retention.ms, -1: forever); at most retention.ms",
            },
            "local.retention.bytes": {
                "type": ["string", "integer"],
                "minimum": -2,
                "default": -2,
                "description": "with remote storage: local bytes kept per partition once "
                "uploaded (-2: as retention.bytes, -1: unlimited); at most retention.bytes",
            },
            "delete.retention.ms": {
                "type": ["string", "integer"],
                "minimum": 0,
                "default": 86400000,
                "description": "how long the cleaner keeps the latest tombstone of a key",
            },
            "min.cleanable.dirty.ratio": {
                "type": ["string", "number"],
                "minimum": 0,
                "maximum": 1,
                "default": 0.5,
                "description": "clean once this share of the cleanable bytes is uncleaned",
            },
            "min.compaction.lag.ms": {
                "type": ["string", "integer"],
                "minimum": 0,
                "default": 0,
                "description": "records younger than this are not compacted",
            },
            "max.message.bytes": {
                "type": ["string", "integer"],
                "maximum": 10485760,
                "default": 1048576,
            },
            "segment.bytes": {"type": ["string", "integer"]},
            "segment.ms": {
                "type": ["string", "integer"],
                "description": "a segment is sealed at this age (ms, at least 1); with remote "
                "storage even when no write comes, which bounds what a restore can lose",
            },
            "compression.type": {
                "type": "string",
                "enum": ["producer", "none", "gzip", "snappy", "lz4", "zstd"],
                "default": "producer",
            },
        },
        "additionalProperties": {"type": ["string", "integer"]},
    },
    "CreateTopic": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": _ref("TopicName"),
            "partitions": {"type": "integer", "minimum": 1, "default": 1},
            "replication_factor": {
                "type": "integer",
                "minimum": 1,
                "description": "default: min(3, cluster size)",
            },
            "config": _ref("TopicConfig"),
        },
    },
    "TopicSummary": {
        "type": "object",
        "properties": {
            "name": _ref("TopicName"),
            "partitions": {"type": "integer"},
            "replication_factor": {"type": "integer"},
        },
    },
    "TopicList": {
        "type": "object",
        "properties": {"topics": {"type": "array", "items": _ref("TopicSummary")}},
    },
    "PartitionState": {
        "type": "object",
        "properties": {
            "partition": {"type": "integer"},
            "leader": {"type": ["integer", "null"]},
            "replicas": {"type": "array", "items": {"type": "integer"}},
            "in_sync": {"type": "array", "items": {"type": "integer"}},
            "log_start_offset": {"type": "integer"},
            "high_watermark": {"type": "integer"},
        },
    },
    "TopicDescription": {
        "type": "object",
        "properties": {
            "name": _ref("TopicName"),
            "config": {"type": "object", "additionalProperties": {"type": "string"}},
            "partitions": {"type": "array", "items": _ref("PartitionState")},
        },
    },
    "ProduceMessage": {
        "type": "object",
        "additionalProperties": False,
        "description": "Exactly one of value / value_b64 (value null: a tombstone).",
        "properties": {
            "key": {"type": ["string", "null"]},
            "key_b64": {"type": "string", "format": "byte"},
            "value": {"type": ["string", "null"]},
            "value_b64": {"type": "string", "format": "byte"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "headers_b64": {
                "type": "object",
                "additionalProperties": {"type": "string", "format": "byte"},
                "description": "header values in base64 (bytes that are not UTF-8); a name "
                "stands in headers or here, not both",
            },
            "partition": {"type": "integer", "minimum": 0},
            "timestamp": {"type": "integer", "minimum": 0, "description": "ms since epoch"},
        },
    },
    "ProduceRequest": {
        "type": "object",
        "required": ["messages"],
        "additionalProperties": False,
        "properties": {
            "acks": {"type": "string", "enum": ["all", "leader", "none"], "default": "all"},
            "messages": {"type": "array", "minItems": 1, "items": _ref("ProduceMessage")},
            "producer_id": {
                "type": "integer",
                "minimum": 0,
                "description": "idempotent producer (POST /v1/producers); with producer_epoch "
                "and sequence, and every message to one partition",
            },
            "producer_epoch": {"type": "integer", "minimum": 0, "maximum": 32767},
            "sequence": {
                "type": "integer",
                "minimum": 0,
                "maximum": 2147483647,
                "description": "sequence number of the first message; the next request goes "
                "on from the last message's + 1 (wrapping after 2**31 - 1). Repeating a "
                "request with the same three values answers the original offsets with "
                "duplicate: true and writes nothing (the last 5 batches per producer and "
                "partition are remembered). A gap: 409 out_of_order_sequence; an epoch older "
                "than the producer's current one: 409 producer_fenced. A producer idle longer "
                "than the node's producer expiry (24 h of committed message time) is "
                "forgotten: its next request may start at any sequence.",
            },
            "transactional": {
                "type": "boolean",
                "description": "true: the messages join the open transaction of "
                "transactional_id (opened by this write if none is; the partition checks with "
                "the transaction coordinator before a transaction's first write to it)",
            },
            "transactional_id": {
                "type": "string",
                "description": "with transactional: true, the id POST /v1/producers was given",
            },
        },
    },
    "NewProducerRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "transactional_id": {
                "type": "string",
                "description": "a transactional producer: the answer's epoch fences every "
                "earlier one of this id, whose open transaction is aborted first",
            },
            "transaction_timeout_ms": {
                "type": "integer",
                "minimum": 1,
                "maximum": 900000,
                "default": 60000,
                "description": "a transaction open longer is aborted by the coordinator",
            },
        },
    },
    "EndTransaction": {
        "type": "object",
        "required": ["producer_id", "producer_epoch"],
        "additionalProperties": False,
        "properties": {
            "producer_id": {"type": "integer"},
            "producer_epoch": {"type": "integer"},
        },
    },
    "NewProducer": {
        "type": "object",
        "properties": {
            "producer_id": {
                "type": "integer",
                "description": "never handed out before, in this cluster's life",
            },
            "producer_epoch": {"type": "integer"},
        },
    },
    "ProduceResponse": {
        "type": "object",
        "properties": {
            "offsets": {
                "type": "array",
                "description": "One per message, in request order.",
                "items": {
                    "type": "object",
                    "properties": {"partition": {"type": "integer"}, "offset": {"type": "integer"}},
                },
            },
            "duplicate": {
                "type": "boolean",
                "description": "present (true) when an idempotent request repeated one already "
                "written: nothing was written and the offsets are the original's",
            },
        },
    },
    "FetchedMessage": {
        "type": "object",
        "properties": {
            "partition": {"type": "integer"},
            "offset": {"type": "integer"},
            "timestamp": {"type": "integer"},
            "key": {"type": ["string", "null"]},
            "key_b64": {
                "type": "string",
                "format": "byte",
                "description": "instead of key when it is not UTF-8",
            },
            "value": {"type": ["string", "null"]},
            "value_b64": {
                "type": "string",
                "format": "byte",
                "description": "instead of value when it is not UTF-8",
            },
            "headers": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
            "headers_b64": {
                "type": "object",
                "additionalProperties": {"type": "string", "format": "byte"},
                "description": "present when some header values are not UTF-8: those values, "
                "base64 (msgpack answers carry them as bytes in headers instead)",
            },
        },
    },
    "FetchResponse": {
        "type": "object",
        "properties": {
            "messages": {"type": "array", "items": _ref("FetchedMessage")},
            "next_offset": {"type": "integer"},
            "log_start_offset": {"type": "integer"},
            "high_watermark": {"type": "integer"},
            "last_stable_offset": {"type": "integer", "description": "with read_committed"},
        },
    },
    "Cluster": {
        "type": "object",
        "properties": {
            "cluster_id": {"type": "string"},
            "controller": {"type": ["integer", "null"]},
            "nodes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "http": {"type": "string"},
                        "raft": {"type": "string"},
                        "alive": {"type": "boolean"},
                    },
                },
            },
        },
    },
    "Status": {"type": "object", "properties": {"status": {"type": "string"}}},
}


@cache
def openapi_document() -> dict[str, Any]:
    """The whole document; built once, it never changes while the node runs."""
    topic_item = [_TOPIC]
    fetch_params = [
        _TOPIC,
        _PARTITION,
        _query(
            "offset",
            {
                "oneOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "enum": ["earliest", "latest"]},
                ]
            },
            "first offset to read (default earliest)",
        ),
        _query(
            "timestamp",
            {"type": "integer", "minimum": 0},
            "instead of offset: start at the first message whose timestamp is >= this (ms; "
            "from the time index); next_offset is the high watermark when none is",
        ),
        _query(
            "max_messages",
            {"type": "integer", "minimum": 1, "default": 500},
            "most messages returned",
        ),
        _query(
            "max_bytes",
            {"type": "integer", "minimum": 1, "default": 1048576},
            "byte budget (at least one message is returned)",
        ),
        _query(
            "wait_ms",
            {"type": "integer", "minimum": 0, "default": 0},
            "long-poll up to this long for a message",
        ),
        _query(
            "isolation",
            {
                "type": "string",
                "enum": ["read_uncommitted", "read_committed"],
                "default": "read_uncommitted",
            },
            "read_committed: only non-transactional messages and those of committed "
            "transactions, up to last_stable_offset (returned then)",
        ),
    ]
    paths: dict[str, Any] = {
        "/v1/topics": {
            "post": {
                "summary": "Create a topic",
                "operationId": "createTopic",
                "requestBody": {"required": True, **_body("CreateTopic", "the topic")},
                "responses": {
                    "201": _body("TopicDescription", "created"),
                    **_errors(400, 409, 503, 504),
                },
            },
            "get": {
                "summary": "List topics",
                "operationId": "listTopics",
                "responses": {"200": _body("TopicList", "every topic"), **_errors(503)},
            },
        },
        "/v1/topics/{topic}": {
            "get": {
                "summary": "Describe a topic and its partitions",
                "operationId": "describeTopic",
                "parameters": topic_item,
                "responses": {
                    "200": _body("TopicDescription", "the topic"),
                    **_errors(400, 404, 503),
                },
            },
            "delete": {
                "summary": "Delete a topic",
                "operationId": "deleteTopic",
                "parameters": topic_item,
                "responses": {"204": {"description": "deleted"}, **_errors(400, 404, 503, 504)},
            },
        },
        "/v1/topics/{topic}/messages": {
            "post": {
                "summary": "Produce messages",
                "description": (
                    f"With Content-Type {BATCH} the body is one Kafka v2 record batch built by "
                    "the producer for the `partition` query parameter; it is checked and stored "
                    'as sent, and the answer is {"partition", "base_offset", "count"} (plus '
                    '"duplicate": true for a repeated idempotent batch). The batch header\'s '
                    "producer id, epoch and base sequence make it idempotent, as in a JSON body; "
                    "a transactional batch needs the transactional_id query parameter."
                ),
                "operationId": "produce",
                "parameters": [
                    *topic_item,
                    _query("partition", {"type": "integer", "minimum": 0}, f"with a {BATCH} body"),
                    _query(
                        "acks",
                        {"type": "string", "enum": ["all", "leader", "none"]},
                        f"with a {BATCH} body",
                    ),
                    _query(
                        "transactional_id",
                        {"type": "string"},
                        f"with a transactional {BATCH} body",
                    ),
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        **_body("ProduceRequest", "messages")["content"],
                        BATCH: _BINARY,
                    },
                },
                "responses": {
                    "200": _body("ProduceResponse", "offsets in request order"),
                    "202": {
                        "description": "accepted (acks=none)",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    },
                    **_errors(400, 404, 409, 413, 503, 504),
                },
            }
        },
        "/v1/producers": {
            "post": {
                "summary": "Get a producer id for an idempotent producer",
                "operationId": "newProducer",
                "requestBody": {
                    "required": False,
                    **_body("NewProducerRequest", "{} (or no body)"),
                },
                "responses": {
                    "200": _body("NewProducer", "a new producer id and its epoch"),
                    **_errors(400, 503, 504),
                },
            }
        },
        "/v1/transactions/{transactional_id}/{action}": {
            "post": {
                "summary": "Commit or abort the open transaction (action: commit | abort)",
                "description": (
                    "The decision is made durable, then a marker (a Kafka control batch) is "
                    "written to every partition of the transaction; the answer comes after "
                    "that: read_committed fetches of every partition then see the outcome. "
                    "The answer's epoch (bumped) is the one for the next transaction; "
                    "sequences start again at 0. An older epoch: 409 producer_fenced."
                ),
                "operationId": "endTransaction",
                "parameters": [
                    {
                        "name": "transactional_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "action",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["commit", "abort"]},
                    },
                ],
                "requestBody": {"required": True, **_body("EndTransaction", "the producer")},
                "responses": {
                    "200": _body("NewProducer", "the producer id and epoch for the next one"),
                    **_errors(400, 404, 409, 503, 504),
                },
            }
        },
        "/v1/transactions/{transactional_id}/offsets": {
            "post": {
                "summary": "Commit consumer offsets inside the open transaction",
                "description": (
                    'Body {"producer_id", "producer_epoch", "group", "offsets": [{"topic", '
                    '"partition", "offset"}]}: the group\'s committed offsets move to these '
                    "(never back) when the transaction commits, after its markers are written; "
                    "never when it aborts. Fenced by the producer epoch (409 producer_fenced), "
                    "not by the group's generations."
                ),
                "operationId": "transactionOffsets",
                "parameters": [
                    {
                        "name": "transactional_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {
                    "204": {"description": "joined the transaction"},
                    **_errors(400, 404, 409, 503, 504),
                },
            }
        },
        "/v1/topics/{topic}/partitions/{partition}/messages": {
            "get": {
                "summary": "Fetch committed messages from a partition",
                "description": (
                    f"With Accept {BATCH} the answer is whole stored batches back to back (the "
                    "first may start before `offset`; control batches are left out) and the "
                    "headers Raftline-Next-Offset, Raftline-Log-Start-Offset and "
                    "Raftline-High-Watermark."
                ),
                "operationId": "fetch",
                "parameters": fetch_params,
                "responses": {
                    "200": {
                        "description": "messages",
                        "content": {
                            **_body("FetchResponse", "messages")["content"],
                            BATCH: _BINARY,
                        },
                    },
                    **_errors(400, 404, 416, 503, 504),
                },
            }
        },
        "/v1/internal/topics/{topic}/partitions/{partition}/batch": {
            "post": {
                "summary": "Append one raw record batch on the partition leader (node to node)",
                "operationId": "appendBatch",
                "parameters": [
                    _TOPIC,
                    _PARTITION,
                    _query("acks", {"type": "string", "enum": ["all", "leader", "none"]}, "acks"),
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "appended",
                        "content": {
                            JSON: {
                                "schema": {
                                    "type": "object",
                                    "properties": {"base_offset": {"type": "integer"}},
                                }
                            }
                        },
                    },
                    **_errors(400, 404, 413, 503, 504),
                },
            }
        },
        "/v1/cluster": {
            "get": {
                "summary": "Cluster members and the controller",
                "operationId": "cluster",
                "responses": {"200": _body("Cluster", "the cluster")},
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "operationId": "healthz",
                "responses": {"200": _body("Status", "serving")},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness: joined and caught up on metadata",
                "operationId": "readyz",
                "responses": {
                    "200": _body("Status", "ready"),
                    "503": _body("Error", "not ready yet"),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "operationId": "metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "operationId": "openapi",
                "responses": {"200": {"description": "OpenAPI 3 document"}},
            }
        },
    }
    every_path = {
        **paths,
        **group_paths(),
        **queue_paths(),
        **stream_paths(fetch_params),
        **exchange_paths(),
        **restore_paths(),
    }
    schemas = {**_SCHEMAS, **GROUP_SCHEMAS, **QUEUE_SCHEMAS, **STREAM_SCHEMAS, **EXCHANGE_SCHEMAS}
    with_filters(every_path, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Raftline HTTP API",
            "version": "1",
            "description": "Raft-per-partition message broker. Every 4xx/5xx body is "
            '{"error": {"code", "message", "retryable"}}. Bodies may be JSON or msgpack '
            "(Content-Type application/msgpack); answers are msgpack when Accept asks.",
        },
        "paths": every_path,
        "components": {"schemas": schemas},
    }
