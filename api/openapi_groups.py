"""The OpenAPI description of the consumer-group endpoints (merged into api/openapi.py's).

Owns the group paths, their parameters, bodies, answers and error codes.
"""

from __future__ import annotations

from typing import Any

JSON = "application/json"
MSGPACK = "application/msgpack"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: str | dict[str, Any], description: str) -> dict[str, Any]:
    resolved = _ref(schema) if isinstance(schema, str) else schema
    return {
        "description": description,
        "content": {k: {"schema": resolved} for k in (JSON, MSGPACK)},
    }


def _error(description: str) -> dict[str, Any]:
    return _body("Error", description)


def _objects(properties: dict[str, Any]) -> dict[str, Any]:
    """An array of objects with `properties`."""
    return {"type": "array", "items": {"type": "object", "properties": properties}}


# Where records went or where a group now reads: one topic-partition offset each.
_POSITIONS = _objects(
    {"topic": {"type": "string"}, "partition": {"type": "integer"}, "offset": {"type": "integer"}}
)


_UNAVAILABLE = {
    "503": _error("leader_unavailable: the group's coordinator is electing a leader (retryable)"),
    "504": _error("timeout (retryable)"),
}
_BAD = {"400": _error("invalid_request: malformed body, names or numbers")}
_GROUP = {"name": "group", "in": "path", "required": True, "schema": _ref("GroupName")}
_MEMBER = {
    "name": "member_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._~:@-]{1,249}$"},
}
_TP = {
    "type": "object",
    "required": ["topic", "partition"],
    "properties": {"topic": {"type": "string"}, "partition": {"type": "integer", "minimum": 0}},
}
_ASSIGNMENT = {"type": "array", "items": _TP}

