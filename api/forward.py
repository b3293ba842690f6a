"""Forwarding of produce batches and fetches to the partition leader over the internal HTTP API.

Owns the shared aiohttp session between nodes and the translation of remote answers into errors.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import aiohttp

from raftline.api.errors import ApiError
from raftline.node.transport import tune_peer_socket

FORWARDED_HEADER = "X-Raftline-Forwarded"
REQUEST_TIMEOUT_S = 30.0


class LeaderMoved(Exception):
    """The node we forwarded to does not lead the partition (any more): nothing was written."""


class LeaderUnreachable(Exception):
    """Connecting to the leader failed before the request was sent: safe to retry."""


def _peer_socket(addr_info: Any) -> socket.socket:
    """Sockets to other nodes retransmit after the floor node-to-node links use."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family, kind, proto)
    tune_peer_socket(sock)
    return sock


class Forwarder:
    """One keep-alive session to the other nodes; opened on first use, closed with the app."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, connect=2.0),
                connector=aiohttp.TCPConnector(
                    limit=64, keepalive_timeout=30, socket_factory=_peer_socket
                ),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def produce(
        self,
        leader_http: str,
        topic: str,
        partition: int,
        batch: bytes,
        acks: str,
        transactional_id: str | None = None,
    ) -> tuple[int, bool]:
        """(base offset, duplicate) from the leader's internal batch endpoint."""
        url = f"http://{leader_http}/v1/internal/topics/{topic}/partitions/{partition}/batch"
        params = {"acks": acks}
        if transactional_id is not None:
            params["transactional_id"] = transactional_id
        body = await self._call(
            "POST",
            url,
            params=params,
            data=batch,
            headers={"Content-Type": "application/octet-stream", FORWARDED_HEADER: "1"},
        )
        return int(body["base_offset"]), bool(body.get("duplicate", False))

    async def fetch(
        self, leader_http: str, topic: str, partition: int, params: dict[str, str]
    ) -> dict[str, Any]:
        url = f"http://{leader_http}/v1/topics/{topic}/partitions/{partition}/messages"
        # A long-poll may legitimately take wait_ms before the leader answers.
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S + int(params["wait_ms"]) / 1000)
        return await self._call(
            "GET", url, params=params, headers={FORWARDED_HEADER: "1"}, timeout=timeout
        )

    async def _call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            async with self._client().request(method, url, **kwargs) as response:
                raw = await response.read()
                status = response.status
        except aiohttp.ClientConnectorError as exc:
            raise LeaderUnreachable(str(exc)) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            # The leader may have applied the request: ambiguous, so not retried here.
            raise ApiError(
                "leader_unavailable", f"the partition leader stopped answering: {exc}"
            ) from exc
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            raise ApiError("leader_unavailable", "the partition leader sent a bad answer") from None
        if status < 300:
            return body
        error = body.get("error", {}) if isinstance(body, dict) else {}
        code = error.get("code", "internal_error")
        if code == "leader_unavailable" and "leader_http" in body:
            raise LeaderMoved(f"leader moved to {body['leader_http']}")
        extra = {k: v for k, v in body.items() if k != "error"}
        raise ApiError(
            code,
            str(error.get("message", "forwarded request failed")),
            status=status,
            retryable=bool(error.get("retryable", status >= 500)),
            extra=extra,
        )
