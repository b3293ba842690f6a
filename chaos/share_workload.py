"""The queue (share group) workload: receivers that lock, acknowledge, release, reject and forget
records of the workload topic through one queue, recorded op by op over the HTTP API (v1,
API.md "Queues") for chaos/share_checker.py.

Owns the queue's setup (a dead-letter topic, a queue with a short lock and few deliveries), the
receivers, the history shape of receive / settle / final (see share_checker.py) and the final
drain (accept everything until every acknowledged send is accounted for, then read the whole
dead-letter topic).

Rules that keep the history honest (a correct broker must never look wrong):
- A receiver settles only receipts from receive answers it got; a settle whose answer was lost
  is `info` (it may have applied), one refused by a definite 4xx is `fail`.
- A receive whose answer was lost is `info`: its records stay locked until their lock expires
  and then come again with a higher delivery count, which the checker allows.
- "forget" is a receiver that crashed while holding locks: it never settles those receipts and
  sleeps past the lock; now and then a receiver settles late, after its lock expired, and the
  broker must answer `ok: false` for those receipts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from raftline.chaos.history import Op
from raftline.chaos.workload import Workload

ACTIONS = ("accept", "release", "reject", "forget")
SHARE_FS = ("receive", "settle", "final", "queue-create")
SOURCE_HEADERS = {
    "partition": "x-raftline-source-partition",
    "offset": "x-raftline-source-offset",
    "delivery_count": "x-raftline-delivery-count",
    "reason": "x-raftline-death-reason",
}


def _key(partition: Any, offset: Any) -> str:
    return f"{int(partition)}/{int(offset)}"


@dataclass
class ShareWorkload:
    """Receivers of `queue` over `work.topic`; `work` also runs the producers."""

    work: Workload
    queue: str = "chaos-queue"
    lock_ms: int = 1_000
    max_deliveries: int = 3
    receive_max: int = 8
    receive_wait_ms: int = 300
    drain_max: int = 500  # messages per receive in the final drain (a backlog may be there)
    # How a receiver treats each received message (weights of ACTIONS).
    weights: tuple[int, ...] = (60, 17, 5, 18)
    crash_share: float = 0.03  # of receives after which the receiver crashes holding them all
    late_share: float = 0.03  # of settles sent after the lock expired
    accepted: set[str] = field(default_factory=set)  # ok accepts that held their lock
    maybe_accepted: set[str] = field(default_factory=set)  # accepts with an unknown outcome

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.work.topic}.dlq"

    @property
    def rng(self) -> Any:
        return self.work.rng

    @property
    def scope(self) -> tuple[str, str]:
        return ("queue", self.queue)

    # Setup ------------------------------------------------------------------------------

    async def setup(self, http: aiohttp.ClientSession, process: int, deadline: float) -> bool:
        """Creates the dead-letter topic and the queue, retrying until both exist."""
        topic = {
            "name": self.dead_letter_topic,
            "partitions": 1,
            "replication_factor": self.work.replication_factor,
        }
        config = {
            "name": self.queue,
            "topic": self.work.topic,
            "lock_ms": self.lock_ms,
            "max_deliveries": self.max_deliveries,
            "dead_letter_topic": self.dead_letter_topic,
        }
        made = False
        while time.monotonic() < deadline:
            _, outcome = await self.work.request_picked(
                http, self.scope, "POST", "/v1/topics", topic
            )
            if outcome.type == "ok" or outcome.error == "topic_exists":
                made = True
                break
            await asyncio.sleep(1.0)
        while made and time.monotonic() < deadline:
            invoke = self.work.recorder.invoke(process, "queue-create", config)
            _, outcome = await self.work.request_picked(
                http, self.scope, "POST", "/v1/queues", config
            )
            self.work.recorder.complete(invoke, outcome.type, config, outcome.error)
            if outcome.type == "ok":
                return True
            await asyncio.sleep(1.0)
        return False

    # One op each ------------------------------------------------------------------------

    async def receive(
        self, http: aiohttp.ClientSession, process: int, wait_ms: int, most: int = 0
    ) -> list[dict[str, Any]]:
        endpoint = self.work.nodes.pick(self.scope)
        invoke = self.work.recorder.invoke(process, "receive", {}, endpoint.name)
        outcome = await self.work.request(
            http,
            endpoint,
            "POST",
            f"/v1/queues/{self.queue}/receive",
            {"max_messages": most or self.receive_max, "wait_ms": wait_ms},
            expect=("messages",),
            scope=self.scope,
        )
        if outcome.type != "ok":
            self.work.recorder.complete(invoke, outcome.type, {}, outcome.error)
            return []
        messages = list(outcome.body["messages"])
        seen = [
            {
                "partition": m["partition"],
                "offset": m["offset"],
                "value": m.get("value", m.get("value_b64")),
                "delivery_count": m["delivery_count"],
            }
            for m in messages
        ]
        self.work.recorder.complete(invoke, "ok", {"messages": seen})
        return messages

    async def settle(
        self,
        http: aiohttp.ClientSession,
        process: int,
        outcome_name: str,
        messages: list[dict[str, Any]],
    ) -> Op:
        records = [[m["partition"], m["offset"], m["delivery_count"]] for m in messages]
        request = {"outcome": outcome_name, "records": records}
        endpoint = self.work.nodes.pick(self.scope)
        invoke = self.work.recorder.invoke(process, "settle", request, endpoint.name)
        body = {"receipts": [m["receipt"] for m in messages], "outcome": outcome_name}
        outcome = await self.work.request(
            http,
            endpoint,
            "POST",
            f"/v1/queues/{self.queue}/ack",
            body,
            expect=("results",),
            scope=self.scope,
        )
        if outcome.type != "ok":
            if outcome_name == "accept" and outcome.type == "info":
                self.maybe_accepted.update(_key(r[0], r[1]) for r in records)
            return self.work.recorder.complete(invoke, outcome.type, request, outcome.error)
        results = [bool(r.get("ok")) for r in outcome.body["results"]]
        errors = [r.get("error") for r in outcome.body["results"]]
        if outcome_name == "accept":
            for record, held in zip(records, results, strict=True):
                if held:
                    self.accepted.add(_key(record[0], record[1]))
        done = {**request, "results": results, "errors": errors}
        return self.work.recorder.complete(invoke, "ok", done)

    # A receiver's life ------------------------------------------------------------------

    async def receiver(self, http: aiohttp.ClientSession, process: int, until: float) -> None:
        while time.monotonic() < until:
            messages = await self.receive(http, process, self.receive_wait_ms)
            if not messages:
                await asyncio.sleep(0.05)
                continue
            if self.rng.random() < self.crash_share:
                # A crash holding every lock of this receive: nothing settled, back after them.
                await asyncio.sleep(self.lock_ms / 1000 * self.rng.uniform(1.0, 2.0))
                continue
            chosen: dict[str, list[dict[str, Any]]] = {}
            for m in messages:
                action = self.rng.choices(ACTIONS, self.weights)[0]
                if action != "forget":
                    chosen.setdefault(action, []).append(m)
            if self.rng.random() < self.late_share:
                await asyncio.sleep(self.lock_ms / 1000 * 1.5)  # a slow worker: locks expired
            for action, batch in chosen.items():
                await self.settle(http, process, action, batch)

    # The final phase --------------------------------------------------------------------

    async def read_dead_letters(
        self, http: aiohttp.ClientSession, deadline: float
    ) -> list[dict[str, Any]] | None:
        """The whole dead-letter topic as the checker's "dead" entries; None if not read."""
        dead: list[dict[str, Any]] = []
        offset = 0
        topic = self.dead_letter_topic
        while time.monotonic() < deadline:
            _, outcome = await self.work.request_picked(
                http,
                self.scope,
                "GET",
                f"/v1/topics/{topic}/partitions/0/messages"
                f"?offset={offset}&max_messages=1000&wait_ms=0",
                expect=("messages", "next_offset"),
            )
            if outcome.type != "ok":
                await asyncio.sleep(0.3)
                continue
            for m in outcome.body["messages"]:
                headers = m.get("headers") or {}
                entry = {k: headers.get(h) for k, h in SOURCE_HEADERS.items()}
                entry["value"] = m.get("value", m.get("value_b64"))
                for name in ("partition", "offset", "delivery_count"):
                    entry[name] = int(entry[name] or -1)
                dead.append(entry)
            offset = int(outcome.body["next_offset"])
            high = int(outcome.body.get("high_watermark") or 0)
            if not outcome.body["messages"] and offset >= high:
                return dead
        return None

    def sent_keys(self) -> set[str]:
        keys = set()
        for op in self.work.recorder.ops:
            if op.f == "send" and op.type == "ok":
                partition = int(str(op.value["key"]).rsplit("/", 1)[1])
                keys.add(_key(partition, op.value["offset"]))
        return keys

    async def final_phase(
        self, http: aiohttp.ClientSession, process: int, deadline: float
    ) -> dict[str, Any]:
        """Accepts everything it receives until every acknowledged send is acknowledged (or maybe
        so) or dead-lettered, then records the whole dead-letter topic as `final`."""
        sent = self.sent_keys()
        drained = False
        dead: list[dict[str, Any]] | None = []
        empty = 0
        while time.monotonic() < deadline:
            messages = await self.receive(http, process, 500, self.drain_max)
            if messages:
                empty = 0
                await self.settle(http, process, "accept", messages)
                continue
            empty += 1
            if empty % 3 == 0:
                dead = await self.read_dead_letters(http, deadline)
                if dead is not None:
                    settled = self.accepted | self.maybe_accepted
                    settled |= {_key(d["partition"], d["offset"]) for d in dead}
                    if sent <= settled:
                        drained = True
                        break
            await asyncio.sleep(0.2)
        dead = await self.read_dead_letters(http, deadline + 30)
        invoke = self.work.recorder.invoke(process + 1, "final", {})
        if dead is None:
            self.work.recorder.complete(invoke, "fail", {}, "dead_letters_unread")
        else:
            self.work.recorder.complete(invoke, "ok", {"dead": dead})
        gone = {_key(d["partition"], d["offset"]) for d in dead or []}
        return {
            "drained": drained,
            "dead_letters_read": dead is not None,
            "sent": len(sent),
            "unsettled": len(sent - self.accepted - self.maybe_accepted - gone),
        }
