"""The consumer-group workload: members of one group fetch, commit, heartbeat, leave and crash,
recorded op by op over the HTTP API (v1, API.md "Consumer groups") for chaos/group_checker.py.

Owns the members' life cycle, the group ops' history shape (see group_checker.py) and the final
phase (every old member leaves; one fresh member reads from the committed offsets to the end).

Rules that keep the history honest (a correct broker must never look wrong):
- A member commits only positions from fetch answers it received, with that answer's generation.
- A fetch whose answer was lost (`info`) may have moved the member's server-side position past
  messages nobody saw, so the member never commits again under that id: it leaves as best it can
  and joins with a new id, whose partitions start from the committed offsets.
- A crash is a member that stops calling (recorded as `group-crash`), wakes up and commits the
  positions it had, then joins again with the same id or a new one; an abandoned id expires
  after the session timeout.
- Zombie commits are sent on purpose now and then: an old generation's positions with that
  generation, or a partition outside the member's assignment with the current generation. The
  broker must refuse the second kind; commit-by-non-owner in the checker says if it did not.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from raftline.chaos.history import Op
from raftline.chaos.workload import Endpoint, Outcome, Workload, call

# Group codes that say a request certainly had no effect (API.md "Consumer groups").
GROUP_DEFINITE_FAILURES = frozenset(
    {"stale_generation", "unknown_member", "group_not_empty", "unknown_group"}
)


def definite(outcome: Outcome) -> Outcome:
    """The group's definite 4xx failures as `fail` (`workload.call` knows only the topic ones)."""
    if (
        outcome.type == "info"
        and outcome.error in GROUP_DEFINITE_FAILURES
        and outcome.status is not None
        and 400 <= outcome.status < 500
    ):
        return Outcome("fail", outcome.status, outcome.body, outcome.error)
    return outcome


async def group_call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    expect: tuple[str, ...] = (),
) -> Outcome:
    """`workload.call`, with the group's definite 4xx failures classified as `fail`."""
    return definite(await call(session, method, url, body, expect))


def _keys(entries: Any, topic_field: str = "topic") -> list[str]:
    return sorted(f"{e[topic_field]}/{e['partition']}" for e in entries)


@dataclass
class Member:
    """One membership as the client sees it: its id, generation, assignment and positions."""

    process: int
    member_id: str
    generation: int
    assignment: set[str] = field(default_factory=set)
    positions: dict[str, int] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)
    # The previous generation and its positions, and the last position seen per partition in
    # any generation: material for zombie commits.
    previous: tuple[int, dict[str, int]] | None = None
    ever: dict[str, int] = field(default_factory=dict)

    def see(
        self, generation: int, assignment: list[str], positions: dict[str, int] | None = None
    ) -> None:
        """An answer of `generation` holding `assignment` (a fetch's also has positions)."""
        if generation != self.generation:
            if self.positions:
                self.previous = (self.generation, dict(self.positions))
            self.generation, self.committed = generation, {}
            self.positions = {}
        self.assignment = set(assignment)
        if positions is not None:
            self.positions = positions
            self.ever.update(positions)


