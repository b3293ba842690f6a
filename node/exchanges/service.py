"""The exchange calls of a node: definitions read from the local metadata replica, changes
proposed to the metadata group through the controller (wherever it is), and routing tables.

Owns resolving a queue destination to its topic before a binding is proposed, the read of an
exchange for a publish, and the compiled routing table of each exchange definition (cached by
its version).

A publish reads the exchange after a metadata read barrier, so a binding acknowledged by any
node is in effect for every publish that starts after the acknowledgement; while the metadata
group has no leader that answers within an election timeout, the publish goes on with this
node's view (routing stays available without a controller, possibly a moment stale).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from raftline.node.errors import BrokerError
from raftline.node.exchanges.matcher import RoutingTable
from raftline.node.exchanges.model import Exchange

if TYPE_CHECKING:
    from raftline.node.broker import Broker

MAX_TABLES = 1_024  # compiled routing tables kept per node


class ExchangeService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._tables: dict[tuple[str, int], RoutingTable[str]] = {}

    async def _propose(self, command: dict[str, Any]) -> dict[str, Any]:
        return await self.broker.router.on_controller("metadata_command", command)

    async def destination(self, spec: dict[str, str]) -> dict[str, str]:
        """`{"topic": t}` as is; `{"queue": q}` completed with the queue's topic."""
        queue = spec.get("queue")
        if queue is None:
            return {"topic": spec["topic"]}
        try:
            described = await self.broker.queue_call(queue, "queue_describe", {})
        except BrokerError as exc:
            if exc.code != "unknown_queue":
                raise
            raise BrokerError(
                "unknown_destination", f"no such destination: queue {queue!r}"
            ) from None
        return {"queue": queue, "topic": str(described["topic"])}

    async def create(
        self, name: str, kind: str, alternate: dict[str, str] | None
    ) -> dict[str, Any]:
        command: dict[str, Any] = {"op": "create_exchange", "exchange": name, "kind": kind}
        if alternate is not None:
            command["alternate"] = await self.destination(alternate)
        return await self._propose(command)

    async def delete(self, name: str) -> None:
        await self._propose({"op": "delete_exchange", "exchange": name})

    async def bind(self, name: str, key: str, destination: dict[str, str]) -> dict[str, Any]:
        await self.exchange(name)  # an unknown exchange is named before an unknown queue
        command = {
            "op": "bind",
            "exchange": name,
            "key": key,
            "destination": await self.destination(destination),
        }
        return await self._propose(command)

    async def unbind(self, name: str, key: str, destination: dict[str, str]) -> dict[str, Any]:
        exchange = await self.exchange(name)
        queue = destination.get("queue")
        topic = destination.get("topic")
        if queue is not None:  # the queue may be gone: its binding names its topic
            topic = next(
                (b.destination.topic for b in exchange.bindings if b.destination.queue == queue),
                "",
            )
        spec = {"topic": topic} if queue is None else {"queue": queue, "topic": topic}
        command = {"op": "unbind", "exchange": name, "key": key, "destination": spec}
        return await self._propose(command)

    async def for_publish(self, name: str) -> Exchange:
        """The exchange as new as the metadata leader has it, or this node's view when that
        leader does not answer within an election timeout."""
        with contextlib.suppress(BrokerError, TimeoutError):
            await asyncio.wait_for(
                self.broker.router.barrier(), self.broker.router.election_timeout_s
            )
        return await self.exchange(name)

    async def exchange(self, name: str, current: bool = False) -> Exchange:
        """The exchange's definition as this node's metadata has it; with `current`, or when
        it is not known here, after a read barrier (as new as anything committed before)."""
        exchanges = self.broker.meta.state.exchanges.by_name
        if current or name not in exchanges:
            await self.broker.router.barrier()
            exchanges = self.broker.meta.state.exchanges.by_name
        found = exchanges.get(name)
        if found is None:
            raise BrokerError("unknown_exchange", f"unknown exchange {name!r}")
        return found

    async def describe(self, name: str) -> dict[str, Any]:
        return (await self.exchange(name, current=True)).describe()

    async def list(self) -> list[dict[str, Any]]:
        await self.broker.router.barrier()
        return [
            {"name": x.name, "kind": x.kind, "bindings": len(x.bindings)}
            for x in sorted(self.broker.meta.state.exchanges.by_name.values(), key=_name)
        ]

    def table(self, exchange: Exchange) -> RoutingTable[str]:
        key = (exchange.name, exchange.version)
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= MAX_TABLES:
                self._tables.clear()
            table = self._tables[key] = exchange.table()
        return table


def _name(exchange: Exchange) -> str:
    return exchange.name
