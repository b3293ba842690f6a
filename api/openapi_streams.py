"""The OpenAPI description of server-side filters and streams (merged into api/openapi.py's).

Owns the filter parameters and body field added to partition fetch, group fetch and queue
receive, the `Filter` schema, the three stream paths with their frames, and the produce stream.
"""

from __future__ import annotations

import copy
from typing import Any

from raftline.api.openapi_groups import _error, _query, _ref

FILTER_LANGUAGE = (
    "A filter expression over key, headers, timestamp and offset: comparisons (== != < <= > "
    '>=), `in (...)`, `not in (...)`, `has(headers.NAME)`, `starts_with(FIELD, "p")`, '
    'and/or/not, parentheses; e.g. `key == "a" and headers.region in ("eu", "us") and '
    "timestamp >= 1700000000000`. key and headers are strings or null (absent), timestamp "
    "and offset integers. A bad filter is a 400 invalid_request naming the problem and its "
    "position (also in filter_position)."
)

FILTER_PARAMS = [
    _query("key", {"type": "string"}, "only records with this key"),
    _query(
        "header.{name}",
        {"type": "string"},
        "only records whose header {name} has this value (one parameter per header, e.g. "
        "header.region=eu)",
    ),
    _query(
        "has_header",
        {"type": "array", "items": {"type": "string"}},
        "only records carrying this header (repeatable)",
    ),
    _query("filter", {"type": "string"}, FILTER_LANGUAGE),
]
_FILTERED = (
    " Filters (key, header.NAME, has_header, filter; all required at once) make the node "
    "skip the records they refuse: they are not sent, and next_offset (positions, for a "
    "group) still moves past them, so a consumer never reads them again."
)

STREAM_SCHEMAS: dict[str, Any] = {
    "Filter": {
        "description": "An expression string, or an object of simple forms (all required at "
        "once). " + FILTER_LANGUAGE,
        "oneOf": [
            {"type": "string"},
            {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                    "has_headers": {"type": "array", "items": {"type": "string"}},
                    "expr": {"type": "string"},
                },
            },
        ],
    },
    "StreamCredit": {
        "type": "object",
        "description": "the one frame a client sends: adds credit (messages) to its window",
        "required": ["credit"],
        "properties": {
            "credit": {"type": "integer", "minimum": 0, "maximum": 100_000},
            "seen": {
                "type": "integer",
                "minimum": 0,
                "description": "group streams: the number (frame) of the last frame taken in",
            },
        },
    },
}

_CREDIT = _query(
    "credit",
    {"type": "integer", "minimum": 0, "maximum": 100_000, "default": 100},
    "the window at connect: messages the stream may send before the client grants more with "
    '{"credit": n} frames',
)
_STREAM_INTRO = (
    "A WebSocket (send Upgrade: websocket; a plain GET answers 426). The node runs the "
    "long-poll this replaces over and over, reading from wherever the partitions' leaders are "
    "now, and sends each answer as one JSON text frame; it sends no more messages than the "
    'credit granted (credit= at connect, then {"credit": n} frames from the client). An error '
    'ends the stream with a frame {"error": {...}}. '
)
_PRODUCE_STREAM = (
    "A WebSocket (send Upgrade: websocket; a plain GET answers 426) on which a producer sends "
    "record batches and gets their answers as frames: a batch costs a frame each way, not an "
    "HTTP request and response. Open it at the partitions' leader: this endpoint does not "
    "forward. Client frames are binary: a 12-byte header, a request id chosen by the client "
    "(8 bytes) and the partition (4 bytes), both big-endian unsigned, then one Kafka "
    "RecordBatch v2 as POST /v1/topics/{topic}/messages takes it with Content-Type "
    "application/vnd.raftline.batch (the same checks; transactional batches go by POST). "
    'Each batch is answered by one JSON text frame, {"id", "partition", "base_offset", '
    '"count"} (and "duplicate": true for an idempotent retry), or {"id", "partition", '
    '"status", "error": {...}} with the error body the POST would answer; leader_unavailable '
    "(503, retryable, with leader_http when the leader is known) for a partition this node "
    "does not lead. Answers come in "
    "the order batches complete; many may be in flight (the node reads no more frames while "
    "1,024 are unanswered). An acks=all answer means the batch is committed. A frame shorter "
    'than its header is answered {"id": null, "error": ...} and the stream closes with 1002; '
    "a text frame closes it with 1003, a frame over the body limit with 1009."
)
_UPGRADE = {
    "101": {"description": "switching to WebSocket: frames as described"},
    "400": _error("invalid_request"),
    "404": _error("unknown topic, partition, group member or queue"),
    "426": _error("invalid_request: no WebSocket upgrade"),
}


