"""The consumer-group endpoints of the v1 contract (API.md "Consumer groups").

Owns their request checks and answer shapes, and the group fetch: ask the group's coordinator
where the member reads (its positions, else committed offsets, else auto_offset_reset), read the
assigned partitions like partition fetches (local or forwarded to their leaders, long-polling
all at once and answering as soon as one has data), then tell the coordinator where the member
got to. Everything else is one call to the coordinator (Broker.group_call).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from raftline.api import validation
from raftline.api.app import ApiState, _fetch_local, _state, read_body, reply
from raftline.api.errors import ApiError, invalid
from raftline.api.filters import RecordFilter, from_query
from raftline.node.errors import BrokerError

log = logging.getLogger(__name__)

GROUP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MEMBER_ID = re.compile(r"^[A-Za-z0-9._~:@-]{1,249}$")
MAX_GROUP_WAIT_MS = 30_000  # below common load-balancer idle timeouts
NO_ASSIGNMENT_WAIT_MS = 1_000  # a member without partitions long-polls at most this long
WATCH_S = 1.0  # a long-polling group fetch heartbeats (and looks for a new generation) this often
JOIN_FIELDS = frozenset(
    {"topics", "member_id", "session_timeout_ms", "auto_offset_reset", "assignor", "client"}
)
COMMIT_FIELDS = frozenset({"member_id", "generation", "offsets"})
RESET_FIELDS = frozenset({"topic", "to"})


def _group(request: web.Request) -> str:
    name = request.match_info["group"]
    if not GROUP_NAME.match(name):
        raise invalid(f"invalid group name {name!r}: 1-249 characters of [A-Za-z0-9._-]")
    return name


def _member_id(value: Any) -> str:
    if not isinstance(value, str) or not MEMBER_ID.match(value):
        raise invalid(f"invalid member id {value!r}: 1-249 characters of [A-Za-z0-9._~:@-]")
    return value


def _int_field(body: dict[str, Any], name: str, low: int = 0) -> int:
    value = body.get(name)
    if not validation.is_int(value) or value < low:
        raise invalid(f"{name} must be an integer of at least {low}")
    return int(value)


def _assignment(items: list[Any]) -> list[dict[str, Any]]:
    return [
        item if isinstance(item, dict) else {"topic": item[0], "partition": item[1]}
        for item in items
    ]


# ---- membership ----------------------------------------------------------------------------


async def join(request: web.Request) -> web.Response:
    group = _group(request)
    body = validation.fields_of(await read_body(request), JOIN_FIELDS, "the join request")
    topics = body.get("topics")
    if not isinstance(topics, list) or not topics:
        raise invalid("topics must be a non-empty list of topic names")
    args: dict[str, Any] = {"topics": [validation.topic_name(t) for t in topics]}
    if body.get("member_id") is not None:
        args["member_id"] = _member_id(body["member_id"])
    if "session_timeout_ms" in body:
        args["session_timeout_ms"] = _int_field(body, "session_timeout_ms", 1)
    if "auto_offset_reset" in body:
        if body["auto_offset_reset"] not in ("earliest", "latest"):
            raise invalid('auto_offset_reset must be "earliest" or "latest"')
        args["auto_offset_reset"] = body["auto_offset_reset"]
    if body.get("assignor") is not None:
        if body["assignor"] not in ("sticky", "range"):
            raise invalid('assignor must be "sticky" or "range"')
        args["assignor"] = body["assignor"]
    if body.get("client") is not None:
        args["client"] = str(body["client"])[:256]
    elif request.remote:
        args["client"] = request.remote
    answer = await _state(request).broker.group_call(group, "group_join", args)
    return reply(
        request,
        {
            "member_id": answer["member_id"],
            "generation": answer["generation"],
            "assignment": _assignment(answer["assignment"]),
            "rebalancing": answer["rebalancing"],
        },
    )


async def heartbeat(request: web.Request) -> web.Response:
    group = _group(request)
    member = _member_id(request.match_info["member_id"])
    answer = await _state(request).broker.group_call(
        group, "group_heartbeat", {"member_id": member}
    )
    return reply(
        request,
        {
            "generation": answer["generation"],
            "assignment": _assignment(answer["assignment"]),
            "rebalancing": answer["rebalancing"],
        },
    )


async def leave(request: web.Request) -> web.Response:
    group = _group(request)
    member = _member_id(request.match_info["member_id"])
    await _state(request).broker.group_call(group, "group_leave", {"member_id": member})
    return web.Response(status=204)


# ---- the group fetch -----------------------------------------------------------------------


async def _fetch_partition(
    state: ApiState,
    topic: str,
    partition: int,
    offset: int | str,
    max_messages: int,
    max_bytes: int,
    wait_ms: int,
    isolation: str = "read_uncommitted",
    record_filter: RecordFilter | None = None,
    raw: bool = False,
) -> dict[str, Any]:
    """One partition fetch, here if this node leads the partition, else on its leader. With
    `raw`, stored batches ("batches") when read here; a leader elsewhere answers messages."""
    spec = validation.FetchRequest(offset, max_messages, max_bytes, wait_ms, isolation=isolation)

    async def local() -> dict[str, Any]:
        return await _fetch_local(state, topic, partition, spec, raw, record_filter)

    async def remote(leader: str) -> dict[str, Any]:
        params = {
            "offset": str(offset),
            "max_messages": str(max_messages),
            "max_bytes": str(max_bytes),
            "wait_ms": str(wait_ms),
            "isolation": isolation,
        }
        if record_filter is not None:
            params["filter"] = record_filter.source
        return await state.forwarder.fetch(leader, topic, partition, params)

    result: dict[str, Any] = await state.with_leader(
        local, remote, forwarded=False, repeatable=True
    )
    return result


async def _resolve_starts(state: ApiState, plan: list[list[Any]]) -> list[list[Any]]:
    """Turn "earliest"/"latest" starts into offsets before any long-poll, so that a partition
    whose fetch ends without data still gets a position (later messages are not skipped)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition, start in plan:
        if isinstance(start, str):
            by_topic.setdefault(topic, []).append(partition)
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    for topic, partitions in by_topic.items():
        try:
            found = await state.broker.partition_offsets(topic, partitions)
        except BrokerError as exc:
            log.debug("resolving starts of %s: %s", topic, exc)
            continue
        marks.update({(topic, p): v for p, v in found.items()})
    out = []
    for topic, partition, start in plan:
        if isinstance(start, str) and (topic, partition) in marks:
            start_offset, high = marks[(topic, partition)]
            start = start_offset if start == "earliest" else high
        out.append([topic, partition, start])
    return out


