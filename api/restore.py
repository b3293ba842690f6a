"""The restore endpoint: topics rebuilt from object storage after the cluster lost its disks.

Owns `POST /v1/restore` (body `{"topics": [names]}`, optional: every topic of the bucket); its
OpenAPI description is api/openapi_restore.py, the work Broker.restore_topics (node/restore.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftline.api import validation
from raftline.api.app import _state, read_body, reply
from raftline.api.errors import invalid

MAX_TOPICS = 10_000


def restore_request(body: Any) -> list[str] | None:
    """The topic names asked for; None: every topic of the bucket."""
    if body is None:
        return None
    obj = validation._object(body, "request body")
    validation._no_unknown(obj, frozenset({"topics"}), "request body")
    topics = obj.get("topics")
    if topics is None:
        return None
    if not isinstance(topics, list) or not 0 < len(topics) <= MAX_TOPICS:
        raise invalid(f"topics must be a list of 1..{MAX_TOPICS} topic names")
    return [validation.topic_name(name) for name in topics]


async def restore(request: web.Request) -> web.Response:
    body = await read_body(request) if request.can_read_body else None
    names = restore_request(body)
    restored = await _state(request).broker.restore_topics(names)
    return reply(request, {"topics": restored})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/restore", restore)
