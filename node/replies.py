"""Temporary reply topics of request/reply (POST /v1/request): one per client, created on its
first request, kept alive by its requests, deleted by the controller once unused.

Owns their names (`_reply.<client id>`), their creation with an expiry time and its renewal
(metadata commands `create_topic` with `expires_ms`, `touch_topic`), and the controller's
round that deletes every temporary topic past its expiry. Expiry times are wall-clock ms of
the node that set them; the controller compares them with its own clock, so a skew between
nodes moves an expiry by that much (the TTL is minutes, skews are milliseconds).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

from raftline.node.errors import BrokerError

if TYPE_CHECKING:
    from raftline.node.broker import Broker

REPLY_PREFIX = "_reply."
CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
REPLY_TTL_MS = 120_000  # a reply topic no request has used for this long is deleted
# Replies are read within a request's timeout: keep them briefly, in small segments.
REPLY_TOPIC_CONFIG = {"retention.ms": "600000", "segment.bytes": str(1 << 20)}
LEADER_WAIT_S = 5.0  # a new reply topic waits this long for its partition's leader


def reply_topic(client_id: str) -> str:
    return REPLY_PREFIX + client_id


async def ensure_reply_topic(broker: Broker, topic: str, needed_ms: int) -> None:
    """Make `topic` a reply topic that lives at least `needed_ms` from now: create it, or
    push its expiry on when half of its TTL has passed (a push that fails, say while the
    metadata group elects a leader, is left for the next request when the topic lives long
    enough without it). A topic of that name that is not temporary is refused (a user's own
    topic is never deleted by expiry)."""
    now = broker.clock.now_ms()
    state = broker.meta.state
    if topic in state.topics and topic not in state.expiring:
        await broker.router.barrier()
        if topic in state.topics and topic not in state.expiring:
            raise _not_temporary(topic)
    expires = state.expiring.get(topic)
    if expires is None:
        args = {
            "name": topic,
            "partitions": 1,
            "replication_factor": min(3, max(len(state.nodes), 1)),
            "config": dict(REPLY_TOPIC_CONFIG),
            "expires_ms": now + REPLY_TTL_MS,
        }
        try:
            await broker.router.on_controller("create_topic", args)
        except BrokerError as exc:
            if exc.code != "topic_exists":
                raise
            await broker.router.barrier()  # another request created it a moment ago
            if topic not in broker.meta.state.expiring:
                raise _not_temporary(topic) from None
        else:
            await _leader_elected(broker, topic)
    elif expires - now < REPLY_TTL_MS // 2:
        command = {"op": "touch_topic", "name": topic, "expires_ms": now + REPLY_TTL_MS}
        try:
            await broker.router.on_controller("metadata_command", command)
        except BrokerError as exc:
            if not exc.retryable or expires - now <= needed_ms:
                raise


def _not_temporary(topic: str) -> BrokerError:
    return BrokerError("invalid_request", f"{topic!r} is a topic of its own, not a reply topic")


async def _leader_elected(broker: Broker, topic: str) -> None:
    info = await broker._topic(topic, current=True)
    deadline = time.monotonic() + LEADER_WAIT_S
    while time.monotonic() < deadline and broker.router.live_leader(info.group(0)) is None:
        await asyncio.sleep(0.02)


async def delete_reply_topic(broker: Broker, topic: str) -> None:
    if topic in broker.meta.state.expiring:
        await broker.router.on_controller("delete_topic", {"name": topic})


async def expire_temporary_topics(broker: Broker) -> None:
    """On the controller: delete every temporary topic whose expiry has passed."""
    now = broker.clock.now_ms()
    for name, expires in list(broker.meta.state.expiring.items()):
        if expires <= now:
            try:
                await broker._propose_meta({"op": "delete_topic", "name": name})
            except BrokerError as exc:
                if exc.code != "unknown_topic":
                    raise