@dataclass
class GroupWorkload:
    """Members of `group` consuming `work.topic`; `work` also runs the producers."""

    work: Workload
    group: str
    session_timeout_ms: int = 6000
    heartbeat_share: float = 0.15  # of a member's steps; the others fetch
    commit_share: float = 0.7  # of the fetches that are followed by a commit
    # Mean seconds between a member's crashes, leaves and zombie commits (exponential).
    crash_every_s: float = 20.0
    leave_every_s: float = 20.0
    zombie_every_s: float = 5.0
    fetch_wait_ms: int = 300
    member_ids: set[str] = field(default_factory=set)
    _ids: int = 0

    @property
    def rng(self) -> Any:
        return self.work.rng

    def new_id(self, slot: int | str) -> str:
        self._ids += 1
        return f"{self.group}-{slot}-{self._ids}"

    def _node(self) -> Endpoint:
        """A random node that answers health checks and has not just failed a group call."""
        return self.work.nodes.pick(("group", self.group))

    async def _call(
        self,
        http: aiohttp.ClientSession,
        endpoint: Endpoint,
        method: str,
        path: str,
        body: Any = None,
        expect: tuple[str, ...] = (),
    ) -> Outcome:
        path = f"/v1/groups/{self.group}{path}"
        scope = ("group", self.group)
        return definite(
            await self.work.request(http, endpoint, method, path, body, expect, scope=scope)
        )

    def _record(
        self, process: int, f: str, request: dict[str, Any], node: str | None = None
    ) -> tuple[Op, dict[str, Any]]:
        request = {"group": self.group, **request}
        return self.work.recorder.invoke(process, f, request, node), request

    def _done(self, invoke: Op, request: dict[str, Any], outcome: Outcome, result: Any) -> None:
        if outcome.type == "ok":
            self.work.recorder.complete(invoke, "ok", {**request, **result})
        else:
            self.work.recorder.complete(invoke, outcome.type, request, outcome.error)

    # One op each -------------------------------------------------------------------------

    async def join(
        self, http: aiohttp.ClientSession, process: int, member_id: str
    ) -> tuple[Outcome, Member | None]:
        endpoint = self._node()
        self.member_ids.add(member_id)
        invoke, request = self._record(
            process, "group-join", {"member": member_id, "topics": [self.work.topic]}, endpoint.name
        )
        body = {
            "topics": [self.work.topic],
            "member_id": member_id,
            "session_timeout_ms": self.session_timeout_ms,
            "auto_offset_reset": "earliest",
        }
        outcome = await self._call(
            http,
            endpoint,
            "POST",
            "/members",
            body,
            expect=("member_id", "generation", "assignment"),
        )
        if outcome.type != "ok":
            self._done(invoke, request, outcome, None)
            return outcome, None
        given = str(outcome.body["member_id"])
        self.member_ids.add(given)
        result = {
            "member": given,
            "generation": outcome.body["generation"],
            "assignment": _keys(outcome.body["assignment"]),
        }
        self._done(invoke, request, outcome, result)
        member = Member(process, given, int(outcome.body["generation"]))
        member.assignment = set(result["assignment"])
        return outcome, member

    async def heartbeat(self, http: aiohttp.ClientSession, member: Member) -> Outcome:
        endpoint = self._node()
        invoke, request = self._record(
            member.process, "group-heartbeat", {"member": member.member_id}, endpoint.name
        )
        outcome = await self._call(
            http,
            endpoint,
            "POST",
            f"/members/{member.member_id}/heartbeat",
            {},
            expect=("generation", "assignment"),
        )
        result = None
        if outcome.type == "ok":
            result = {
                "generation": outcome.body["generation"],
                "assignment": _keys(outcome.body["assignment"]),
                "rebalancing": outcome.body.get("rebalancing"),
            }
            member.see(int(outcome.body["generation"]), result["assignment"])
        self._done(invoke, request, outcome, result)
        return outcome

    async def fetch(
        self, http: aiohttp.ClientSession, member: Member, final: bool = False
    ) -> tuple[Outcome, list[list[Any]]]:
        endpoint = self._node()
        invoke, request = self._record(
            member.process,
            "group-fetch",
            {"member": member.member_id, "final": final},
            endpoint.name,
        )
        outcome = await self._call(
            http,
            endpoint,
            "GET",
            f"/members/{member.member_id}/messages"
            f"?max_messages=200&wait_ms={0 if final else self.fetch_wait_ms}",
            expect=("generation", "messages", "positions"),
        )
        messages: list[list[Any]] = []
        result = None
        if outcome.type == "ok":
            messages = [
                [
                    f"{m.get('topic', self.work.topic)}/{m['partition']}",
                    m["offset"],
                    m.get("value", m.get("value_b64")),
                ]
                for m in outcome.body["messages"]
            ]
            # A position may be null where the start was symbolic and that partition's read did
            # not finish: the member then holds it without a position to commit.
            shown = {
                f"{p['topic']}/{p['partition']}": None if p["offset"] is None else int(p["offset"])
                for p in outcome.body["positions"]
            }
            generation = int(outcome.body["generation"])
            result = {"generation": generation, "messages": messages, "positions": shown}
            assignment = set(shown)
            if isinstance(outcome.body.get("assignment"), list):
                result["assignment"] = _keys(outcome.body["assignment"])
                assignment.update(result["assignment"])
            positions = {k: o for k, o in shown.items() if o is not None}
            member.see(generation, sorted(assignment), positions)
        self._done(invoke, request, outcome, result)
        return outcome, messages

    async def commit(
        self,
        http: aiohttp.ClientSession,
        member: Member,
        generation: int,
        offsets: dict[str, int],
        zombie: bool = False,
    ) -> Outcome:
        endpoint = self._node()
        fields: dict[str, Any] = {
            "member": member.member_id,
            "generation": generation,
            "offsets": offsets,
        }
        if zombie:
            fields["zombie"] = True
        invoke, request = self._record(member.process, "group-commit", fields, endpoint.name)
        body = {
            "member_id": member.member_id,
            "generation": generation,
            "offsets": [
                {"topic": k.rsplit("/", 1)[0], "partition": int(k.rsplit("/", 1)[1]), "offset": o}
                for k, o in sorted(offsets.items())
            ],
        }
        outcome = await self._call(http, endpoint, "POST", "/offsets", body)
        self._done(invoke, request, outcome, {})
        return outcome

    async def read_offsets(
        self, http: aiohttp.ClientSession, process: int, final: bool = False
    ) -> Outcome:
        endpoint = self._node()
        invoke, request = self._record(process, "group-offsets", {"final": final}, endpoint.name)
        outcome = await self._call(http, endpoint, "GET", "/offsets", expect=("offsets",))
        result = None
        if outcome.type == "ok":
            rows = outcome.body["offsets"]
            result = {
                "offsets": {f"{r['topic']}/{r['partition']}": r.get("offset") for r in rows},
                "high_watermarks": {
                    f"{r['topic']}/{r['partition']}": r.get("high_watermark") for r in rows
                },
            }
        self._done(invoke, request, outcome, result)
        return outcome

    async def leave(self, http: aiohttp.ClientSession, process: int, member_id: str) -> Outcome:
        endpoint = self._node()
        invoke, request = self._record(process, "group-leave", {"member": member_id}, endpoint.name)
        outcome = await self._call(http, endpoint, "DELETE", f"/members/{member_id}")
        self._done(invoke, request, outcome, {})
        return outcome

    async def observe(
        self, http: aiohttp.ClientSession, process: int, until: float, every_s: float = 0.5
    ) -> None:
        """Reads the group's committed offsets now and then, to catch one moving backwards."""
        while time.monotonic() < until:
            await self.read_offsets(http, process)
            await asyncio.sleep(every_s)

    def crash(self, member: Member) -> None:
        invoke, request = self._record(member.process, "group-crash", {"member": member.member_id})
        self.work.recorder.complete(invoke, "ok", request)

    # A member's life ---------------------------------------------------------------------

    async def _commit_positions(self, http: aiohttp.ClientSession, member: Member) -> str | None:
        """Commits what moved since the last commit; returns why the session ends, if it does."""
        moved = {k: o for k, o in member.positions.items() if o > member.committed.get(k, -1)}
        if not moved:
            return None
        outcome = await self.commit(http, member, member.generation, moved)
        if outcome.type == "ok":
            member.committed.update(moved)
        elif outcome.error == "unknown_member":
            return "unknown"
        elif outcome.error == "stale_generation":
            # A rebalance: learn the new generation (the next fetch would too).
            done = await self.heartbeat(http, member)
            if done.error == "unknown_member":
                return "unknown"
        return None

    async def _zombie(self, http: aiohttp.ClientSession, member: Member) -> None:
        """Either an old generation's positions with the old generation, or a partition outside
        the member's assignment (at the last position it saw there, else 0) with the current
        one. A correct broker refuses the second; the first only where the partition has moved
        on (a broker may let a member commit a generation it held the partition in)."""
        keys = [self.work.key(p) for p in range(self.work.partitions)]
        foreign = [k for k in keys if k not in member.assignment]
        old = member.previous
        if old is not None and (not foreign or self.rng.random() < 0.5):
            await self.commit(http, member, old[0], old[1], zombie=True)
        elif foreign:
            key = self.rng.choice(foreign)
            offsets = {key: member.ever.get(key, 0)}
            await self.commit(http, member, member.generation, offsets, zombie=True)

    def _after(self, mean_s: float) -> float:
        return time.monotonic() + self.rng.expovariate(1.0 / mean_s)

    async def session(self, http: aiohttp.ClientSession, member: Member, until: float) -> str:
        """Runs one membership until it ends: "end", "crash", "leave", "unknown" or "tainted"."""
        crash_at, leave_at = self._after(self.crash_every_s), self._after(self.leave_every_s)
        zombie_at = self._after(self.zombie_every_s)
        while time.monotonic() < until:
            now = time.monotonic()
            if now >= crash_at:
                return "crash"
            if now >= leave_at:
                return "leave"
            if now >= zombie_at:
                await self._zombie(http, member)
                zombie_at = self._after(self.zombie_every_s)
                continue
            if self.rng.random() < self.heartbeat_share:
                outcome = await self.heartbeat(http, member)
                if outcome.error == "unknown_member":
                    return "unknown"
                continue
            outcome, _ = await self.fetch(http, member)
            if outcome.type == "info":
                return "tainted"
            if outcome.error == "unknown_member":
                return "unknown"
            if outcome.type == "fail":
                await asyncio.sleep(0.2)
                continue
            if self.rng.random() < self.commit_share:
                ended = await self._commit_positions(http, member)
                if ended:
                    return ended
        return "end"

    async def member(
        self, http: aiohttp.ClientSession, process: int, slot: int, until: float
    ) -> None:
        """One member slot: joins, consumes, and leaves or crashes and comes back, until `until`."""
        member_id = self.new_id(f"m{slot}")
        while time.monotonic() < until:
            outcome, member = await self.join(http, process, member_id)
            if member is None:
                await asyncio.sleep(0.3 if outcome.type == "fail" else 0.1)
                continue
            member_id = member.member_id
            ended = await self.session(http, member, until)
            if ended == "end":
                await self.leave(http, process, member_id)
                return
            if ended == "crash":
                self.crash(member)
                pause = self.rng.uniform(0.2, 1.5) * self.session_timeout_ms / 1000
                await asyncio.sleep(max(0.0, min(pause, until - time.monotonic())))
                if member.positions:
                    # It wakes up and commits what it had, as a paused process would.
                    await self.commit(
                        http, member, member.generation, member.positions, zombie=True
                    )
                if self.rng.random() < 0.5:
                    member_id = self.new_id(f"m{slot}")
            elif ended == "leave":
                left = await self.leave(http, process, member_id)
                await asyncio.sleep(self.rng.uniform(0.0, 1.0))
                if left.type != "ok" or self.rng.random() < 0.5:
                    member_id = self.new_id(f"m{slot}")
            elif ended == "tainted":
                await self.leave(http, process, member_id)
                member_id = self.new_id(f"m{slot}")
            # "unknown": the id expired; joining with it again starts a new membership.

    # The final phase ---------------------------------------------------------------------

    async def _targets(self, http: aiohttp.ClientSession, deadline: float) -> dict[str, int]:
        """Per partition of the topic as described now, the offset the final member must reach:
        past every acknowledged send and up to the high watermark (producers have stopped)."""
        work = self.work
        acked = {work.key(p): o + 1 for p, o in work.max_acked.items()}
        while time.monotonic() < deadline:
            outcome = await work.request(
                http, work.nodes.pick(), "GET", f"/v1/topics/{work.topic}", expect=("partitions",)
            )
            if outcome.type == "ok":
                targets = {}
                for p in outcome.body["partitions"]:
                    key = work.key(int(p["partition"]))
                    targets[key] = max(acked.get(key, 0), int(p.get("high_watermark") or 0))
                return {**acked, **targets}
            await asyncio.sleep(0.5)
        return {work.key(p): acked.get(work.key(p), 0) for p in range(work.partitions)}

    async def final_phase(
        self, http: aiohttp.ClientSession, process: int, deadline: float
    ) -> dict[str, Any]:
        """Every id ever used leaves; one fresh member consumes from the committed offsets to the
        targets, committing as it goes; then the group's offsets are read."""
        for member_id in sorted(self.member_ids):
            await self.leave(http, process, member_id)
        targets = await self._targets(http, deadline)
        reached = False
        member: Member | None = None
        while time.monotonic() < deadline and not reached:
            if member is None:
                _, member = await self.join(http, process, self.new_id("final"))
                if member is None:
                    await asyncio.sleep(0.5)
                    continue
            outcome, messages = await self.fetch(http, member, final=True)
            if outcome.type == "info" or outcome.error == "unknown_member":
                if outcome.type == "info":
                    await self.leave(http, process, member.member_id)
                member = None
                continue
            if outcome.type != "ok":
                await asyncio.sleep(0.5)
                continue
            if await self._commit_positions(http, member) == "unknown":
                member = None
                continue
            held_all = member.assignment >= set(targets)
            at_end = all(member.positions.get(k, -1) >= t for k, t in targets.items())
            committed = all(member.committed.get(k, -1) >= t for k, t in targets.items())
            reached = held_all and at_end and committed and not messages
            if not messages:
                await asyncio.sleep(0.1)
        read = False
        while reached and time.monotonic() < deadline and not read:
            read = (await self.read_offsets(http, process, final=True)).type == "ok"
            if not read:
                await asyncio.sleep(0.5)
        if member is not None:
            await self.leave(http, process, member.member_id)
        return {"consumed_to_end": reached, "offsets_read": read, "targets": targets}
