"""The OpenAPI description of exchanges and request/reply (merged into api/openapi.py's).

Owns the exchange paths (CRUD, bindings, publish), `POST /v1/request`, their bodies, answers
and error codes.
"""

from __future__ import annotations

from typing import Any

from raftline.api.openapi_groups import _POSITIONS, _body, _error, _objects, _ref

_UNAVAILABLE = {
    "503": _error(
        "leader_unavailable: the controller (metadata leader) or a destination partition's "
        "leader is being elected, or this node cannot reach a majority (retryable, within an "
        "election timeout)"
    ),
    "504": _error("timeout (retryable)"),
}
_BAD = {"400": _error("invalid_request: malformed body, name, kind, key or pattern")}
_UNKNOWN = {"404": _error("unknown_exchange")}
_EXCHANGE = {"name": "exchange", "in": "path", "required": True, "schema": _ref("ExchangeName")}
_DESTINATION = {
    "type": "object",
    "description": "exactly one of topic or queue (a queue is written to through its topic)",
    "properties": {"topic": {"type": "string"}, "queue": _ref("ExchangeName")},
}

EXCHANGE_SCHEMAS: dict[str, Any] = {
    "ExchangeName": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"},
    "Exchange": {
        "type": "object",
        "required": ["name", "kind"],
        "properties": {
            "name": _ref("ExchangeName"),
            "kind": {
                "type": "string",
                "enum": ["fanout", "direct", "topic"],
                "description": "fanout: every binding; direct: bindings whose key equals the "
                "routing key; topic: bindings whose pattern matches it (words separated by "
                "'.'; '*' is exactly one word, '#' zero or more)",
            },
            "alternate": {
                **_DESTINATION,
                "description": "where a message matching no binding goes (else it is dropped "
                "and counted in raftline_exchange_messages_unroutable_total)",
            },
        },
    },
    "Binding": {
        "type": "object",
        "properties": {
            "key": {
                "type": "string",
                "maxLength": 255,
                "default": "",
                "description": "a routing key (direct), a pattern (topic: '*' and '#' stand "
                "alone between dots), ignored (fanout)",
            },
            "topic": {"type": "string"},
            "queue": _ref("ExchangeName"),
        },
    },
    "ExchangeDescription": {
        "type": "object",
        "properties": {
            "name": _ref("ExchangeName"),
            "kind": {"type": "string"},
            "alternate": {"type": ["object", "null"]},
            "bindings": {"type": "array", "items": _ref("Binding")},
        },
    },
    "ExchangeList": {
        "type": "object",
        "properties": {
            "exchanges": _objects(
                {
                    "name": {"type": "string"},
                    "kind": {"type": "string"},
                    "bindings": {"type": "integer"},
                }
            )
        },
    },
    "Publish": {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "acks": {"type": "string", "enum": ["all"], "default": "all"},
            "messages": {
                "type": "array",
                "minItems": 1,
                "maxItems": 10_000,
                "items": {
                    "allOf": [
                        _ref("ProduceMessage"),
                        {
                            "type": "object",
                            "description": "a produce message without partition (the key "
                            "chooses it in each destination topic), plus its routing key; "
                            "headers reply-to and correlation-id mark a request",
                            "properties": {"routing_key": {"type": "string", "maxLength": 255}},
                        },
                    ]
                },
            },
        },
    },
    "Published": {
        "type": "object",
        "properties": {
            "results": {
                "type": "array",
                "description": "one per message, in request order",
                "items": {
                    "type": "object",
                    "properties": {
                        "routed": _POSITIONS,
                        "dropped": {"type": "boolean"},
                        "alternate": {"type": "boolean"},
                    },
                },
            },
            "routed": {"type": "integer"},
            "dropped": {"type": "integer"},
            "transaction": {
                "type": "boolean",
                "description": "true when the messages went to several partitions: they were "
                "written in one transaction, committed as a whole (read_committed readers see "
                "all or none; read_uncommitted readers and queues may see a publish that then "
                "fails and aborts)",
            },
        },
    },
    "RequestReply": {
        "type": "object",
        "required": ["message"],
        "properties": {
            "topic": {"type": "string", "description": "publish the request here, or:"},
            "exchange": _ref("ExchangeName"),
            "routing_key": {"type": "string", "maxLength": 255},
            "message": {
                **_ref("ProduceMessage"),
                "description": "key, value, headers (not reply-to or correlation-id: the "
                "request sets them) and no partition",
            },
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 30_000, "default": 5000},
            "client_id": {
                "type": "string",
                "pattern": "^[A-Za-z0-9_-]{1,64}$",
                "description": "the reply topic _reply.<client_id> is kept for the client's "
                "next requests and deleted two minutes after its last one; without it, the "
                "request gets a reply topic of its own, deleted after the answer",
            },
            "correlation_id": {
                "type": "string",
                "maxLength": 128,
                "description": "default: a random one; a retry should send the same",
            },
        },
    },
    "Reply": {
        "type": "object",
        "properties": {
            "correlation_id": {"type": "string"},
            "request": _POSITIONS,
            "reply": {
                **_ref("FetchedMessage"),
                "description": "the first message on the reply topic, after the request was "
                "published, whose correlation-id header is the request's (plus its topic)",
            },
        },
    },
}


