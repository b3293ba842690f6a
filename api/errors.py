"""Error bodies of the v1 contract: `{"error": {"code", "message", "retryable"}}` with its status.

Owns the code -> (status, retryable) table and the conversion of any failure into that body.
"""

from __future__ import annotations

from typing import Any

# code -> (HTTP status, retryable), as listed in the contract.
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

RETRY_AFTER_SECONDS = 1


class ApiError(Exception):
    """A failure that becomes one contract error body; `extra` adds top-level body fields."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        default_status, default_retryable = ERROR_CODES.get(code, (500, False))
        self.code = code
        self.message = message
        self.status = status if status is not None else default_status
        self.retryable = retryable if retryable is not None else default_retryable
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "error": {"code": self.code, "message": self.message, "retryable": self.retryable}
        }
        # offset_out_of_range carries log_start_offset/high_watermark beside "error".
        body.update(self.extra)
        return body

    def headers(self) -> dict[str, str]:
        if self.status == 503 or self.code == "leader_unavailable":
            return {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return {}


def invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message)


def from_broker_error(exc: Exception) -> ApiError:
    """Adopt a node BrokerError (duck-typed: code, message, retryable, status, extra)."""
    code = getattr(exc, "code", "internal_error")
    default_status, default_retryable = ERROR_CODES.get(code, (500, True))
    extra = dict(getattr(exc, "extra", None) or {})
    leader_http = getattr(exc, "leader_http", None)
    if leader_http:
        extra.setdefault("leader_http", leader_http)
    return ApiError(
        code,
        str(getattr(exc, "message", None) or exc),
        status=getattr(exc, "status", None) or default_status,
        retryable=getattr(exc, "retryable", default_retryable),
        extra=extra,
    )