def _stream(summary: str, operation: str, description: str, params: list[Any]) -> Any:
    return {
        "get": {
            "summary": summary,
            "operationId": operation,
            "description": _STREAM_INTRO + description,
            "parameters": params,
            "responses": _UPGRADE,
        }
    }


def _produce_stream_path(topic: dict[str, Any]) -> dict[str, Any]:
    acks = _query(
        "acks",
        {"type": "string", "enum": ["all", "leader"], "default": "all"},
        "as for produce; acks=none is for POST only (no answer to send)",
    )
    return {
        "get": {
            "summary": "Produce record batches over a WebSocket",
            "operationId": "produceStream",
            "description": _PRODUCE_STREAM,
            "parameters": [topic, acks],
            "responses": _UPGRADE,
        }
    }


def stream_paths(fetch_params: list[dict[str, Any]]) -> dict[str, Any]:
    """The stream paths; `fetch_params` are the partition fetch's (some are reused)."""
    shared = [p for p in fetch_params if p.get("name") in ("max_bytes", "isolation")]
    offset = next(p for p in fetch_params if p.get("name") == "offset")
    topic = next(p for p in fetch_params if p.get("name") == "topic")
    return {
        "/v1/topics/{topic}/produce-stream": _produce_stream_path(topic),
        "/v1/topics/{topic}/stream": _stream(
            "Stream messages of a topic's partitions",
            "streamTopic",
            'Frames {"messages": [... fetch fields plus topic], "positions": [{"topic", '
            '"partition", "offset"}]}, sent when messages came or a position moved. A client '
            "resumes by connecting again with offset.P for each partition.",
            [
                topic,
                _query("partitions", {"type": "string"}, "comma-separated (default: all)"),
                offset,
                _query(
                    "offset.{partition}",
                    {"type": "integer", "minimum": 0},
                    "where that partition starts (overrides offset)",
                ),
                _query("max_messages", {"type": "integer", "minimum": 1}, "most per frame"),
                *shared,
                _CREDIT,
                *FILTER_PARAMS,
            ],
        ),
        "/v1/groups/{group}/members/{member_id}/stream": _stream(
            "Stream a group member's fetches",
            "streamMember",
            "Each frame is a group fetch answer (generation, assignment, rebalancing, "
            "messages, positions) numbered by frame (1, 2, ...), sent when it has messages, a "
            "position moved or the generation or rebalancing changed (those at once). After a "
            'frame with rebalancing: true the stream reads on only once a {"credit": n, '
            '"seen": that frame} arrives: the member commits first, in its generation. A '
            "member whose stream is lost joins again (reading from its commits).",
            [
                {"name": "group", "in": "path", "required": True, "schema": {"type": "string"}},
                {
                    "name": "member_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                },
                _query("max_messages", {"type": "integer", "minimum": 1}, "most per frame"),
                *shared,
                _CREDIT,
                *FILTER_PARAMS,
            ],
        ),
        "/v1/queues/{queue}/stream": _stream(
            "Stream a queue's messages, each locked to this receiver",
            "streamQueue",
            'Frames {"messages": [... as a receive answers]}; settle them with /ack. '
            "Granting one credit back per message settled gives RabbitMQ's prefetch. Messages "
            "pushed on a stream that is lost keep their locks until they expire.",
            [
                {"name": "queue", "in": "path", "required": True, "schema": _ref("QueueName")},
                _query("max_messages", {"type": "integer", "minimum": 1}, "most per frame"),
                _query(
                    "format",
                    {"type": "string", "enum": ["json", "msgpack"], "default": "json"},
                    "msgpack: binary frames, the same frame in msgpack with key and value as "
                    "bytes and headers in one map of text and bytes (no _b64 fields); error "
                    "frames stay JSON text",
                ),
                _CREDIT,
                *FILTER_PARAMS,
            ],
        ),
    }


def with_filters(paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Add the filter parameters to the partition and group fetches, and `filter` to the
    queue receive's body (in place)."""
    for path in (
        "/v1/topics/{topic}/partitions/{partition}/messages",
        "/v1/groups/{group}/members/{member_id}/messages",
    ):
        operation = paths[path]["get"]
        operation["parameters"] = [*operation["parameters"], *FILTER_PARAMS]
        operation["description"] = operation.get("description", "") + _FILTERED
    receive = copy.deepcopy(schemas["Receive"])
    receive["properties"]["filter"] = {
        "allOf": [_ref("Filter")],
        "description": "only records it matches; the others stay available to other receivers "
        "(not locked, not counted as a delivery), as JMS selectors leave them on a queue",
    }
    schemas["Receive"] = receive
