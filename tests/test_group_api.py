"""Consumer groups through the HTTP API of one in-process node: join, group fetch, commit,
offsets with lag, leave, reset, fetch by timestamp, and the documented errors."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import call

pytestmark = pytest.mark.timeout(90)


async def topic_with(api: TestClient, name: str, partitions: int, per_partition: int) -> None:
    status, body = await call(api, "POST", "/v1/topics", {"name": name, "partitions": partitions})
    assert status == 201, body
    for p in range(partitions if per_partition else 0):
        messages = [{"value": f"{p}-{i}", "partition": p} for i in range(per_partition)]
        status, body = await call(
            api, "POST", f"/v1/topics/{name}/messages", {"messages": messages}
        )
        assert status == 200, body


async def test_two_members_split_commit_leave_and_the_other_continues(api: TestClient) -> None:
    await topic_with(api, "orders", 4, 5)
    status, a = await call(
        api,
        "POST",
        "/v1/groups/billing/members",
        {"topics": ["orders"], "member_id": "a", "auto_offset_reset": "earliest"},
    )
    assert status == 200, a
    assert a["member_id"] == "a" and len(a["assignment"]) == 4
    status, again = await call(
        api,
        "POST",
        "/v1/groups/billing/members",
        {"topics": ["orders"], "member_id": "a", "auto_offset_reset": "earliest"},
    )
    assert again["generation"] == a["generation"]  # a retry is idempotent
    status, b = await call(
        api,
        "POST",
        "/v1/groups/billing/members",
        {"topics": ["orders"], "member_id": "b", "auto_offset_reset": "earliest"},
    )
    assert status == 200 and b["generation"] == a["generation"] + 1
    assert len(b["assignment"]) == 2
    status, hb = await call(api, "POST", "/v1/groups/billing/members/a/heartbeat")
    assert status == 200 and hb["generation"] == b["generation"]
    mine = {(x["topic"], x["partition"]) for x in hb["assignment"]}
    assert len(mine) == 2 and not mine & {(x["topic"], x["partition"]) for x in b["assignment"]}

    status, got = await call(api, "GET", "/v1/groups/billing/members/a/messages?max_messages=3")
    assert status == 200, got
    assert got["generation"] == hb["generation"]
    assert len(got["messages"]) == 3 and all(m["topic"] == "orders" for m in got["messages"])
    assert {(p["topic"], p["partition"]) for p in got["positions"]} == mine
    seen = [(m["partition"], m["offset"]) for m in got["messages"]]
    status, more = await call(api, "GET", "/v1/groups/billing/members/a/messages")
    seen += [(m["partition"], m["offset"]) for m in more["messages"]]
    assert sorted(seen) == sorted(
        (p, o) for _, p in mine for o in range(1, 6)
    )  # after the NOOP at 0
    commit = {
        "member_id": "a",
        "generation": hb["generation"],
        "offsets": [{"topic": "orders", "partition": p, "offset": 3} for _, p in mine],
    }
    status, body = await call(api, "POST", "/v1/groups/billing/offsets", commit)
    assert status == 204, body
    # b commits a's partition: fenced, nothing committed.
    theirs = b["assignment"][0]["partition"]
    wrong = {
        "member_id": "b",
        "generation": b["generation"],
        "offsets": [
            {"topic": "orders", "partition": theirs, "offset": 1},
            {"topic": "orders", "partition": sorted(mine)[0][1], "offset": 1},
        ],
    }
    status, body = await call(api, "POST", "/v1/groups/billing/offsets", wrong)
    assert status == 409 and body["error"]["code"] == "stale_generation"
    status, body = await call(api, "GET", "/v1/groups/billing/offsets")
    assert status == 200
    assert {
        (o["partition"], o["offset"], o["high_watermark"], o["lag"]) for o in body["offsets"]
    } == {(p, 3, 6, 3) for _, p in mine}

    status, _ = await call(api, "DELETE", "/v1/groups/billing/members/a")
    assert status == 204
    status, hb = await call(api, "POST", "/v1/groups/billing/members/b/heartbeat")
    assert len(hb["assignment"]) == 4
    status, got = await call(api, "GET", "/v1/groups/billing/members/b/messages")
    starts: dict[int, int] = {}
    for m in got["messages"]:
        starts.setdefault(m["partition"], m["offset"])
    for _, p in mine:
        assert starts[p] == 3  # continues from a's committed offset
    status, body = await call(api, "GET", "/v1/groups")
    assert body["groups"] == [{"group": "billing", "state": "stable", "members": 1}]
    status, body = await call(api, "GET", "/v1/groups/billing")
    assert body["state"] == "stable" and [m["member_id"] for m in body["members"]] == ["b"]
    status, body = await call(
        api, "POST", "/v1/groups/billing/offsets/reset", {"topic": "orders", "to": "earliest"}
    )
    assert status == 409 and body["error"]["code"] == "group_not_empty"
    status, _ = await call(api, "DELETE", "/v1/groups/billing/members/b")
    status, body = await call(
        api, "POST", "/v1/groups/billing/offsets/reset", {"topic": "orders", "to": {"offset": 1}}
    )
    assert status == 200 and [o["offset"] for o in body["offsets"]] == [1, 1, 1, 1]
    status, _ = await call(api, "DELETE", "/v1/groups/billing")
    assert status == 204
    status, body = await call(api, "GET", "/v1/groups/billing/offsets")
    assert status == 404 and body["error"]["code"] == "unknown_group"


async def test_bad_input_gets_documented_errors_and_commits_nothing(api: TestClient) -> None:
    await topic_with(api, "t", 1, 2)
    _, a = await call(api, "POST", "/v1/groups/g/members", {"topics": ["t"], "member_id": "a"})
    gen = a["generation"]
    cases = [
        ("POST", "/v1/groups/g/members/zz/heartbeat", None, 404, "unknown_member"),
        ("DELETE", "/v1/groups/g/members/zz", None, 404, "unknown_member"),
        ("GET", "/v1/groups/g/members/zz/messages", None, 404, "unknown_member"),
        ("GET", "/v1/groups/nope", None, 404, "unknown_group"),
        ("GET", "/v1/groups/nope/offsets", None, 404, "unknown_group"),
        ("POST", "/v1/groups/g/members", {"topics": ["missing"]}, 404, "unknown_topic"),
        ("POST", "/v1/groups/g/members", {"topics": "t"}, 400, "invalid_request"),
        ("POST", "/v1/groups/g/members", {"topics": ["t"], "bogus": 1}, 400, "invalid_request"),
        (
            "POST",
            "/v1/groups/g/offsets",
            {
                "member_id": "a",
                "generation": gen,
                "offsets": [{"topic": "t", "partition": 0, "offset": -1}],
            },
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/groups/g/offsets",
            {
                "member_id": "a",
                "generation": gen,
                "offsets": [{"topic": "t", "partition": 0, "offset": 10}],
            },
            416,
            "offset_out_of_range",
        ),
        (
            "POST",
            "/v1/groups/g/offsets",
            {
                "member_id": "a",
                "generation": gen + 1,
                "offsets": [{"topic": "t", "partition": 0, "offset": 1}],
            },
            409,
            "stale_generation",
        ),
        (
            "POST",
            "/v1/groups/g/offsets",
            {
                "member_id": "zz",
                "generation": gen,
                "offsets": [{"topic": "t", "partition": 0, "offset": 1}],
            },
            404,
            "unknown_member",
        ),
        ("POST", "/v1/groups/g/offsets", [1, 2], 400, "invalid_request"),
        (
            "POST",
            "/v1/groups/g/offsets/reset",
            {"topic": "t", "to": "middle"},
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/groups/g/offsets/reset",
            {"topic": "t", "to": "earliest"},
            409,
            "group_not_empty",
        ),
    ]
    for method, path, body, status, code in cases:
        got_status, got = await call(api, method, path, body)
        assert (got_status, got["error"]["code"]) == (status, code), (path, body, got)
        assert set(got["error"]) == {"code", "message", "retryable"}
    _, body = await call(api, "GET", "/v1/groups/g/offsets")
    assert body["offsets"] == []


async def test_long_poll_returns_as_soon_as_data_is_there(api: TestClient) -> None:
    await topic_with(api, "lp", 2, 0)
    await call(api, "POST", "/v1/groups/w/members", {"topics": ["lp"], "member_id": "m"})

    async def produce_later() -> None:
        await asyncio.sleep(0.5)
        await call(
            api, "POST", "/v1/topics/lp/messages", {"messages": [{"value": "x", "partition": 1}]}
        )

    started = time.monotonic()
    task = asyncio.ensure_future(produce_later())
    status, got = await call(api, "GET", "/v1/groups/w/members/m/messages?wait_ms=5000")
    took = time.monotonic() - started
    await task
    assert status == 200 and [m["value"] for m in got["messages"]] == ["x"]
    assert 0.4 < took < 2.5
    # "latest" was pinned on the first fetch: nothing produced since is skipped
    assert {(p["partition"], p["offset"]) for p in got["positions"]} == {
        (0, 1),
        (1, got["messages"][0]["offset"] + 1),
    }


async def test_fetch_and_reset_by_timestamp(api: TestClient) -> None:
    status, _ = await call(api, "POST", "/v1/topics", {"name": "ts", "partitions": 1})
    messages = [{"value": f"v{i}", "timestamp": 1_000 * (i + 1)} for i in range(6)]
    await call(api, "POST", "/v1/topics/ts/messages", {"messages": messages[:3]})
    await call(api, "POST", "/v1/topics/ts/messages", {"messages": messages[3:]})
    status, got = await call(api, "GET", "/v1/topics/ts/partitions/0/messages?timestamp=2500")
    assert status == 200 and [m["value"] for m in got["messages"]] == ["v2", "v3", "v4", "v5"]
    status, got = await call(api, "GET", "/v1/topics/ts/partitions/0/messages?timestamp=99999")
    assert got["messages"] == [] and got["next_offset"] == 7
    status, body = await call(
        api, "POST", "/v1/groups/t/offsets/reset", {"topic": "ts", "to": {"timestamp": 4000}}
    )
    assert status == 200, body
    assert body["offsets"] == [{"topic": "ts", "partition": 0, "offset": 4}]
    _, body = await call(api, "GET", "/v1/groups/t/offsets")
    assert body["offsets"][0]["lag"] == 3


async def test_metrics_show_committed_offsets_and_lag(api: TestClient) -> None:
    await topic_with(api, "mt", 1, 4)
    await call(api, "POST", "/v1/groups/mg/offsets/reset", {"topic": "mt", "to": {"offset": 1}})
    await call(api, "GET", "/v1/groups/mg/offsets")
    text = await (await api.get("/metrics")).text()
    assert 'raftline_group_committed_offset{node="1",group="mg",topic="mt",partition="0"} 1' in text
    assert 'raftline_group_lag{node="1",group="mg",topic="mt",partition="0"} 4' in text


async def test_long_poll_keeps_the_session_and_ends_on_a_new_generation(api: TestClient) -> None:
    await topic_with(api, "quiet", 2, 0)
    join = {"topics": ["quiet"], "session_timeout_ms": 1500}
    await call(api, "POST", "/v1/groups/k/members", {**join, "member_id": "m"})
    started = time.monotonic()
    status, got = await call(api, "GET", "/v1/groups/k/members/m/messages?wait_ms=3000")
    assert status == 200 and got["messages"] == []
    assert time.monotonic() - started > 2.5  # waited although the session is 1.5 s
    status, _ = await call(api, "POST", "/v1/groups/k/members/m/heartbeat")
    assert status == 200  # the wait kept it alive

    async def join_later() -> None:
        await asyncio.sleep(0.3)
        await call(api, "POST", "/v1/groups/k/members", {**join, "member_id": "n"})

    task = asyncio.ensure_future(join_later())
    started = time.monotonic()
    status, got = await call(api, "GET", "/v1/groups/k/members/m/messages?wait_ms=20000")
    await task
    assert status == 200 and got["rebalancing"] is True
    assert time.monotonic() - started < 2.0
    status, hb = await call(api, "POST", "/v1/groups/k/members/m/heartbeat")
    assert len(hb["assignment"]) == 1 and hb["generation"] == got["generation"] + 1


async def test_a_deleted_topic_leaves_the_assignment(api: TestClient) -> None:
    await topic_with(api, "keep", 1, 0)
    await topic_with(api, "drop", 2, 0)
    _, joined = await call(
        api, "POST", "/v1/groups/d/members", {"topics": ["keep", "drop"], "member_id": "m"}
    )
    assert len(joined["assignment"]) == 3
    status, _ = await call(api, "DELETE", "/v1/topics/drop")
    assert status == 204
    deadline = time.monotonic() + 5
    while True:
        _, hb = await call(api, "POST", "/v1/groups/d/members/m/heartbeat")
        if hb["assignment"] == [{"topic": "keep", "partition": 0}]:
            break
        assert time.monotonic() < deadline, hb
        await asyncio.sleep(0.1)
    assert hb["generation"] == joined["generation"] + 1


async def test_a_member_losing_partitions_to_a_join_may_commit_in_its_generation_first(
    api: TestClient,
) -> None:
    await topic_with(api, "orders", 2, 3)
    join = {"topics": ["orders"], "auto_offset_reset": "earliest"}
    status, a = await call(api, "POST", "/v1/groups/g/members", {**join, "member_id": "a"})
    assert status == 200 and len(a["assignment"]) == 2
    status, got = await call(api, "GET", "/v1/groups/g/members/a/messages")
    assert len(got["messages"]) == 6
    # a long-polls while b joins: b's join takes a partition from a, so a is told first.
    polling = asyncio.ensure_future(
        call(api, "GET", "/v1/groups/g/members/a/messages?wait_ms=10000")
    )
    await asyncio.sleep(0.2)
    joining = asyncio.ensure_future(
        call(api, "POST", "/v1/groups/g/members", {**join, "member_id": "b"})
    )
    status, told = await asyncio.wait_for(polling, 5)
    assert status == 200 and told["rebalancing"] is True
    assert told["generation"] == a["generation"] and not joining.done()
    # Its generation is still current: what it processed commits.
    done = [{"topic": "orders", "partition": p, "offset": 3} for p in (0, 1)]
    commit = {"member_id": "a", "generation": a["generation"], "offsets": done}
    status, _ = await call(api, "POST", "/v1/groups/g/offsets", commit)
    assert status == 204
    await call(api, "POST", "/v1/groups/g/members/a/heartbeat")  # a is back: b may go ahead
    status, b = await asyncio.wait_for(joining, 5)
    assert status == 200 and b["generation"] == a["generation"] + 1 and len(b["assignment"]) == 1
    status, offsets = await call(api, "GET", "/v1/groups/g/offsets")
    assert {o["partition"]: o["offset"] for o in offsets["offsets"]} == {0: 3, 1: 3}
