"""Workload descriptions in the OpenMessaging Benchmark's spirit, loaded from YAML or JSON files.

Owns the workload fields, their validation and the quick-run overrides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

WORKLOAD_DIR = Path(__file__).parent / "workloads"
ACKS = ("all", "leader", "none")
# "log": consumers read partitions from their start; "queue-ack": a queue over the topic's
# partitions whose receivers share the work and acknowledge every message (bench.drivers.base).
KINDS = ("log", "queue-ack")
# A 1 MB message must still fit in NATS's default 1 MiB max_payload, hence decimal megabytes.
MAX_MESSAGE_SIZE = 8_000_000
MIN_MESSAGE_SIZE = 16  # the payload carries the intended send time and a sequence number


class WorkloadError(ValueError):
    """A workload file or field is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class Workload:
    """One benchmark scenario; `producer_rate` 0 means as fast as acknowledgements allow."""

    name: str
    kind: str = "log"
    topics: int = 1
    partitions_per_topic: int = 1
    message_size: int = 1024
    producers_per_topic: int = 1
    consumers_per_topic: int = 1
    producer_rate: int = 0
    # Fixed rate as a fraction of the max rate that `rate_of_workload` measured in the same run.
    rate_fraction: float = 0.0
    rate_of_workload: str = ""
    duration_seconds: float = 60.0
    warmup_seconds: float = 10.0
    acks: str = "all"
    batch_size: int = 100
    max_in_flight: int = 8
    # At a fixed rate, how long due messages may wait to fill a batch (as Kafka's linger.ms).
    linger_ms: float = 5.0
    quick_duration_seconds: float = 3.0
    quick_warmup_seconds: float = 1.0
    in_quick: bool = True

    @property
    def max_rate(self) -> bool:
        return self.producer_rate == 0 and self.rate_fraction == 0.0

    def for_quick_run(self) -> Workload:
        """The same scenario with the short quick-run timings."""
        return replace(
            self,
            duration_seconds=self.quick_duration_seconds,
            warmup_seconds=self.quick_warmup_seconds,
        )


# Field annotations are strings under postponed evaluation; map them back to the types.
_FIELD_TYPES: dict[str, type] = {
    f.name: {"str": str, "int": int, "float": float, "bool": bool}[str(f.type)]
    for f in fields(Workload)
}


def _coerce(key: str, value: Any) -> Any:
    kind = _FIELD_TYPES[key]
    # bool is an int subclass: refuse `topics: true` and `in_quick: 1` alike.
    if kind is bool:
        if not isinstance(value, bool):
            raise WorkloadError(f"{key} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool):
        raise WorkloadError(f"{key} must be a {kind.__name__}, got {value!r}")
    if kind is float and isinstance(value, int):
        return float(value)
    if not isinstance(value, kind):
        raise WorkloadError(f"{key} must be a {kind.__name__}, got {value!r}")
    return value


def _validate(workload: Workload) -> Workload:
    positive = ("topics", "partitions_per_topic", "producers_per_topic", "batch_size")
    for key in (*positive, "max_in_flight"):
        if getattr(workload, key) < 1:
            raise WorkloadError(f"{key} must be at least 1")
    if workload.consumers_per_topic < 0 or workload.producer_rate < 0:
        raise WorkloadError("consumers_per_topic and producer_rate must not be negative")
    if not MIN_MESSAGE_SIZE <= workload.message_size <= MAX_MESSAGE_SIZE:
        raise WorkloadError(
            f"message_size must be within [{MIN_MESSAGE_SIZE}, {MAX_MESSAGE_SIZE}] bytes"
        )
    for key in ("duration_seconds", "quick_duration_seconds"):
        if not 0 < getattr(workload, key) <= 3600:
            raise WorkloadError(f"{key} must be within (0, 3600]")
    if not 0 <= workload.linger_ms <= 1000:
        raise WorkloadError("linger_ms must be within [0, 1000]")
    for key in ("warmup_seconds", "quick_warmup_seconds"):
        if not 0 <= getattr(workload, key) <= 600:
            raise WorkloadError(f"{key} must be within [0, 600]")
    if workload.kind not in KINDS:
        raise WorkloadError(f"kind must be one of {KINDS}, got {workload.kind!r}")
    if workload.acks not in ACKS:
        raise WorkloadError(f"acks must be one of {ACKS}, got {workload.acks!r}")
    if not 0.0 <= workload.rate_fraction <= 1.0:
        raise WorkloadError("rate_fraction must be within [0, 1]")
    if (workload.rate_fraction > 0) != bool(workload.rate_of_workload):
        raise WorkloadError("rate_fraction and rate_of_workload go together")
    if workload.rate_fraction > 0 and workload.producer_rate > 0:
        raise WorkloadError("give either producer_rate or rate_fraction, not both")
    return workload


def workload_from_dict(data: Any, default_name: str = "") -> Workload:
    """Build and validate a workload from parsed YAML or JSON."""
    if not isinstance(data, dict):
        raise WorkloadError("a workload is a mapping of field names to values")
    unknown = set(data) - set(_FIELD_TYPES)
    if unknown:
        raise WorkloadError(f"unknown workload fields: {sorted(unknown)}")
    values = {key: _coerce(key, value) for key, value in data.items()}
    values.setdefault("name", default_name)
    if not values["name"]:
        raise WorkloadError("a workload needs a name")
    return _validate(Workload(**values))


def load_workload(path: Path) -> Workload:
    """Read one workload file (.yaml, .yml or .json); its name defaults to the file stem."""
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise WorkloadError(f"{path}: {error}") from error
    elif path.suffix in (".yaml", ".yml"):
        import yaml  # only needed for YAML files; part of the `bench` extra

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise WorkloadError(f"{path}: {error}") from error
    else:
        raise WorkloadError(f"{path}: workload files end in .yaml, .yml or .json")
    return workload_from_dict(data, default_name=path.stem)


def load_workloads(directory: Path = WORKLOAD_DIR) -> list[Workload]:
    """All workloads in a folder, ordered so that rate_of_workload references come first."""
    paths = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
    return order_workloads([load_workload(p) for p in paths])


def order_workloads(workloads: list[Workload]) -> list[Workload]:
    """Max-rate workloads first, then those whose rate derives from one of them."""
    names = {w.name for w in workloads}
    for workload in workloads:
        if workload.rate_of_workload and workload.rate_of_workload not in names:
            raise WorkloadError(
                f"{workload.name}: rate_of_workload {workload.rate_of_workload!r} is not loaded"
            )
        if workload.rate_of_workload == workload.name:
            raise WorkloadError(f"{workload.name}: rate_of_workload names itself")
    return sorted(workloads, key=lambda w: bool(w.rate_of_workload))
