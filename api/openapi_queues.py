"""The OpenAPI description of the queue endpoints (merged into api/openapi.py's).

Owns the queue paths, their bodies, answers and error codes, and the per-receipt error codes.
"""

from __future__ import annotations

from typing import Any

from raftline.api.openapi_groups import _body, _error, _ref

_UNAVAILABLE = {
    "503": _error("leader_unavailable: the queue's shard is electing a leader (retryable)"),
    "504": _error("timeout (retryable)"),
}
_BAD = {"400": _error("invalid_request: malformed body, names, numbers or outcome")}
_UNKNOWN = {"404": _error("unknown_queue")}
_QUEUE = {"name": "queue", "in": "path", "required": True, "schema": _ref("QueueName")}
_RECEIPTS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 1000,
    "items": {"type": "string", "description": "a receipt from a receive answer"},
}
RECEIPT_ERRORS = {
    "invalid_receipt": "not a receipt of this queue: forged, altered, of another queue, or of "
    "a deleted queue of the same name",
    "lock_expired": "the lock of this delivery is gone (expired, extended past, settled "
    "already, or lost in a leader failover); the record may be delivered again",
    "duplicate_receipt": "the same receipt twice in one request (the first one counts)",
    "already_settled": "the record was settled by another delivery meanwhile",
}

QUEUE_SCHEMAS: dict[str, Any] = {
    "QueueName": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"},
    "QueueConfig": {
        "type": "object",
        "required": ["name", "topic"],
        "properties": {
            "name": _ref("QueueName"),
            "topic": {"type": "string", "description": "the topic whose partitions it shares"},
            "lock_ms": {
                "type": "integer",
                "minimum": 100,
                "maximum": 43_200_000,
                "default": 30_000,
                "description": "how long a received message stays locked to its receiver",
            },
            "max_deliveries": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1000,
                "default": 5,
                "description": "deliveries before a released or expired message is archived",
            },
            "dead_letter_topic": {
                "type": ["string", "null"],
                "description": "where archived messages go (created with one partition "
                "when missing), with headers "
                "x-raftline-source-topic, x-raftline-source-partition, "
                "x-raftline-source-offset, x-raftline-delivery-count and "
                "x-raftline-death-reason (rejected | max_deliveries); without one they are "
                "dropped. At-least-once: a failover may append one twice.",
            },
        },
    },
    "QueueDescription": {
        "allOf": [
            _ref("QueueConfig"),
            {
                "type": "object",
                "properties": {
                    "available": {"type": "integer"},
                    "locked": {"type": "integer"},
                    "acknowledged": {"type": "integer"},
                    "dead_lettered": {"type": "integer"},
                    "dropped": {"type": "integer"},
                    "partitions": {"type": "array", "items": {"type": "object"}},
                },
            },
        ]
    },
    "QueueList": {
        "type": "object",
        "properties": {"queues": {"type": "array", "items": _ref("QueueConfig")}},
    },
    "Receive": {
        "type": "object",
        "properties": {
            "max_messages": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
            "wait_ms": {
                "type": "integer",
                "minimum": 0,
                "maximum": 30_000,
                "default": 0,
                "description": "long-poll: answer as soon as a message is available",
            },
        },
    },
    "Received": {
        "type": "object",
        "properties": {
            "messages": {
                "type": "array",
                "items": {
                    "type": "object",
                    "description": "the fields of a fetched message, plus these. Headers a "
                    "producer may set: priority (0-9; higher ones are received first among "
                    "available messages), delay_ms (not received before the message's "
                    "timestamp plus this) or deliver_at (not before this time, ms since the "
                    "epoch)",
                    "properties": {
                        "topic": {"type": "string"},
                        "partition": {"type": "integer"},
                        "offset": {"type": "integer"},
                        "receipt": {"type": "string", "description": "opaque; settles it"},
                        "delivery_count": {"type": "integer", "minimum": 1},
                    },
                },
            }
        },
    },
    "Ack": {
        "type": "object",
        "required": ["receipts"],
        "properties": {
            "receipts": _RECEIPTS,
            "outcome": {
                "type": "string",
                "enum": ["accept", "release", "reject"],
                "default": "accept",
                "description": "accept: done; release: available again at once (a failed "
                "delivery); reject: dead-lettered (or dropped) at once",
            },
        },
    },
    "Extend": {
        "type": "object",
        "required": ["receipts"],
        "properties": {
            "receipts": _RECEIPTS,
            "lock_ms": {
                "type": "integer",
                "minimum": 100,
                "description": "the new lock, from now (default: the queue's lock_ms)",
            },
        },
    },
    "ReceiptResults": {
        "type": "object",
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "receipt": {"type": "string"},
                        "ok": {"type": "boolean"},
                        "error": {
                            "type": ["string", "null"],
                            "enum": [*RECEIPT_ERRORS, None],
                            "description": "; ".join(
                                f"{k}: {v}" for k, v in RECEIPT_ERRORS.items()
                            ),
                        },
                    },
                },
            }
        },
    },
}