GROUP_SCHEMAS: dict[str, Any] = {
    "GroupName": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"},
    "JoinGroup": {
        "type": "object",
        "required": ["topics"],
        "properties": {
            "topics": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "member_id": {
                "type": "string",
                "description": "client-chosen stable id; joining again with it is idempotent",
            },
            "session_timeout_ms": {
                "type": "integer",
                "minimum": 1000,
                "maximum": 300000,
                "default": 10000,
            },
            "auto_offset_reset": {
                "type": "string",
                "enum": ["earliest", "latest"],
                "default": "latest",
            },
            "assignor": {
                "type": "string",
                "enum": ["sticky", "range"],
                "default": "sticky",
                "description": "taken when the member is the group's first",
            },
            "client": {"type": "string", "description": "free text shown by describe"},
        },
    },
    "Membership": {
        "type": "object",
        "properties": {
            "member_id": {"type": "string"},
            "generation": {"type": "integer"},
            "assignment": _ASSIGNMENT,
            "rebalancing": {
                "type": "boolean",
                "description": "some member has not yet been told the current generation",
            },
        },
    },
    "GroupMessages": {
        "type": "object",
        "properties": {
            "generation": {"type": "integer"},
            "assignment": _ASSIGNMENT,
            "rebalancing": {"type": "boolean"},
            "messages": {
                "type": "array",
                "items": {
                    "allOf": [
                        _ref("FetchedMessage"),
                        {"type": "object", "properties": {"topic": {"type": "string"}}},
                    ]
                },
            },
            "positions": {
                "type": "array",
                "description": "one per assigned partition: where the member's next fetch "
                "starts (null if its partition leader could not be reached)",
                "items": {
                    "type": "object",
                    "properties": {
                        "topic": {"type": "string"},
                        "partition": {"type": "integer"},
                        "offset": {"type": ["integer", "null"]},
                    },
                },
            },
        },
    },
    "CommitOffsets": {
        "type": "object",
        "required": ["member_id", "generation", "offsets"],
        "properties": {
            "member_id": {"type": "string"},
            "generation": {"type": "integer", "minimum": 0},
            "offsets": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["topic", "partition", "offset"],
                    "properties": {
                        "topic": {"type": "string"},
                        "partition": {"type": "integer", "minimum": 0},
                        "offset": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "the next offset to read",
                        },
                    },
                },
            },
        },
    },
    "GroupOffsets": {
        "type": "object",
        "properties": {
            "offsets": _objects(
                {
                    "topic": {"type": "string"},
                    "partition": {"type": "integer"},
                    "offset": {"type": "integer"},
                    "high_watermark": {"type": ["integer", "null"]},
                    "lag": {"type": ["integer", "null"]},
                }
            )
        },
    },
    "ResetOffsets": {
        "type": "object",
        "required": ["topic", "to"],
        "properties": {
            "topic": {"type": "string"},
            "to": {
                "oneOf": [
                    {"type": "string", "enum": ["earliest", "latest"]},
                    {
                        "type": "object",
                        "required": ["timestamp"],
                        "properties": {"timestamp": {"type": "integer", "minimum": 0}},
                    },
                    {
                        "type": "object",
                        "required": ["offset"],
                        "properties": {"offset": {"type": "integer", "minimum": 0}},
                    },
                ]
            },
        },
    },
    "ResetResult": {
        "type": "object",
        "properties": {"offsets": _POSITIONS},
    },
    "GroupList": {
        "type": "object",
        "properties": {
            "groups": _objects(
                {
                    "group": {"type": "string"},
                    "state": {"type": "string", "enum": ["empty", "rebalancing", "stable"]},
                    "members": {"type": "integer"},
                }
            )
        },
    },
    "GroupDescription": {
        "type": "object",
        "properties": {
            "group": {"type": "string"},
            "state": {"type": "string", "enum": ["empty", "rebalancing", "stable"]},
            "generation": {"type": "integer"},
            "assignor": {"type": "string"},
            "members": _objects(
                {
                    "member_id": {"type": "string"},
                    "topics": {"type": "array", "items": {"type": "string"}},
                    "session_timeout_ms": {"type": "integer"},
                    "auto_offset_reset": {"type": "string"},
                    "client": {"type": ["string", "null"]},
                    "joined_ms": {"type": "integer"},
                    "assignment": _ASSIGNMENT,
                }
            ),
            "offsets": _ref("GroupOffsets"),
            "coordinator": {
                "type": "object",
                "properties": {"shard": {"type": "string"}, "leader": {"type": "integer"}},
            },
        },
    },
}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def group_paths() -> dict[str, Any]:
    unknown_member = {"404": _error("unknown_member: expired or never joined; join again")}
    return {
        "/v1/groups": {
            "get": {
                "summary": "List consumer groups",
                "operationId": "listGroups",
                "responses": {"200": _body("GroupList", "every group"), **_UNAVAILABLE},
            }
        },
        "/v1/groups/{group}": {
            "get": {
                "summary": "Describe a group: state, generation, members, assignments, offsets",
                "operationId": "describeGroup",
                "parameters": [_GROUP],
                "responses": {
                    "200": _body("GroupDescription", "the group"),
                    **_BAD,
                    "404": _error("unknown_group"),
                    **_UNAVAILABLE,
                },
            },
            "delete": {
                "summary": "Delete a group without members, committed offsets included",
                "operationId": "deleteGroup",
                "parameters": [_GROUP],
                "responses": {
                    "204": {"description": "deleted"},
                    **_BAD,
                    "404": _error("unknown_group"),
                    "409": _error("group_not_empty"),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/groups/{group}/members": {
            "post": {
                "summary": "Join a group (idempotent for a member_id already in it)",
                "description": "Joining, leaving and expiring members start a new generation "
                "whose assignment the coordinator computes (sticky by default).",
                "operationId": "joinGroup",
                "parameters": [_GROUP],
                "requestBody": {"required": True, **_body("JoinGroup", "the subscription")},
                "responses": {
                    "200": _body("Membership", "the member's generation and assignment"),
                    **_BAD,
                    "404": _error("unknown_topic"),
                    **_UNAVAILABLE,
                },
            }
        },
        "/v1/groups/{group}/members/{member_id}/heartbeat": {
            "post": {
                "summary": "Keep a member's session alive; answers its current assignment",
                "operationId": "heartbeat",
                "parameters": [_GROUP, _MEMBER],
                "responses": {
                    "200": _body("Membership", "generation and assignment"),
                    **_BAD,
                    **unknown_member,
                    **_UNAVAILABLE,
                },
            }
        },
        "/v1/groups/{group}/members/{member_id}": {
            "delete": {
                "summary": "Leave the group (its partitions are reassigned at once)",
                "operationId": "leaveGroup",
                "parameters": [_GROUP, _MEMBER],
                "responses": {
                    "204": {"description": "left"},
                    **_BAD,
                    **unknown_member,
                    **_UNAVAILABLE,
                },
            }
        },
        "/v1/groups/{group}/members/{member_id}/messages": {
            "get": {
                "summary": "Fetch from the member's assigned partitions",
                "description": "Starts at the member's last position, else the group's "
                "committed offset, else auto_offset_reset; counts as a heartbeat, also while it "
                "waits. A long-poll returns as soon as any assigned partition has data or a new "
                "generation starts (then rebalancing is true); wait_ms is capped at 30000. A "
                "client that lost an answer should join again (idempotent): it then reads from "
                "the committed offsets instead of after the lost messages.",
                "operationId": "groupFetch",
                "parameters": [
                    _GROUP,
                    _MEMBER,
                    _query(
                        "max_messages",
                        {"type": "integer", "minimum": 1, "default": 500},
                        "most messages",
                    ),
                    _query(
                        "max_bytes",
                        {"type": "integer", "minimum": 1, "default": 1048576},
                        "byte budget per partition",
                    ),
                    _query("wait_ms", {"type": "integer", "minimum": 0, "default": 0}, "long-poll"),
                    _query(
                        "isolation",
                        {"type": "string", "enum": ["read_uncommitted", "read_committed"]},
                        "read_committed: only non-transactional messages and those of committed "
                        "transactions, each partition up to its last stable offset",
                    ),
                ],
                "responses": {
                    "200": _body("GroupMessages", "messages and positions"),
                    **_BAD,
                    **unknown_member,
                    **_UNAVAILABLE,
                },
            }
        },
        "/v1/groups/{group}/offsets": {
            "post": {
                "summary": "Commit offsets (all or nothing), fenced by generation",
                "description": "The generation must be the group's current one and every "
                "partition must be assigned to the member in it; else nothing is committed. "
                "Before a join takes partitions from a member, the member's heartbeat and fetch "
                "answers say rebalancing: true in its current generation, so it can commit what "
                "it processed first.",
                "operationId": "commitOffsets",
                "parameters": [_GROUP],
                "requestBody": {"required": True, **_body("CommitOffsets", "offsets")},
                "responses": {
                    "204": {"description": "committed"},
                    **_BAD,
                    "404": _error("unknown_member, unknown_topic or unknown_partition"),
                    "409": _error("stale_generation: nothing was committed"),
                    "416": _error("offset_out_of_range: an offset is past the high watermark"),
                    **_UNAVAILABLE,
                },
            },
            "get": {
                "summary": "Committed offsets with high watermarks and lag",
                "operationId": "groupOffsets",
                "parameters": [_GROUP],
                "responses": {
                    "200": _body("GroupOffsets", "offsets"),
                    **_BAD,
                    "404": _error("unknown_group"),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/groups/{group}/offsets/reset": {
            "post": {
                "summary": "Reset a topic's committed offsets while the group has no members",
                "description": "A timestamp resets each partition to its first message at or "
                "after it (the time index), or to its high watermark when none is. A group "
                "not seen before is created with these offsets.",
                "operationId": "resetOffsets",
                "parameters": [_GROUP],
                "requestBody": {"required": True, **_body("ResetOffsets", "where to")},
                "responses": {
                    "200": _body("ResetResult", "the new offsets"),
                    **_BAD,
                    "404": _error("unknown_topic"),
                    "409": _error("group_not_empty"),
                    "416": _error("offset_out_of_range: outside the partition's log"),
                    **_UNAVAILABLE,
                },
            }
        },
    }
