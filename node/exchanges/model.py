"""The exchanges of the cluster metadata: their definitions and the pure rules that change them.

Owns `Exchanges`, which the metadata state machine (node/metadata.py) applies its exchange
commands to, in log order on every replica: create and delete an exchange, bind and unbind a
destination. A destination is a topic, or a queue (written to through its topic, which the node
proposing the binding looks up: a queue keeps its topic for life).

Invariants: every binding and every alternate names a topic that exists (deleting a topic
removes them); an exchange holds no binding twice; binding keys pass `check_pattern` for the
exchange's kind; `version` grows with every change of any exchange, so (name, version) names
one definition for ever (a routing-table cache can key on it).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from raftline.node.exchanges.matcher import KINDS, RoutingTable, check_pattern

EXCHANGE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MAX_BINDINGS = 10_000  # per exchange
COMMANDS = ("create_exchange", "delete_exchange", "bind", "unbind")


class ExchangeError(Exception):
    """A broken exchange rule; `code` is the API error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not EXCHANGE_NAME.match(name):
        raise ExchangeError(
            "invalid_request", f"exchange names are 1-249 of [A-Za-z0-9._-], got {name!r}"
        )
    return name


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a binding writes: a topic, or a queue's topic."""

    topic: str
    queue: str | None = None

    def to_dict(self) -> dict[str, str]:
        if self.queue is None:
            return {"topic": self.topic}
        return {"queue": self.queue, "topic": self.topic}

    @classmethod
    def from_dict(cls, obj: Any) -> Destination:
        if not isinstance(obj, dict) or not isinstance(obj.get("topic"), str):
            raise ExchangeError("invalid_request", f"a destination names a topic, got {obj!r}")
        queue = obj.get("queue")
        if queue is not None and not isinstance(queue, str):
            raise ExchangeError("invalid_request", f"a queue name is a string, got {queue!r}")
        return cls(obj["topic"], queue)


@dataclass(frozen=True, slots=True)
class Binding:
    key: str
    destination: Destination

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, **self.destination.to_dict()}


@dataclass(slots=True)
class Exchange:
    name: str
    kind: str
    alternate: Destination | None
    version: int
    bindings: list[Binding] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "alternate": None if self.alternate is None else self.alternate.to_dict(),
            "bindings": [b.to_dict() for b in self.bindings],
        }

    def table(self) -> RoutingTable[str]:
        """The routing table to topic names (a topic bound twice, say directly and through a
        queue over it, is written to once)."""
        return RoutingTable(self.kind, ((b.key, b.destination.topic) for b in self.bindings))


class Exchanges:
    """Every exchange of the cluster, by name."""

    def __init__(self) -> None:
        self.by_name: dict[str, Exchange] = {}
        self.version = 0

    def apply(self, command: dict[str, Any], topics: Collection[str]) -> dict[str, Any]:
        """Apply one exchange command (op in COMMANDS); `topics` are the existing topics. A
        broken rule raises ExchangeError and changes nothing."""
        op = command.get("op")
        name = check_name(command.get("exchange"))
        if op == "create_exchange":
            return self._create(name, command, topics)
        exchange = self.by_name.get(name)
        if exchange is None:
            raise ExchangeError("unknown_exchange", f"unknown exchange {name!r}")
        if op == "delete_exchange":
            del self.by_name[name]
            self.version += 1
            return {"exchange": name}
        binding = self._binding(exchange, command, topics)
        if op == "bind":
            if binding not in exchange.bindings:
                if len(exchange.bindings) >= MAX_BINDINGS:
                    raise ExchangeError(
                        "invalid_request", f"an exchange has at most {MAX_BINDINGS} bindings"
                    )
                exchange.bindings.append(binding)
                self._changed(exchange)
            return binding.to_dict()
        if op == "unbind":
            if binding not in exchange.bindings:
                raise ExchangeError(
                    "unknown_binding", f"exchange {name!r} has no binding {binding.to_dict()}"
                )
            exchange.bindings.remove(binding)
            self._changed(exchange)
            return binding.to_dict()
        raise ExchangeError("invalid_request", f"unknown exchange command {op!r}")

    def _create(
        self, name: str, command: dict[str, Any], topics: Collection[str]
    ) -> dict[str, Any]:
        if name in self.by_name:
            raise ExchangeError("exchange_exists", f"exchange {name!r} already exists")
        kind = command.get("kind")
        if kind not in KINDS:
            raise ExchangeError(
                "invalid_request", f"kind must be one of {', '.join(KINDS)}, got {kind!r}"
            )
        alternate = command.get("alternate")
        destination = None if alternate is None else _existing(alternate, topics)
        self.version += 1
        self.by_name[name] = Exchange(name, kind, destination, self.version)
        return self.by_name[name].describe()

    def _binding(
        self, exchange: Exchange, command: dict[str, Any], topics: Collection[str]
    ) -> Binding:
        key = command.get("key", "")
        if not isinstance(key, str):
            raise ExchangeError("invalid_request", f"a binding key is a string, got {key!r}")
        if exchange.kind == "fanout":
            key = ""  # a fanout exchange ignores keys: one binding per destination
        problem = check_pattern(exchange.kind, key)
        if problem is not None:
            raise ExchangeError("invalid_request", problem)
        destination = Destination.from_dict(command.get("destination"))
        if command.get("op") == "bind":
            destination = _existing(destination.to_dict(), topics)
        return Binding(key, destination)

    def _changed(self, exchange: Exchange) -> None:
        self.version += 1
        exchange.version = self.version

    def topic_deleted(self, topic: str) -> None:
        """Bindings to a deleted topic (directly or through a queue) go with it, and so does an
        alternate naming it."""
        for exchange in self.by_name.values():
            kept = [b for b in exchange.bindings if b.destination.topic != topic]
            lost_alternate = exchange.alternate is not None and exchange.alternate.topic == topic
            if len(kept) != len(exchange.bindings) or lost_alternate:
                exchange.bindings = kept
                if lost_alternate:
                    exchange.alternate = None
                self._changed(exchange)


def _existing(obj: Any, topics: Collection[str]) -> Destination:
    destination = Destination.from_dict(obj)
    if destination.topic not in topics:
        what = (
            f"queue {destination.queue!r} (topic {destination.topic!r})"
            if destination.queue is not None
            else f"topic {destination.topic!r}"
        )
        raise ExchangeError("unknown_destination", f"no such destination: {what}")
    return destination
