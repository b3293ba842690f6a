"""Where each try of a request goes, and whether and when a failed request is tried again.

Owns the bootstrap list and its rotation, the retry policy and one request's tries. A retryable
failure sends the next try to another bootstrap node than the one that failed (a paused or
cut-off node does not hold the client); a leader address that cannot be reached is skipped
until the next metadata update. No I/O here: the shells sleep the delays these return.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from raftline.clients.metadata import Metadata
from raftline.clients.wire import RaftlineError


@dataclass(slots=True)
class RetryPolicy:
    """Exponential backoff with jitter for retryable errors. A retried produce whose first try
    reached the leader may be written twice, unless the producer is idempotent (then the
    broker answers the retry with the original's offsets)."""

    retries: int = 5
    backoff_ms: int = 100
    max_backoff_ms: int = 2000

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        base = min(self.max_backoff_ms, self.backoff_ms * 2**attempt) / 1000
        if retry_after is not None:
            base = min(max(base, retry_after), self.max_backoff_ms / 1000)
        return base * random.uniform(0.5, 1.0)


def _retry_after(error: RaftlineError) -> float | None:
    # Leader elections typically settle well under a second; the header's 1 s is an upper bound.
    return 0.2 if error.code == "leader_unavailable" else None


class Nodes:
    """The bootstrap list (`url`: base URLs separated by commas) and the node it asks next."""

    def __init__(self, url: str, metadata: Metadata) -> None:
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        if not self.urls:
            raise ValueError("no node URL given")
        self.metadata = metadata
        self._current = 0

    def base_url(self, url: str | None) -> str:
        """`url`, or the bootstrap node asked now when it is None."""
        return url or self.urls[self._current % len(self.urls)]

    def failed(self, url: str | None, error: RaftlineError) -> None:
        """A try at `url` (None: the bootstrap node) failed with a retryable `error`."""
        if url is not None and error.code == "connection_failed":
            self.metadata.unreachable.add(url)  # ask the bootstrap nodes instead
        failed_at = error.node or self.base_url(url)
        if self.urls[self._current % len(self.urls)] == failed_at:
            self._current += 1  # the next try goes to the next bootstrap node


class Tries:
    """The tries of one request: the node the next one goes to (`url`; None: a bootstrap
    node) and, after a failure, how long to wait first or that it is the end."""

    def __init__(self, policy: RetryPolicy, nodes: Nodes, url: str | None) -> None:
        self.url = url
        self._policy = policy
        self._nodes = nodes
        self._attempt = 0

    def failed(self, error: RaftlineError) -> float:
        """Seconds to wait before the next try after `error`; re-raises it when none is due."""
        if error.retryable:
            self._nodes.failed(self.url, error)  # also when none is due: the next call moves on
        if not error.retryable or self._attempt >= self._policy.retries:
            raise error
        self.url = None  # after a failure, ask a bootstrap node (it forwards to the leader)
        delay = self._policy.delay(self._attempt, _retry_after(error))
        self._attempt += 1
        return delay
