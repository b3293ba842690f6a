"""Errors the broker raises to the HTTP layer, each carrying one of API.md's error codes.

Owns the contract's code -> (HTTP status, retryable) table and the not-the-leader signal for
forwarding.
"""

from __future__ import annotations

from typing import Any

# code -> (HTTP status, retryable), as listed in the contract; the HTTP layer answers with it too.
ERROR_CODES: dict[str, tuple[int, bool]] = {
    "invalid_request": (400, False),
    "unknown_topic": (404, False),
    "unknown_partition": (404, False),
    "not_found": (404, False),
    "method_not_allowed": (405, False),
    "topic_exists": (409, False),
    "unknown_group": (404, False),
    "unknown_member": (404, False),
    "stale_generation": (409, False),
    "group_not_empty": (409, False),
    "out_of_order_sequence": (409, False),
    "producer_fenced": (409, False),
    "invalid_txn_state": (409, False),
    "concurrent_transactions": (409, True),
    "unknown_transactional_id": (404, False),
    "unknown_queue": (404, False),
    "queue_exists": (409, False),
    "unknown_exchange": (404, False),
    "exchange_exists": (409, False),
    "unknown_binding": (404, False),
    "unknown_destination": (404, False),
    "message_too_large": (413, False),
    "unsupported_media_type": (415, False),
    "offset_out_of_range": (416, False),
    "internal_error": (500, True),
    "not_enough_replicas": (503, True),
    "leader_unavailable": (503, True),
    "not_leader": (503, True),  # internal: this node does not lead the group (nothing done)
    "timeout": (504, True),
}


class BrokerError(Exception):
    """A request the broker cannot serve; `extra` adds fields to the error body."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool | None = None,
        status: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        default_status, default_retryable = ERROR_CODES.get(code, (500, True))
        self.code = code
        self.message = message
        self.retryable = default_retryable if retryable is None else retryable
        self.status = default_status if status is None else status
        self.extra = dict(extra or {})


class NotLeader(BrokerError):
    """This node does not lead the group; `leader` (node id) and `leader_http` (where it serves)
    name the leader as this node sees it, if it knows one that is reachable. `electable` is
    False when this node cannot reach a majority of the group's replicas, or the leader it
    knows has been unreachable for an election timeout with no new one heard of (the others
    still follow that one): waiting here for a new leader is pointless, so callers answer at
    once."""

    def __init__(
        self,
        message: str,
        leader_http: str | None,
        *,
        group: str = "",
        leader: int | None = None,
        electable: bool = True,
    ) -> None:
        super().__init__("leader_unavailable", message, extra={"leader_http": leader_http})
        self.leader_http = leader_http
        self.group = group
        self.leader = leader
        self.electable = electable


class OutcomeUnknown(BrokerError):
    """A write reached a leader that lost its leadership (or went silent) before answering: it
    may still commit under the next leader, so no layer of the node retries it by itself; the
    client gets a retryable 503 and decides."""

    rpc_code = "outcome_unknown"  # node.transport.OUTCOME_UNKNOWN: how node-to-node calls say it

    def __init__(self, message: str) -> None:
        super().__init__("leader_unavailable", message)
