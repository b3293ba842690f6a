"""The topic settings of tiered storage: `remote.storage.enable`, `local.retention.ms|bytes`.

Owns their validation (Kafka's names and rules: -2 = as `retention.*`, -1 = unlimited) and the
retention a replica applies to its local disk when remote storage is on.
"""

from __future__ import annotations

import re

REMOTE_STORAGE = "remote.storage.enable"
LOCAL_RETENTION_MS = "local.retention.ms"
LOCAL_RETENTION_BYTES = "local.retention.bytes"
KEYS = (REMOTE_STORAGE, LOCAL_RETENTION_MS, LOCAL_RETENTION_BYTES)
AS_RETENTION = -2  # Kafka's default for local.retention.*: the same as retention.*
_DAY_MS = 24 * 3600 * 1000


def remote_enabled(config: dict[str, str]) -> bool:
    return config.get(REMOTE_STORAGE, "false") == "true"


def check_value(key: str, text: str) -> str | None:
    """What is wrong with one tiered setting on its own (None: nothing)."""
    if key == REMOTE_STORAGE and text not in ("true", "false"):
        return f"{REMOTE_STORAGE} must be true or false, got {text!r}"
    if key != REMOTE_STORAGE and (
        not re.fullmatch(r"-?\d{1,19}", text) or int(text) < AS_RETENTION
    ):
        return f"{key} must be an integer >= -2 (-2: as retention, -1: unlimited), got {text!r}"
    return None


def check(config: dict[str, str]) -> str | None:
    """What is wrong with the tiered settings of a topic's config (None: nothing)."""
    for key in KEYS:
        if key in config and (problem := check_value(key, config[key])) is not None:
            return problem
    for key in (LOCAL_RETENTION_MS, LOCAL_RETENTION_BYTES):
        text = config.get(key)
        if text is None:
            continue
        if not remote_enabled(config):
            return f"{key} bounds local disk only with {REMOTE_STORAGE}=true"
        whole = int(config.get(key.removeprefix("local."), _default(key)))
        local = int(text)
        if whole >= 0 and (local == -1 or local > whole):
            return f"{key} ({local}) must not exceed {key.removeprefix('local.')} ({whole})"
    if remote_enabled(config) and "compact" in config.get("cleanup.policy", "delete"):
        return f"{REMOTE_STORAGE}=true is not supported on compacted topics (as in Kafka)"
    return None


def _default(key: str) -> int:
    return 7 * _DAY_MS if key == LOCAL_RETENTION_MS else -1


def local_retention(config: dict[str, str]) -> dict[str, int]:
    """LogConfig settings for local disk when remote storage is on: local.retention.*, each
    falling back to retention.* (the bucket keeps the rest until retention.* ends it)."""
    out = {}
    for key, setting in (
        (LOCAL_RETENTION_MS, "retention_ms"),
        (LOCAL_RETENTION_BYTES, "retention_bytes"),
    ):
        value = int(config.get(key, AS_RETENTION))
        if value == AS_RETENTION:
            value = int(config.get(key.removeprefix("local."), _default(key)))
        out[setting] = value
    return out