def exchange_paths() -> dict[str, Any]:
    return {
        "/v1/exchanges": {
            "post": {
                "summary": "Create an exchange",
                "operationId": "createExchange",
                "requestBody": {"required": True, **_body("Exchange", "the exchange")},
                "responses": {
                    "201": _body("ExchangeDescription", "created"),
                    **_BAD,
                    "404": _error("unknown_destination: the alternate topic or queue"),
                    "409": _error("exchange_exists"),
                    **_UNAVAILABLE,
                },
            },
            "get": {
                "summary": "List exchanges",
                "operationId": "listExchanges",
                "responses": {"200": _body("ExchangeList", "every exchange"), **_UNAVAILABLE},
            },
        },
        "/v1/exchanges/{exchange}": {
            "get": {
                "summary": "An exchange's kind, alternate and bindings",
                "operationId": "describeExchange",
                "parameters": [_EXCHANGE],
                "responses": {
                    "200": _body("ExchangeDescription", "the exchange"),
                    **_BAD,
                    **_UNKNOWN,
                    **_UNAVAILABLE,
                },
            },
            "delete": {
                "summary": "Delete an exchange (its topics and queues stay)",
                "operationId": "deleteExchange",
                "parameters": [_EXCHANGE],
                "responses": {
                    "204": {"description": "deleted"},
                    **_BAD,
                    **_UNKNOWN,
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/exchanges/{exchange}/bindings": {
            "post": {
                "summary": "Bind a topic or a queue (binding twice is one binding)",
                "operationId": "bindExchange",
                "parameters": [_EXCHANGE],
                "requestBody": {"required": True, **_body("Binding", "key and destination")},
                "responses": {
                    "201": _body("Binding", "the binding (a queue's names its topic too)"),
                    **_BAD,
                    "404": _error("unknown_exchange or unknown_destination"),
                    **_UNAVAILABLE,
                },
            },
            "delete": {
                "summary": "Remove a binding",
                "operationId": "unbindExchange",
                "parameters": [
                    _EXCHANGE,
                    {"name": "key", "in": "query", "schema": {"type": "string", "default": ""}},
                    {"name": "topic", "in": "query", "schema": {"type": "string"}},
                    {"name": "queue", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "204": {"description": "removed"},
                    **_BAD,
                    "404": _error("unknown_exchange or unknown_binding"),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/exchanges/{exchange}/messages": {
            "post": {
                "summary": "Publish: each message to every destination its routing key matches",
                "operationId": "publishExchange",
                "parameters": [_EXCHANGE],
                "requestBody": {"required": True, **_body("Publish", "the messages")},
                "responses": {
                    "200": _body("Published", "where each message went"),
                    **_BAD,
                    **_UNKNOWN,
                    "413": _error("message_too_large"),
                    **_UNAVAILABLE,
                },
            }
        },
        "/v1/request": {
            "post": {
                "summary": "Publish a request and wait for its correlated reply",
                "operationId": "requestReply",
                "description": "The request goes to a topic or through an exchange with the "
                "headers reply-to (the reply topic) and correlation-id; a responder writes its "
                "reply to the reply-to topic with the same correlation-id header.",
                "requestBody": {"required": True, **_body("RequestReply", "the request")},
                "responses": {
                    "200": _body("Reply", "the reply"),
                    **_BAD,
                    "404": _error(
                        "unknown_topic, unknown_exchange, or unroutable: the request matched "
                        "no binding of the exchange"
                    ),
                    "503": _UNAVAILABLE["503"],
                    "504": _error(
                        "timeout: no reply within timeout_ms (retryable; send the same "
                        "correlation_id)"
                    ),
                },
            }
        },
    }