_LEADER = {
    "Raftline-Queue-Leader": {
        "description": "HOST:PORT of the node leading the queue's state shard, when known: "
        "send the next receive, ack and extend there (no node-to-node forward)",
        "schema": {"type": "string"},
    }
}


def _led(response: dict[str, Any]) -> dict[str, Any]:
    return {**response, "headers": _LEADER}


def queue_paths() -> dict[str, Any]:
    return {
        "/v1/queues": {
            "post": {
                "summary": "Create a queue over a topic (a retry with the same config is 201 too)",
                "operationId": "createQueue",
                "requestBody": {"required": True, **_body("QueueConfig", "the queue")},
                "responses": {
                    "201": _body("QueueConfig", "created"),
                    **_BAD,
                    "404": _error(
                        "unknown_topic: the topic (a missing dead-letter topic is created)"
                    ),
                    "409": _error("queue_exists: with another config"),
                    **_UNAVAILABLE,
                },
            },
            "get": {
                "summary": "List queues",
                "operationId": "listQueues",
                "responses": {"200": _body("QueueList", "every queue"), **_UNAVAILABLE},
            },
        },
        "/v1/queues/{queue}": {
            "get": {
                "summary": "A queue's config and counts",
                "operationId": "describeQueue",
                "parameters": [_QUEUE],
                "responses": {
                    "200": _led(_body("QueueDescription", "the queue")),
                    **_BAD,
                    **_UNKNOWN,
                    **_UNAVAILABLE,
                },
            },
            "delete": {
                "summary": "Delete a queue (its receipts stop working; the topic stays)",
                "operationId": "deleteQueue",
                "parameters": [_QUEUE],
                "responses": {
                    "204": {"description": "deleted"},
                    **_BAD,
                    **_UNKNOWN,
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/queues/{queue}/receive": {
            "post": {
                "summary": "Receive messages, each locked to this receiver for lock_ms",
                "operationId": "receiveQueue",
                "parameters": [_QUEUE],
                "requestBody": {"required": False, **_body("Receive", "how many, how long")},
                "responses": {
                    "200": _led(_body("Received", "the messages (possibly none)")),
                    **_BAD,
                    **_UNKNOWN,
                    **_UNAVAILABLE,
                },
            }
        },
        "/v1/queues/{queue}/ack": {
            "post": {
                "summary": "Settle received messages: accept, release or reject",
                "operationId": "ackQueue",
                "parameters": [_QUEUE],
                "requestBody": {"required": True, **_body("Ack", "receipts and outcome")},
                "responses": {
                    "200": _led(_body("ReceiptResults", "one result per receipt, in order")),
                    **_BAD,
                    **_UNKNOWN,
                    **_UNAVAILABLE,
                },
            }
        },
        "/v1/queues/{queue}/extend": {
            "post": {
                "summary": "Extend the locks of received messages (long work)",
                "operationId": "extendQueue",
                "parameters": [_QUEUE],
                "requestBody": {"required": True, **_body("Extend", "receipts and lock_ms")},
                "responses": {
                    "200": _led(_body("ReceiptResults", "one result per receipt, in order")),
                    **_BAD,
                    **_UNKNOWN,
                    **_UNAVAILABLE,
                },
            }
        },
    }
