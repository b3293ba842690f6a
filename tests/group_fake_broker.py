"""An in-memory stand-in for API.md's topics and consumer groups, with bugs that can be planted.

Just enough for the group workload: topics, acks=all produce, topic describe, and one broker's
worth of groups (join, heartbeat, fetch, commit, offsets, leave) with range assignment, session
expiry and generation fencing. Each flag plants one bug the group checker must catch.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def error(status: int, code: str) -> web.Response:
    body = {"error": {"code": code, "message": code, "retryable": False}}
    return web.json_response(body, status=status)


@dataclass
class FakeMember:
    topics: list[str]
    session_timeout_ms: int
    auto_offset_reset: str
    seen: float = field(default_factory=time.monotonic)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass
class FakeGroup:
    members: dict[str, FakeMember] = field(default_factory=dict)
    generation: int = 0
    assignment: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass
class FakeGroupBroker:
    """Flags plant bugs: `double_assignment` gives partition 0 to every member;
    `lose_every_commit` answers every n-th commit 204 without storing it; `no_fencing` accepts
    commits of any generation and partition; `new_owner_starts_at_end` starts a newly assigned
    partition at the high watermark instead of the committed offset; `generation_goes_back`
    answers every n-th heartbeat with the previous generation."""

    double_assignment: bool = False
    lose_every_commit: int = 0
    no_fencing: bool = False
    new_owner_starts_at_end: bool = False
    generation_goes_back: int = 0
    # Not a bug: every n-th fetch answer is lost (504) after the member's position moved.
    lose_fetch_answer_every: int = 0
    produce_delay_s: float = 0.005  # leaves the members room on a shared event loop
    topics: dict[str, list[list[dict[str, Any]]]] = field(default_factory=dict)
    groups: dict[str, FakeGroup] = field(default_factory=dict)
    commits: int = 0
    heartbeats: int = 0
    fetches: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self.ready)
        app.router.add_post("/v1/topics", self.create)
        app.router.add_get("/v1/topics/{topic}", self.describe)
        app.router.add_post("/v1/topics/{topic}/messages", self.produce)
        app.router.add_post("/v1/groups/{group}/members", self.join)
        app.router.add_post("/v1/groups/{group}/members/{member}/heartbeat", self.heartbeat)
        app.router.add_get("/v1/groups/{group}/members/{member}/messages", self.fetch)
        app.router.add_delete("/v1/groups/{group}/members/{member}", self.leave)
        app.router.add_post("/v1/groups/{group}/offsets", self.commit)
        app.router.add_get("/v1/groups/{group}/offsets", self.offsets)
        return app

    # Topics ---------------------------------------------------------------------------------

    async def ready(self, _: web.Request) -> web.Response:
        return web.json_response({})

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["name"] in self.topics:
            return error(409, "topic_exists")
        self.topics[body["name"]] = [[] for _ in range(body["partitions"])]
        return web.json_response({"name": body["name"]}, status=201)

    async def describe(self, request: web.Request) -> web.Response:
        logs = self.topics.get(request.match_info["topic"])
        if logs is None:
            return error(404, "unknown_topic")
        parts = [
            {"partition": p, "leader": 1, "log_start_offset": 0, "high_watermark": len(log)}
            for p, log in enumerate(logs)
        ]
        return web.json_response({"name": request.match_info["topic"], "partitions": parts})

    async def produce(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.produce_delay_s)
        logs = self.topics[request.match_info["topic"]]
        offsets = []
        for message in (await request.json())["messages"]:
            log = logs[message["partition"]]
            offsets.append({"partition": message["partition"], "offset": len(log)})
            log.append({"offset": len(log), "value": message["value"], "timestamp": 0})
        return web.json_response({"offsets": offsets})

    # Groups ---------------------------------------------------------------------------------

    def _group(self, request: web.Request) -> FakeGroup:
        group = self.groups.setdefault(request.match_info["group"], FakeGroup())
        now = time.monotonic()
        expired = [
            m
            for m, member in group.members.items()
            if now - member.seen > member.session_timeout_ms / 1000
        ]
        for m in expired:
            del group.members[m]
        if expired:
            self._rebalance(group)
        return group

    def _rebalance(self, group: FakeGroup) -> None:
        group.generation += 1
        keys = sorted(
            {
                (t, p)
                for m in group.members.values()
                for t in m.topics
                for p in range(len(self.topics.get(t, [])))
            }
        )
        names = sorted(group.members)
        before = group.assignment
        group.assignment = {m: [] for m in names}
        for i, key in enumerate(keys):
            if names:
                group.assignment[names[i % len(names)]].append(key)
        if self.double_assignment and keys:
            for m in names:
                if keys[0] not in group.assignment[m]:
                    group.assignment[m].append(keys[0])
        for m in names:
            kept = set(before.get(m, [])) & set(group.assignment[m])
            member = group.members[m]
            member.positions = {k: o for k, o in member.positions.items() if k in kept}

    def _answer_assignment(self, group: FakeGroup, member: str) -> list[dict[str, Any]]:
        return [{"topic": t, "partition": p} for t, p in group.assignment.get(member, [])]

    async def join(self, request: web.Request) -> web.Response:
        body = await request.json()
        group = self._group(request)
        member_id = body.get("member_id") or f"member-{len(group.members) + 1}"
        if member_id in group.members:
            group.members[member_id].seen = time.monotonic()
        else:
            group.members[member_id] = FakeMember(
                body["topics"],
                body.get("session_timeout_ms", 10000),
                body.get("auto_offset_reset", "latest"),
            )
            self._rebalance(group)
        return web.json_response(
            {
                "member_id": member_id,
                "generation": group.generation,
                "assignment": self._answer_assignment(group, member_id),
            }
        )

    async def heartbeat(self, request: web.Request) -> web.Response:
        group = self._group(request)
        member_id = request.match_info["member"]
        if member_id not in group.members:
            return error(404, "unknown_member")
        group.members[member_id].seen = time.monotonic()
        self.heartbeats += 1
        generation = group.generation
        if self.generation_goes_back and self.heartbeats % self.generation_goes_back == 0:
            generation -= 1
        return web.json_response(
            {
                "generation": generation,
                "assignment": self._answer_assignment(group, member_id),
                "rebalancing": False,
            }
        )

    async def fetch(self, request: web.Request) -> web.Response:
        group = self._group(request)
        member_id = request.match_info["member"]
        member = group.members.get(member_id)
        if member is None:
            return error(404, "unknown_member")
        member.seen = time.monotonic()
        generation = group.generation  # the answer's generation is the one it was computed in
        budget = int(request.query.get("max_messages", 500))
        messages, positions = [], []
        for topic, p in group.assignment.get(member_id, []):
            log = self.topics[topic][p]
            start = member.positions.get((topic, p))
            symbolic = start is None and group.committed.get((topic, p)) is None
            if start is None:
                committed = group.committed.get((topic, p))
                if committed is not None and not self.new_owner_starts_at_end:
                    start = committed
                elif self.new_owner_starts_at_end or member.auto_offset_reset == "latest":
                    start = len(log)
                else:
                    start = 0
            chunk = log[start : start + budget]
            budget -= len(chunk)
            messages += [{"topic": topic, "partition": p, **m} for m in chunk]
            if symbolic and not chunk and int(request.query.get("wait_ms", 0)):
                # As the real broker does when a long poll from "earliest" or "latest" was cut
                # short by data on another partition.
                positions.append({"topic": topic, "partition": p, "offset": None})
                continue
            member.positions[(topic, p)] = start + len(chunk)
            positions.append({"topic": topic, "partition": p, "offset": start + len(chunk)})
        if not messages and int(request.query.get("wait_ms", 0)):
            await asyncio.sleep(0.02)
        self.fetches += 1
        if self.lose_fetch_answer_every and self.fetches % self.lose_fetch_answer_every == 0:
            return error(504, "timeout")
        return web.json_response(
            {"generation": generation, "messages": messages, "positions": positions}
        )

    async def commit(self, request: web.Request) -> web.Response:
        body = await request.json()
        group = self._group(request)
        member_id = body["member_id"]
        if member_id not in group.members and not self.no_fencing:
            return error(404, "unknown_member")
        held = set(group.assignment.get(member_id, []))
        wanted = [((o["topic"], o["partition"]), o["offset"]) for o in body["offsets"]]
        fenced = body["generation"] != group.generation or any(k not in held for k, _ in wanted)
        if fenced and not self.no_fencing:
            return error(409, "stale_generation")
        self.commits += 1
        if not (self.lose_every_commit and self.commits % self.lose_every_commit == 0):
            group.committed.update(wanted)
        return web.Response(status=204)

    async def offsets(self, request: web.Request) -> web.Response:
        group = self._group(request)
        rows = []
        for (topic, p), offset in sorted(group.committed.items()):
            hw = len(self.topics[topic][p])
            rows.append(
                {
                    "topic": topic,
                    "partition": p,
                    "offset": offset,
                    "high_watermark": hw,
                    "lag": hw - offset,
                }
            )
        return web.json_response({"offsets": rows})

    async def leave(self, request: web.Request) -> web.Response:
        group = self._group(request)
        if group.members.pop(request.match_info["member"], None) is None:
            return error(404, "unknown_member")
        self._rebalance(group)
        return web.Response(status=204)
