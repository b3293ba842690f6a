"""Error bodies of the v1 contract: `{"error": {"code", "message", "retryable"}}` with its status.

Owns the conversion of any failure into that body.
"""

from __future__ import annotations

from typing import Any

from raftline.node.errors import ERROR_CODES

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
