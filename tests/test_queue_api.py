"""Queues through the HTTP API of one in-process node: two receivers share a queue; an
unacknowledged record comes back after its lock expires with a higher delivery count; a record
released max_deliveries times lands in the dead-letter topic with its source headers; a reject
dead-letters at once; acknowledged records never come back; long-polls end when data arrives;
lock extension; and the documented answers to bad input (forged, foreign and expired receipts
settle nothing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import call, ok

pytestmark = pytest.mark.timeout(90)


async def setup(api: TestClient, partitions: int = 2, per_partition: int = 3, **queue: Any) -> None:
    await ok(api, "POST", "/v1/topics", {"name": "work", "partitions": partitions})
    for p in range(partitions if per_partition else 0):
        messages = [
            {"value": f"{p}-{i}", "partition": p, "headers": {"h": "v"}}
            for i in range(per_partition)
        ]
        await ok(api, "POST", "/v1/topics/work/messages", {"messages": messages})
    spec = {"name": "jobs", "topic": "work", "dead_letter_topic": "work.dlq", **queue}
    created = await ok(api, "POST", "/v1/queues", spec)
    assert created["name"] == "jobs" and created["topic"] == "work"
    # the dead-letter topic is created when missing
    assert (await ok(api, "GET", "/v1/topics/work.dlq"))["name"] == "work.dlq"


async def receive(api: TestClient, n: int, wait_ms: int = 0) -> list[dict[str, Any]]:
    answer = await ok(
        api, "POST", "/v1/queues/jobs/receive", {"max_messages": n, "wait_ms": wait_ms}
    )
    return list(answer["messages"])


async def settle(api: TestClient, messages: list[dict[str, Any]], outcome: str) -> list[Any]:
    body = {"receipts": [m["receipt"] for m in messages], "outcome": outcome}
    return list((await ok(api, "POST", "/v1/queues/jobs/ack", body))["results"])


async def test_two_receivers_share_expiry_redelivers_and_acked_never_return(
    api: TestClient,
) -> None:
    await setup(api, lock_ms=400, max_deliveries=3)
    a, b = await asyncio.gather(receive(api, 3), receive(api, 3))
    assert len(a) == 3 and len(b) == 3
    keys = {(m["partition"], m["offset"]) for m in a + b}
    assert len(keys) == 6  # nobody got a record twice
    assert all(m["delivery_count"] == 1 and m["topic"] == "work" for m in a + b)
    assert all(m["headers"] == {"h": "v"} and m["value"].startswith(str(m["partition"])) for m in a)
    assert await receive(api, 10) == []  # everything is locked
    results = await settle(api, a + b[:2], "accept")
    assert all(r["ok"] and r["error"] is None for r in results)
    described = await ok(api, "GET", "/v1/queues/jobs")
    assert described["acknowledged"] == 5 and described["locked"] == 1
    assert described["available"] == 0 and described["dead_lettered"] == 0
    # b's last record is never acknowledged: it comes back after its lock, counted twice.
    again = await receive(api, 10, wait_ms=3_000)
    assert [(m["partition"], m["offset"]) for m in again] == [(b[2]["partition"], b[2]["offset"])]
    assert again[0]["delivery_count"] == 2 and again[0]["receipt"] != b[2]["receipt"]
    stale = await settle(api, [b[2]], "accept")
    assert stale == [{"receipt": b[2]["receipt"], "ok": False, "error": "lock_expired"}]
    assert (await settle(api, again, "accept"))[0]["ok"]
    # nothing acknowledged ever comes back
    assert await receive(api, 10, wait_ms=800) == []
    described = await ok(api, "GET", "/v1/queues/jobs")
    assert described["acknowledged"] == 6 and described["locked"] == 0
    assert described["available"] == 0
    metrics = await (await api.get("/metrics")).text()
    assert 'raftline_queue_acknowledged{node="1",queue="jobs",topic="work"} 6' in metrics


async def dead_letters(api: TestClient) -> list[dict[str, Any]]:
    answer = await ok(api, "GET", "/v1/topics/work.dlq/partitions/0/messages?offset=0")
    return list(answer["messages"])


async def test_released_max_deliveries_times_lands_in_the_dead_letter_topic(
    api: TestClient,
) -> None:
    await setup(api, partitions=1, per_partition=2, max_deliveries=2)
    first = None
    for attempt in (1, 2):
        got = await receive(api, 1)
        first = got[0]["offset"] if first is None else first
        assert [(m["offset"], m["delivery_count"]) for m in got] == [(first, attempt)]
        assert (await settle(api, got, "release"))[0]["ok"]
    dead = await dead_letters(api)
    assert len(dead) == 1
    assert dead[0]["value"] == "0-0"
    assert dead[0]["headers"] == {
        "h": "v",
        "x-raftline-source-topic": "work",
        "x-raftline-source-partition": "0",
        "x-raftline-source-offset": str(first),
        "x-raftline-delivery-count": "2",
        "x-raftline-death-reason": "max_deliveries",
    }
    # a reject dead-letters at once
    got = await receive(api, 5)
    assert [(m["offset"], m["delivery_count"]) for m in got] == [(first + 1, 1)]
    assert (await settle(api, got, "reject"))[0]["ok"]
    dead = await dead_letters(api)
    assert [d["value"] for d in dead] == ["0-0", "0-1"]
    assert dead[1]["headers"]["x-raftline-death-reason"] == "rejected"
    assert await receive(api, 5) == []
    described = await ok(api, "GET", "/v1/queues/jobs")
    assert described["dead_lettered"] == 2 and described["acknowledged"] == 0


async def test_long_poll_returns_when_a_record_arrives_and_extend_keeps_the_lock(
    api: TestClient,
) -> None:
    await setup(api, partitions=2, per_partition=0, lock_ms=300)

    async def produce_later() -> None:
        await asyncio.sleep(0.5)
        await ok(api, "POST", "/v1/topics/work/messages", {"messages": [{"value": "late"}]})

    started = time.monotonic()
    producing = asyncio.ensure_future(produce_later())
    got = await receive(api, 5, wait_ms=10_000)
    waited = time.monotonic() - started
    await producing
    assert [m["value"] for m in got] == ["late"] and 0.4 < waited < 3.0, waited
    extended = await ok(
        api, "POST", "/v1/queues/jobs/extend", {"receipts": [got[0]["receipt"]], "lock_ms": 5_000}
    )
    assert extended["results"][0]["ok"]
    await asyncio.sleep(0.6)  # past the first lock: still held
    assert await receive(api, 5) == []
    assert (await settle(api, got, "accept"))[0]["ok"]


async def test_bad_input_gets_the_documented_answers_and_settles_nothing(
    api: TestClient,
) -> None:
    await setup(api, partitions=1, per_partition=2)
    got = await receive(api, 1)
    receipt = got[0]["receipt"]
    forged = receipt.replace(".0.1.", ".1.1.")
    assert forged != receipt
    results = await settle(api, [{"receipt": forged}, {"receipt": "junk"}], "accept")
    assert [(r["ok"], r["error"]) for r in results] == [
        (False, "invalid_receipt"),
        (False, "invalid_receipt"),
    ]
    # a receipt of another queue over the same topic is foreign here
    await ok(api, "POST", "/v1/queues", {"name": "other", "topic": "work"})
    status, body = await call(
        api, "POST", "/v1/queues/other/ack", {"receipts": [receipt], "outcome": "accept"}
    )
    assert status == 200 and body["results"][0]["error"] == "invalid_receipt"
    for path, payload, code in [
        ("/v1/queues/jobs/ack", {"receipts": [receipt], "outcome": "maybe"}, 400),
        ("/v1/queues/jobs/ack", {"receipts": []}, 400),
        ("/v1/queues/jobs/ack", {"receipts": [receipt], "extra": 1}, 400),
        ("/v1/queues/jobs/receive", {"max_messages": 0}, 400),
        ("/v1/queues/jobs/receive", {"wait_ms": -1}, 400),
        ("/v1/queues/nope/receive", {}, 404),
        ("/v1/queues/nope/ack", {"receipts": [receipt]}, 404),
        ("/v1/queues", {"name": "bad name", "topic": "work"}, 400),
        ("/v1/queues", {"name": "q2", "topic": "missing"}, 404),
        ("/v1/queues", {"name": "q2", "topic": "work", "max_deliveries": 0}, 400),
        ("/v1/queues", {"name": "q2", "topic": "work", "dead_letter_topic": "work"}, 400),
        ("/v1/queues", {"name": "jobs", "topic": "work", "lock_ms": 999}, 409),
        ("/v1/queues", {"name": "q3", "topic": "__groups"}, 404),
        ("/v1/queues", {"name": "q4", "topic": "work", "dead_letter_topic": "__queues"}, 404),
    ]:
        status, body = await call(api, "POST", path, payload)
        assert status == code, (path, payload, status, body)
        assert body["error"]["code"] and body["error"]["retryable"] is False
    assert (await call(api, "GET", "/v1/queues/nope"))[0] == 404
    assert (await call(api, "DELETE", "/v1/queues/nope"))[0] == 404
    described = await ok(api, "GET", "/v1/queues/jobs")
    assert described["acknowledged"] == 0 and described["locked"] == 1
    # the real receipt works; accepted again (a retry) it answers ok, released it is spent
    assert (await settle(api, [{"receipt": receipt}], "accept"))[0]["ok"]
    assert (await settle(api, [{"receipt": receipt}], "accept"))[0]["ok"]
    assert (await settle(api, [{"receipt": receipt}], "release"))[0]["error"] == "lock_expired"
    # a deleted and recreated queue does not take the old queue's receipts
    got = await receive(api, 1)
    assert (await call(api, "DELETE", "/v1/queues/jobs"))[0] == 204
    await ok(api, "POST", "/v1/queues", {"name": "jobs", "topic": "work"})
    assert (await settle(api, got, "accept"))[0]["error"] == "invalid_receipt"
    listed = await ok(api, "GET", "/v1/queues")
    assert sorted(q["name"] for q in listed["queues"]) == ["jobs", "other"]


async def test_priorities_come_first_and_delayed_records_wait_for_their_time(
    api: TestClient,
) -> None:
    await setup(api, partitions=2, per_partition=0)
    sent = time.time()
    messages = [
        {"value": "low", "partition": 0},
        {"value": "mid", "partition": 1, "headers": {"priority": "5"}},
        {"value": "later", "partition": 0, "headers": {"delay_ms": "1000", "priority": "9"}},
        {"value": "high", "partition": 0, "headers": {"priority": "9"}},
        {"value": "bad", "partition": 1, "headers": {"priority": "x"}},
    ]
    await ok(api, "POST", "/v1/topics/work/messages", {"messages": messages})
    got = await receive(api, 2)
    assert [m["value"] for m in got] == ["high", "mid"]
    got += await receive(api, 10)
    assert sorted(m["value"] for m in got[2:]) == ["bad", "low"]  # equal priorities: any order
    late = await receive(api, 10, wait_ms=5_000)
    assert [m["value"] for m in late] == ["later"]
    assert time.time() - sent >= 0.9  # not before its delay
    assert all(r["ok"] for r in await settle(api, got + late, "accept"))
