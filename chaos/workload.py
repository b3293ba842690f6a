"""The produce/consume and topic-metadata workloads, recorded op by op over the HTTP API (v1).

Owns how HTTP outcomes map to ok/fail/info, the producers, the following consumers, the metadata
client and the final reads from the earliest offset.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from raftline.chaos.history import Op, OpType, Recorder

# Codes that say the request certainly had no effect (API.md); everything else after the request
# left us (503 leader_unavailable, 504 timeout, a dropped connection) may or may not have applied.
DEFINITE_FAILURES = frozenset(
    {"invalid_request", "unknown_topic", "unknown_partition", "topic_exists", "message_too_large"}
)
REQUEST_TIMEOUT_S = 5.0
LEADER_REFRESH_S = 1.0


@dataclass(frozen=True)
class Outcome:
    type: OpType
    status: int | None
    body: Any
    error: str | None


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    expect: tuple[str, ...] = (),
    given_up: asyncio.Event | None = None,
) -> Outcome:
    """One HTTP request, classified as Jepsen would: ok, fail (no effect) or info (unknown).

    A success whose body lacks a field in `expect` is `info`: the node answered, but not per API.md.
    When `given_up` is set before the answer comes (its node stopped answering health checks),
    the request is abandoned: `info`, since it may still take effect.
    """
    request = _request(session, method, url, body, expect)
    if given_up is None:
        return await request
    answer = asyncio.ensure_future(request)
    watch = asyncio.ensure_future(given_up.wait())
    try:
        await asyncio.wait((answer, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if answer.done():
        return answer.result()
    answer.cancel()
    return Outcome("info", None, None, "node_down")


async def _request(
    session: aiohttp.ClientSession, method: str, url: str, body: Any, expect: tuple[str, ...]
) -> Outcome:
    try:
        async with session.request(method, url, json=body) as reply:
            payload: Any = await reply.json(content_type=None) if reply.status != 204 else {}
            if reply.status < 300:
                if expect and not (isinstance(payload, dict) and all(k in payload for k in expect)):
                    return Outcome("info", reply.status, payload, "malformed_response")
                return Outcome("ok", reply.status, payload, None)
            error = payload.get("error") if isinstance(payload, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            code = code or f"http_{reply.status}"
            kind: OpType = "fail" if code in DEFINITE_FAILURES else "info"
            return Outcome(kind, reply.status, payload, code)
    except aiohttp.ClientConnectorError:
        return Outcome("fail", None, None, "connection_refused")  # never reached the node
    except (TimeoutError, aiohttp.ClientError, ValueError) as failure:
        return Outcome("info", None, None, type(failure).__name__)


@dataclass
class Endpoint:
    name: str
    url: str
    down: asyncio.Event = field(default_factory=asyncio.Event)  # set while health checks fail


class Nodes:
    """The cluster's nodes as a well-behaved client sees them (`urls` in node id order).

    - A health check every PROBE_S marks a node down when it goes unanswered (a paused or
      cut-off node); requests in flight to it are given up, as NATS clients do on missed PONGs.
    - A request for a partition goes to its leader where the client knows it (from topic
      descriptions, as Kafka clients do), else to a random node, which forwards it.
    - A node whose request for a partition failed (a 503 from a node that cannot reach that
      partition's leader, a timeout) is avoided for that partition for AVOID_S.
    """

    PROBE_S = 0.25
    PROBE_TIMEOUT_S = 1.0
    AVOID_S = 1.0

    def __init__(self, urls: Sequence[str], rng: random.Random) -> None:
        self.endpoints = [Endpoint(f"n{i + 1}", url) for i, url in enumerate(urls)]
        self.rng = rng
        self.leaders: dict[Hashable, int] = {}  # scope (a partition) -> leader's node id
        self._avoid: dict[tuple[str, Hashable], float] = {}

    def usable(self, scope: Hashable = None) -> list[Endpoint]:
        now = time.monotonic()
        return [
            e
            for e in self.endpoints
            if not e.down.is_set() and self._avoid.get((e.name, scope), 0.0) <= now
        ]

    def pick(self, scope: Hashable = None) -> Endpoint:
        good = self.usable(scope)
        leader = self.leaders.get(scope)
        if leader is not None and 0 < leader <= len(self.endpoints):
            endpoint = self.endpoints[leader - 1]
            if endpoint in good:
                return endpoint
        return self.rng.choice(good or self.endpoints)

    def observe(self, endpoint: Endpoint, outcome: Outcome, scope: Hashable = None) -> None:
        if outcome.status is None or outcome.status >= 500:
            self._avoid[(endpoint.name, scope)] = time.monotonic() + self.AVOID_S

    async def probe(self, session: aiohttp.ClientSession, until: float) -> None:
        timeout = aiohttp.ClientTimeout(total=self.PROBE_TIMEOUT_S)

        async def check(endpoint: Endpoint) -> None:
            try:
                async with session.get(f"{endpoint.url}/healthz", timeout=timeout) as reply:
                    await reply.read()  # any answer shows the node is serving
                alive = True
            except (TimeoutError, aiohttp.ClientError):
                alive = False
            if not alive:
                endpoint.down.set()
            elif endpoint.down.is_set():
                endpoint.down = asyncio.Event()

        while time.monotonic() < until:
            await asyncio.gather(*(check(e) for e in self.endpoints))
            await asyncio.sleep(self.PROBE_S)


@dataclass
class Workload:
    """Shared state of one run: the cluster's HTTP endpoints, the topic and the recorder."""

    recorder: Recorder
    urls: Sequence[str]  # in node id order: urls[i] serves node i + 1
    topic: str
    partitions: int
    rng: random.Random
    replication_factor: int = 3
    topic_config: dict[str, str] = field(default_factory=dict)  # the workload topic's settings
    max_acked: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes = Nodes(self.urls, self.rng)

    def key(self, partition: int) -> str:
        return f"{self.topic}/{partition}"

    async def request(
        self,
        session: aiohttp.ClientSession,
        endpoint: Endpoint,
        method: str,
        path: str,
        body: Any = None,
        expect: tuple[str, ...] = (),
        scope: Hashable = None,
    ) -> Outcome:
        """`call` on `endpoint` (picked by `self.nodes` for `scope`), telling it how it went."""
        outcome = await call(session, method, endpoint.url + path, body, expect, endpoint.down)
        self.nodes.observe(endpoint, outcome, scope)
        return outcome

    async def request_picked(
        self,
        session: aiohttp.ClientSession,
        scope: Hashable,
        method: str,
        path: str,
        body: Any = None,
        expect: tuple[str, ...] = (),
    ) -> tuple[str, Outcome]:
        """`request` on the node `self.nodes` picks for `scope`: its name and the outcome."""
        endpoint = self.nodes.pick(scope)
        outcome = await self.request(session, endpoint, method, path, body, expect, scope=scope)
        return endpoint.name, outcome

    def pick_partition(self, among: Sequence[int] | None = None) -> int:
        """A random partition (of `among`, else of all), one that some node can serve where there
        is one: a partition without a reachable leader is skipped for a while, as Kafka's
        producers do (KIP-794)."""
        candidates = range(self.partitions) if among is None else among
        servable = [p for p in candidates if self.nodes.usable(p)]
        return self.rng.choice(servable or candidates)

    def owned_partitions(self, producer: int, producers: int) -> list[int]:
        """The partitions producer `producer` (of `producers`, numbered from 0) sends to."""
        owned = [p for p in range(self.partitions) if p % producers == producer]
        return owned or [producer % self.partitions]

    def producers(
        self, session: aiohttp.ClientSession, count: int, until: float
    ) -> list[Coroutine[Any, Any, None]]:
        """`count` producers (processes 0..count-1), each sending to partitions of its own:
        one slow partition holds up only its own sends, as with a Kafka producer's batches per
        partition. A closed loop over random partitions made every producer, and so every
        partition, wait on the slowest one: one slow leader set the whole cluster's rate."""
        return [
            self.produce(session, p, until, self.owned_partitions(p, count)) for p in range(count)
        ]

    async def watch_leaders(self, session: aiohttp.ClientSession, until: float) -> None:
        """Learns each partition's leader from topic descriptions, as clients refresh metadata."""
        while time.monotonic() < until:
            outcome = await self.request(
                session,
                self.nodes.pick(),
                "GET",
                f"/v1/topics/{self.topic}",
                expect=("partitions",),
            )
            if outcome.type == "ok":
                for part in outcome.body["partitions"]:
                    leader = part.get("leader")
                    if isinstance(leader, int):
                        self.nodes.leaders[int(part["partition"])] = leader
                    else:
                        self.nodes.leaders.pop(int(part["partition"]), None)
            await asyncio.sleep(LEADER_REFRESH_S)

    async def create_topic(self, session: aiohttp.ClientSession, deadline: float) -> bool:
        """Creates the workload topic, retrying until it exists or the deadline passes."""
        body: dict[str, Any] = {
            "name": self.topic,
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
        }
        if self.topic_config:
            body["config"] = self.topic_config
        while time.monotonic() < deadline:
            outcome = await self.request(session, self.nodes.pick(), "POST", "/v1/topics", body)
            if outcome.type == "ok" or outcome.error == "topic_exists":
                return True
            await asyncio.sleep(1.0)
        return False

    async def produce(
        self,
        session: aiohttp.ClientSession,
        process: int,
        until: float,
        partitions: Sequence[int] | None = None,
    ) -> None:
        """Sends unique values one at a time (closed loop) to random partitions of
        `partitions` (else of all), each through the node `self.nodes` picks for it."""
        seq = 0
        while time.monotonic() < until:
            partition = self.pick_partition(partitions)
            value = f"{process}-{seq}"
            seq += 1
            request = {"key": self.key(partition), "value": value}
            endpoint = self.nodes.pick(partition)
            invoke = self.recorder.invoke(process, "send", request, endpoint.name)
            message = {"partition": partition, "value": value}
            outcome = await self.request(
                session,
                endpoint,
                "POST",
                f"/v1/topics/{self.topic}/messages",
                {"acks": "all", "messages": [message]},
                expect=("offsets",),
                scope=partition,
            )
            if outcome.type == "ok":
                offset = outcome.body["offsets"][0]["offset"]
                self.max_acked[partition] = max(self.max_acked.get(partition, -1), offset)
                self.recorder.complete(invoke, "ok", {**request, "offset": offset})
            else:
                self.recorder.complete(invoke, outcome.type, request, outcome.error)
                await asyncio.sleep(0.1)  # back off a little while the cluster is unavailable

    async def poll(
        self,
        session: aiohttp.ClientSession,
        process: int,
        partition: int,
        offset: int,
        final: bool = False,
        wait_ms: int = 500,
        max_messages: int = 200,
    ) -> Op:
        endpoint = self.nodes.pick(partition)
        request = {"key": self.key(partition), "offset": offset, "final": final}
        invoke = self.recorder.invoke(process, "poll", request, endpoint.name)
        outcome = await self.request(
            session,
            endpoint,
            "GET",
            f"/v1/topics/{self.topic}/partitions/{partition}/messages"
            f"?offset={offset}&max_messages={max_messages}&wait_ms={wait_ms}",
            expect=("messages", "next_offset"),
            scope=partition,
        )
        if outcome.type != "ok":
            # A read changes nothing, so a failed or unanswered poll is simply a failure.
            return self.recorder.complete(invoke, "fail", request, outcome.error)
        messages = [
            [m["offset"], m.get("value", m.get("value_b64"))] for m in outcome.body["messages"]
        ]
        result = {
            **request,
            "messages": messages,
            "next_offset": outcome.body["next_offset"],
            "high_watermark": outcome.body.get("high_watermark"),
        }
        return self.recorder.complete(invoke, "ok", result)

    async def consume(
        self, session: aiohttp.ClientSession, process: int, partition: int, until: float
    ) -> None:
        """Follows one partition from offset 0, continuing from each poll's next_offset."""
        offset = 0
        while time.monotonic() < until:
            done = await self.poll(session, process, partition, offset)
            if done.type == "ok":
                offset = done.value["next_offset"]
            else:
                await asyncio.sleep(0.2)

    async def reread(
        self, session: aiohttp.ClientSession, process: int, partition: int, until: float
    ) -> None:
        """Reads one partition from offset 0 to its end, again and again: on a topic whose old
        segments left local disk these reads come from object storage."""
        offset = 0
        while time.monotonic() < until:
            done = await self.poll(session, process, partition, offset, wait_ms=0, max_messages=500)
            if done.type != "ok":
                await asyncio.sleep(0.2)
                continue
            offset = done.value["next_offset"]
            if not done.value["messages"] and offset >= (done.value.get("high_watermark") or 0):
                offset = 0  # at the end: start over from the beginning (a seek, not a skip)
                await asyncio.sleep(1.0)

    async def final_reads(
        self, session: aiohttp.ClientSession, process: int, deadline: float
    ) -> dict[int, bool]:
        """Reads every partition from offset 0 up to the highest acknowledged offset (or beyond)."""
        complete: dict[int, bool] = {}
        for partition in range(self.partitions):
            offset, target = 0, self.max_acked.get(partition, -1) + 1
            complete[partition] = False
            while time.monotonic() < deadline:
                done = await self.poll(
                    session, process, partition, offset, final=True, wait_ms=0, max_messages=1000
                )
                if done.type != "ok":
                    await asyncio.sleep(0.5)
                    continue
                offset = done.value["next_offset"]
                hw = done.value.get("high_watermark") or 0
                if not done.value["messages"] and offset >= max(target, hw):
                    complete[partition] = True
                    break
        return complete

    async def metadata(self, session: aiohttp.ClientSession, process: int, until: float) -> None:
        """Creates, describes and deletes small topics: the linearizability check's input."""
        while time.monotonic() < until:
            topic = f"{self.topic}-meta-{self.rng.randrange(3)}"
            f = self.rng.choice(("create", "describe", "describe", "delete"))
            endpoint = self.nodes.pick()
            request: dict[str, Any] = {"topic": topic}
            if f == "create":
                request["partitions"] = 1
            invoke = self.recorder.invoke(process, f, request, endpoint.name)
            if f == "create":
                body = {
                    "name": topic,
                    "partitions": 1,
                    "replication_factor": self.replication_factor,
                }
                outcome = await self.request(session, endpoint, "POST", "/v1/topics", body)
                result: Any = "created"
            elif f == "delete":
                outcome = await self.request(session, endpoint, "DELETE", f"/v1/topics/{topic}")
                result = "deleted"
            else:
                outcome = await self.request(
                    session, endpoint, "GET", f"/v1/topics/{topic}", expect=("partitions",)
                )
                result = len(outcome.body["partitions"]) if outcome.type == "ok" else None
            if outcome.type == "ok":
                self.recorder.complete(invoke, "ok", {**request, "result": result})
            else:
                self.recorder.complete(invoke, outcome.type, request, outcome.error)
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))


def session(max_connections: int = 64) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    return aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=max_connections)
    )