async def member_messages(request: web.Request) -> web.Response:
    state = _state(request)
    group = _group(request)
    member = _member_id(request.match_info["member_id"])
    spec = validation.fetch_request(dict(request.query))
    record_filter = from_query(request.query)
    return reply(request, await member_fetch(state, group, member, spec, record_filter))


async def member_fetch(
    state: ApiState,
    group: str,
    member: str,
    spec: validation.FetchRequest,
    record_filter: RecordFilter | None = None,
    urgent: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """One group fetch (API.md): the member's plan from the coordinator, its partitions read
    from there, the positions reached told to the coordinator; the answer's fields. A plan
    that `urgent` says the member must learn now is answered without waiting for data."""
    broker = state.broker
    plan = await broker.group_call(group, "group_poll", {"member_id": member})
    wait_ms = 0 if urgent is not None and urgent(plan) else min(spec.wait_ms, MAX_GROUP_WAIT_MS)
    starts = await _resolve_starts(state, plan["plan"])
    if not starts and wait_ms > 0:  # nothing assigned: come back a little later, not at once
        await asyncio.sleep(min(wait_ms, NO_ASSIGNMENT_WAIT_MS) / 1000)

    async def watch(answered: asyncio.Event) -> None:
        """While the long-poll waits: keep the member's session alive, and end the wait when
        a new generation starts (the member should learn its new assignment) or the member
        must give partitions up (it should commit first). `answered` stops it even where a
        cancellation got lost (3.11)."""
        every = min(WATCH_S, int(plan["session_timeout_ms"]) / 3000)
        while not answered.is_set():
            await asyncio.sleep(every)
            if answered.is_set():
                return
            view = await broker.group_call(
                group, "group_heartbeat", {"member_id": member, "watch": True}
            )
            if view["generation"] != plan["generation"] or view.get("revoke"):
                return

    bodies, rebalanced = await read_partitions(
        state, starts, spec, wait_ms, record_filter, plan["auto_offset_reset"], watch
    )
    messages: list[dict[str, Any]] = []
    positions = []
    budget = spec.max_messages
    for (topic, partition, start), body in zip(starts, bodies, strict=True):
        position = start if isinstance(start, int) else None
        if body is not None:
            taken, position = taken_from(topic, body, budget)
            budget -= len(taken)
            messages += taken
        positions.append({"topic": topic, "partition": partition, "offset": position})
    advance = [
        [p["topic"], p["partition"], p["offset"]] for p in positions if p["offset"] is not None
    ]
    try:
        await broker.group_call(
            group,
            "group_advance",
            {"member_id": member, "generation": plan["generation"], "positions": advance},
        )
    except BrokerError as exc:  # the messages still go out; the next fetch may repeat them
        log.debug("group %s: positions of %s not kept: %s", group, member, exc)
    return {
        "generation": plan["generation"],
        "assignment": _assignment(plan["assignment"]),
        "rebalancing": plan["rebalancing"] or rebalanced,
        "messages": messages,
        "positions": positions,
    }


def taken_from(topic: str, body: dict[str, Any], budget: int) -> tuple[list[dict[str, Any]], int]:
    """Up to `budget` messages of a fetch answer, with their topic, and where the partition's
    next read starts: at the first message left out, else the answer's next_offset."""
    taken = [{"topic": topic, **m} for m in body["messages"][:budget]]
    cut = len(taken) < len(body["messages"])
    return taken, body["messages"][len(taken)]["offset"] if cut else body["next_offset"]


async def read_partitions(
    state: ApiState,
    starts: list[list[Any]],
    spec: validation.FetchRequest,
    wait_ms: int,
    record_filter: RecordFilter | None,
    reset: str | None,
    watch: Callable[[asyncio.Event], Awaitable[None]] | None = None,
    raw: bool = False,
) -> tuple[list[dict[str, Any] | None], bool]:
    """Read the partitions of `starts` ([topic, partition, offset]) at once, long-polling all
    of them and answering as soon as one has data (or `watch` returns: then `rebalanced`).
    (each partition's fetch answer, None where it failed or was cut short; rebalanced). A
    partition whose offset left the log restarts at `reset`, or, without one, fails the call
    with offset_out_of_range. With `raw`, answers read here hold stored batches."""

    async def one(topic: str, partition: int, start: int | str) -> dict[str, Any] | None:
        def read(offset: int | str, wait: int) -> Awaitable[dict[str, Any]]:
            return _fetch_partition(
                state,
                topic,
                partition,
                offset,
                spec.max_messages,
                spec.max_bytes,
                wait,
                spec.isolation,
                record_filter,
                raw,
            )

        try:
            return await read(start, wait_ms)
        except (ApiError, BrokerError) as exc:
            if exc.code == "offset_out_of_range":  # e.g. retention passed a committed offset
                if reset is None:
                    raise
                try:
                    return await read(reset, 0)
                except (ApiError, BrokerError):
                    return None
            log.debug("fetch of %s/%d: %s", topic, partition, exc)
            return None
        except Exception as exc:  # one partition's failure must not fail the others' answer
            log.warning("fetch of %s/%d failed: %r", topic, partition, exc)
            return None

    tasks = [asyncio.ensure_future(one(t, p, s)) for t, p, s in starts]
    pending: set[asyncio.Future[Any]] = set(tasks)
    answered = asyncio.Event()
    watcher = None
    if watch is not None and wait_ms > 0 and tasks:
        watcher = asyncio.ensure_future(watch(answered))
    rebalanced = False
    try:
        while pending:
            waiting = pending | ({watcher} if watcher is not None else set())
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            pending -= done
            if watcher is not None and watcher in done:
                rebalanced = watcher.exception() is None  # an error just ends the watching
                watcher = None
                if rebalanced:
                    break
            if any(_has_data(t.result()) for t in done if t in tasks):
                break  # data is there: answer now, the others' long-polls end unread
    finally:
        answered.set()
        for task in [*pending, *([watcher] if watcher is not None else [])]:
            task.cancel()
        if watcher is not None:  # not awaited: a call of its in flight must not hold the answer
            watcher.add_done_callback(_consume_outcome)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return [None if task.cancelled() else task.result() for task in tasks], rebalanced


def _has_data(body: dict[str, Any] | None) -> bool:
    return body is not None and bool(body.get("messages") or body.get("batches"))


# ---- offsets -------------------------------------------------------------------------------


async def commit(request: web.Request) -> web.Response:
    group = _group(request)
    body = validation.fields_of(await read_body(request), COMMIT_FIELDS, "the commit request")
    member = _member_id(body.get("member_id"))
    generation = _int_field(body, "generation")
    raw = body.get("offsets")
    if not isinstance(raw, list) or not raw:
        raise invalid("offsets must be a non-empty list of {topic, partition, offset}")
    offsets = []
    seen = set()
    for index, item in enumerate(raw):
        item = validation.fields_of(
            item, frozenset({"topic", "partition", "offset"}), f"offsets[{index}]"
        )
        topic = validation.topic_name(item.get("topic"))
        partition = _int_field(item, "partition")
        offset = item.get("offset")
        if not validation.is_int(offset) or offset < 0:
            raise invalid(f"offsets[{index}].offset must be a non-negative integer")
        if (topic, partition) in seen:
            raise invalid(f"offsets name {topic}/{partition} twice")
        seen.add((topic, partition))
        offsets.append([topic, partition, offset])
    args = {"member_id": member, "generation": generation, "offsets": offsets}
    await _state(request).broker.group_call(group, "group_commit", args)
    return web.Response(status=204)


async def offsets(request: web.Request) -> web.Response:
    group = _group(request)
    answer = await _state(request).broker.group_call(group, "group_offsets", {})
    return reply(request, {"offsets": answer["offsets"]})


async def reset(request: web.Request) -> web.Response:
    group = _group(request)
    body = validation.fields_of(await read_body(request), RESET_FIELDS, "the reset request")
    topic = validation.topic_name(body.get("topic"))
    to = body.get("to")
    valid = to in ("earliest", "latest") or (
        isinstance(to, dict)
        and len(to) == 1
        and (
            (validation.is_int(to.get("offset")) and to["offset"] >= 0)
            or (validation.is_int(to.get("timestamp")) and to["timestamp"] >= 0)
        )
    )
    if not valid:
        raise invalid(
            'to must be "earliest", "latest", {"timestamp": ms} or {"offset": n} (n >= 0)'
        )
    answer = await _state(request).broker.group_call(
        group, "group_reset", {"topic": topic, "to": to}
    )
    return reply(request, {"offsets": answer["offsets"]})


# ---- listing -------------------------------------------------------------------------------


async def list_groups(request: web.Request) -> web.Response:
    return reply(request, {"groups": await _state(request).broker.list_groups()})


async def delete(request: web.Request) -> web.Response:
    group = _group(request)
    await _state(request).broker.group_call(group, "group_delete", {})
    return web.Response(status=204)


async def describe(request: web.Request) -> web.Response:
    group = _group(request)
    return reply(request, await _state(request).broker.group_call(group, "group_describe", {}))


def add_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/v1/groups", list_groups)
    router.add_get("/v1/groups/{group}", describe)
    router.add_delete("/v1/groups/{group}", delete)
    router.add_post("/v1/groups/{group}/members", join)
    router.add_post("/v1/groups/{group}/members/{member_id}/heartbeat", heartbeat)
    router.add_get("/v1/groups/{group}/members/{member_id}/messages", member_messages)
    router.add_delete("/v1/groups/{group}/members/{member_id}", leave)
    router.add_post("/v1/groups/{group}/offsets", commit)
    router.add_get("/v1/groups/{group}/offsets", offsets)
    router.add_post("/v1/groups/{group}/offsets/reset", reset)


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
