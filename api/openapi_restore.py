"""The OpenAPI description of `POST /v1/restore` (merged into api/openapi.py's).

Owns the restore path, its body and its answers.
"""

from __future__ import annotations

from typing import Any

from raftline.api.openapi_groups import _body, _error

_PARTITION = {
    "type": "object",
    "properties": {
        "partition": {"type": "integer"},
        "start_offset": {"type": "integer", "description": "first offset the bucket holds"},
        "next_offset": {
            "type": "integer",
            "description": "the restored log starts here; new writes continue after it",
        },
        "segments": {"type": "integer"},
        "size_bytes": {"type": "integer"},
    },
}
_RESTORED = {
    "type": "object",
    "properties": {
        "topics": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "topic_id": {"type": "integer"},
                    "replication_factor": {"type": "integer"},
                    "restored": {"type": "boolean"},
                    "reason": {"type": "string", "enum": ["topic_exists"]},
                    "partitions": {"type": "array", "items": _PARTITION},
                },
            },
        }
    },
}


def restore_paths() -> dict[str, Any]:
    return {
        "/v1/restore": {
            "post": {
                "summary": "Rebuild topics from object storage (after every node lost its disk)",
                "description": "Reads the bucket of the node's --s3-* flags (tiered/FORMAT.md): "
                "each topic object (the latest incarnation of each name) becomes a topic with "
                "the same name, id, settings and partitions; each partition's log starts at "
                "its manifest's next_offset, reads below it come from the bucket, and new "
                "writes continue after it. Topics that already exist are left alone "
                '(`"restored": false, "reason": "topic_exists"`). Records never uploaded are '
                "lost (bounded by segment.ms).",
                "requestBody": {
                    "required": False,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "topics": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                        "description": "names to restore (default: all)",
                                    }
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": _body(_RESTORED, "what was restored"),
                    "400": _error(
                        "invalid_request: no object storage configured, a name the bucket "
                        "lacks, or an unreadable bucket object"
                    ),
                    "503": _error("leader_unavailable: object storage unreachable (retryable)"),
                    "504": _error("timeout (retryable)"),
                },
            }
        }
    }
