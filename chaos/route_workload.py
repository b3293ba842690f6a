"""The routing workload: publishers send unique values through one fanout exchange bound to
several topics, recorded op by op over the HTTP API for chaos/route_checker.py; after the
faults, every destination is read whole with read_committed.

Owns the exchange's setup (its topics, the exchange, the bindings), the publishers, the history
shape of publish / route-final (see route_checker.py) and the final read.

Rules that keep the history honest: a publish is never retried (a lost answer is `info` and
the next publish sends a new value); a 4xx answer is `fail` (nothing is visible: refused
before writing, or written in a transaction that was aborted). The final read waits until no
transaction is open on a destination (no data past its last stable offset), so an abandoned
transaction is first aborted by its coordinator's timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from raftline.chaos.workload import Workload

READ_MAX = 1_000


@dataclass
class RouteWorkload:
    """Publishers through `exchange`, a fanout to `destinations` topics of one partition."""

    work: Workload
    exchange: str = "chaos-route"
    destinations: int = 3
    sequence: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def topics(self) -> list[str]:
        return [f"{self.work.topic}-route-{i}" for i in range(self.destinations)]

    @property
    def scope(self) -> tuple[str, str]:
        return ("exchange", self.exchange)

    async def _until_done(
        self,
        http: aiohttp.ClientSession,
        path: str,
        body: Any,
        done_codes: tuple[str, ...],
        deadline: float,
    ) -> bool:
        while time.monotonic() < deadline:
            _, outcome = await self.work.request_picked(http, self.scope, "POST", path, body)
            if outcome.type == "ok" or outcome.error in done_codes:
                return True
            await asyncio.sleep(0.5)
        return False

    async def setup(self, http: aiohttp.ClientSession, deadline: float) -> bool:
        """Creates the topics, the exchange and its bindings, retrying until all exist."""
        for topic in self.topics:
            body = {
                "name": topic,
                "partitions": 1,
                "replication_factor": self.work.replication_factor,
            }
            if not await self._until_done(http, "/v1/topics", body, ("topic_exists",), deadline):
                return False
        exchange = {"name": self.exchange, "kind": "fanout"}
        if not await self._until_done(
            http, "/v1/exchanges", exchange, ("exchange_exists",), deadline
        ):
            return False
        for topic in self.topics:
            path = f"/v1/exchanges/{self.exchange}/bindings"
            if not await self._until_done(http, path, {"topic": topic}, (), deadline):
                return False
        return True

    async def publisher(self, http: aiohttp.ClientSession, process: int, until: float) -> None:
        recorder = self.work.recorder
        path = f"/v1/exchanges/{self.exchange}/messages"
        while time.monotonic() < until:
            value = f"route-{process}-{next(self.sequence)}"
            endpoint = self.work.nodes.pick(self.scope)
            invoke = recorder.invoke(process, "publish", {"value": value}, endpoint.name)
            outcome = await self.work.request(
                http,
                endpoint,
                "POST",
                path,
                {"messages": [{"value": value}]},
                ("results",),
                scope=self.scope,
            )
            if outcome.type == "ok":
                routed = outcome.body["results"][0]["routed"]
                places = [[r["topic"], r["partition"], r["offset"]] for r in routed]
                recorder.complete(invoke, "ok", {"value": value, "routed": places})
            else:
                recorder.complete(invoke, outcome.type, {"value": value}, outcome.error)
                await asyncio.sleep(0.05)

    async def read_topic(
        self, http: aiohttp.ClientSession, topic: str, deadline: float
    ) -> list[list[Any]] | None:
        """[partition, offset, value] of every committed message of `topic`, read once no
        transaction is open on it; None if that did not happen before `deadline`."""
        while time.monotonic() < deadline:
            entries: list[list[Any]] = []
            offset, caught_up, settled = 0, False, False
            while not caught_up and time.monotonic() < deadline:
                _, outcome = await self.work.request_picked(
                    http,
                    self.scope,
                    "GET",
                    f"/v1/topics/{topic}/partitions/0/messages?offset={offset}"
                    f"&max_messages={READ_MAX}&isolation=read_committed",
                    expect=("messages", "next_offset", "last_stable_offset", "high_watermark"),
                )
                if outcome.type != "ok":
                    await asyncio.sleep(0.3)
                    continue
                body = outcome.body
                entries += [[0, m["offset"], m.get("value")] for m in body["messages"]]
                offset = int(body["next_offset"])
                stable_end = int(body["last_stable_offset"])
                caught_up = not body["messages"] and offset >= stable_end
                settled = stable_end == int(body["high_watermark"])
            if caught_up and settled:
                return entries
            await asyncio.sleep(1.0)  # a transaction is open: its coordinator will end it
        return None

    async def final_phase(
        self, http: aiohttp.ClientSession, process: int, deadline: float
    ) -> dict[str, Any]:
        """Reads every destination and records `route-final`."""
        topics: dict[str, list[list[Any]]] = {}
        for topic in self.topics:
            entries = await self.read_topic(http, topic, deadline)
            if entries is None:
                break
            topics[topic] = entries
        invoke = self.work.recorder.invoke(process, "route-final", {})
        read = len(topics) == len(self.topics)
        if read:
            self.work.recorder.complete(invoke, "ok", {"topics": topics})
        else:
            self.work.recorder.complete(invoke, "fail", {}, "destinations_unread")
        return {"destinations_read": read, "messages": sum(len(e) for e in topics.values())}
