"""Receipts: the opaque handle a receiver gets with each delivery and gives back to settle it.

Owns their encoding and their check. A receipt names the queue incarnation, partition, offset
and delivery attempt, and carries an HMAC-SHA256 (truncated to 128 bits) over those and the
queue's name, keyed by the shard's secret (chosen once by a leader and held in the replicated
shard state, so every later leader checks what an earlier one issued). A receipt of another
queue, an altered one, or garbage fails the check: `invalid_receipt`, and nothing is settled.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import NamedTuple

from raftline.node.queues.state import QueueError

VERSION = "r1"
MAC_BYTES = 16
MAX_RECEIPT_CHARS = 512


class Receipt(NamedTuple):
    incarnation: str
    partition: int
    offset: int
    attempt: int


def _mac(secret: str, queue: str, body: str) -> str:
    digest = hmac.new(bytes.fromhex(secret), f"{queue}\n{body}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(digest.digest()[:MAC_BYTES]).decode().rstrip("=")


def encode(secret: str, queue: str, receipt: Receipt) -> str:
    body = f"{VERSION}.{receipt.incarnation}.{receipt.partition}.{receipt.offset}.{receipt.attempt}"
    return f"{body}.{_mac(secret, queue, body)}"


def decode(secret: str | None, queue: str, text: object) -> Receipt:
    """The receipt `text` names, if this shard issued it for `queue`; else QueueError
    invalid_receipt."""
    if not isinstance(text, str) or len(text) > MAX_RECEIPT_CHARS or secret is None:
        raise QueueError("invalid_receipt", "not a receipt of this queue")
    body, _, mac = text.rpartition(".")
    parts = body.split(".")
    if len(parts) != 5 or parts[0] != VERSION:
        raise QueueError("invalid_receipt", "not a receipt of this queue")
    if not hmac.compare_digest(mac, _mac(secret, queue, body)):
        raise QueueError("invalid_receipt", "not a receipt of this queue (bad signature)")
    try:
        return Receipt(parts[1], int(parts[2]), int(parts[3]), int(parts[4]))
    except ValueError:
        raise QueueError("invalid_receipt", "not a receipt of this queue") from None
