"""The group workload against an in-memory group broker (tests/group_fake_broker.py) on loopback:
the honest broker's history passes every check, and each planted bug is named by the checker."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from group_fake_broker import FakeGroupBroker

from raftline.chaos import report
from raftline.chaos.__main__ import main
from raftline.chaos.group_workload import GroupWorkload, group_call
from raftline.chaos.history import Op, Recorder, pair, read_history
from raftline.chaos.workload import Workload, session

MEMBERS = 3


async def drive(
    broker: FakeGroupBroker, out: Path, seconds: float = 1.0, seed: int = 1
) -> tuple[list[Op], dict[str, Any]]:
    """Two producers, three members (crashing, leaving and sending zombie commits often), an
    offsets observer, then the final phase; returns the history and the final phase's result."""
    server = TestServer(broker.app(), host="127.0.0.1")
    await server.start_server()
    recorder = Recorder(out / "history.jsonl")
    try:
        work = Workload(recorder, [str(server.make_url("")).rstrip("/")], "orders", 3,
                        random.Random(seed), 1)  # fmt: skip
        group = GroupWorkload(
            work,
            "billing",
            session_timeout_ms=300,
            crash_every_s=0.4,
            leave_every_s=0.4,
            zombie_every_s=0.1,
            fetch_wait_ms=20,
        )
        async with session() as http:
            assert await work.create_topic(http, time.monotonic() + 5)
            until = time.monotonic() + seconds
            await asyncio.gather(
                *(work.produce(http, p, until) for p in range(2)),
                *(group.member(http, 2 + m, m, until) for m in range(MEMBERS)),
                group.observe(http, 2 + MEMBERS, until, every_s=0.02),
            )
            final = await group.final_phase(http, 3 + MEMBERS, time.monotonic() + 10)
    finally:
        recorder.close()
        await server.close()
    return recorder.ops, final


async def test_honest_group_broker_passes_and_the_history_exercises_the_group(
    tmp_path: Path,
) -> None:
    ops, final = await drive(FakeGroupBroker(), tmp_path)
    assert final["consumed_to_end"] and final["offsets_read"]
    result = report.analyse(ops)
    assert result["valid"], (result["group"]["anomalies"], result["queue"]["anomalies"])
    stats = result["group"]["stats"]
    assert stats["acknowledged"] > 0
    assert stats["commits_ok"] > 0
    zombies = [op for op in ops if op.f == "group-commit" and op.value.get("zombie")]
    assert zombies and stats["commits_refused"] > 0  # zombie commits were sent and fenced
    assert stats["generations"] > MEMBERS  # rebalances beyond the first joins
    assert stats["final_fetches"] > 0
    fs = {op.f for op in ops}
    assert {"group-crash", "group-leave", "group-heartbeat", "group-offsets"} <= fs
    # Every op completed, and 409/404 answers are definite failures.
    assert all(p.complete is not None for p in pair(ops))
    errors = {op.error for op in ops if op.type == "fail"}
    assert "stale_generation" in errors
    assert not any(op.type == "info" for op in ops)


async def test_lost_fetch_answers_do_not_make_an_honest_broker_look_lossy(
    tmp_path: Path,
) -> None:
    """A fetch whose answer is lost may have moved the member past messages nobody saw: the
    member never commits under that id again, so the final phase still reads them."""
    ops, final = await drive(FakeGroupBroker(lose_fetch_answer_every=4), tmp_path)
    assert final["consumed_to_end"]
    result = report.analyse(ops)
    assert result["valid"], (result["group"]["anomalies"], result["queue"]["anomalies"])
    lost_answers = [op for op in ops if op.f == "group-fetch" and op.type == "info"]
    assert lost_answers
    for op in lost_answers:
        later = [o for o in ops[op.index :] if o.f == "group-commit" and o.type == "invoke"]
        assert all(o.value["member"] != op.value["member"] for o in later)


async def test_a_member_committing_after_a_lost_fetch_answer_would_look_like_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the rule above exists: a member that keeps its id and commits after a lost answer
    skips what that answer held, and the checker (rightly, for that client) reports loss."""

    async def careless(self: GroupWorkload, http: Any, member: Any, until: float) -> str:
        while time.monotonic() < until:
            outcome, _ = await self.fetch(http, member)
            if outcome.error == "unknown_member":
                return "unknown"
            if outcome.type == "ok":
                await self._commit_positions(http, member)
        return "end"

    monkeypatch.setattr(GroupWorkload, "session", careless)
    ops, _ = await drive(FakeGroupBroker(lose_fetch_answer_every=4), tmp_path)
    assert "lost" in report.analyse(ops)["group"]["anomaly_types"]


async def test_group_error_codes_are_classified_as_api_md_says() -> None:
    async def answer(request: web.Request) -> web.Response:
        status, code = request.match_info["status"], request.match_info["code"]
        body = {"error": {"code": code, "message": code, "retryable": False}}
        return web.json_response(body, status=int(status))

    app = web.Application()
    app.router.add_post("/{status}/{code}", answer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with session() as http:
            kinds = {
                code: (
                    await group_call(http, "POST", str(server.make_url(f"/{status}/{code}")))
                ).type
                for status, code in (
                    (409, "stale_generation"),
                    (404, "unknown_member"),
                    (409, "group_not_empty"),
                    (400, "invalid_request"),
                    (503, "leader_unavailable"),
                    (504, "timeout"),
                )
            }
    finally:
        await server.close()
    assert kinds == {
        "stale_generation": "fail",
        "unknown_member": "fail",
        "group_not_empty": "fail",
        "invalid_request": "fail",
        "leader_unavailable": "info",
        "timeout": "info",
    }


@pytest.mark.parametrize(
    ("bug", "kinds"),
    [
        ({"double_assignment": True}, {"double-assignment"}),
        ({"lose_every_commit": 3}, {"offset-regression"}),
        ({"no_fencing": True}, {"commit-by-non-owner"}),
        ({"new_owner_starts_at_end": True}, {"lost"}),
        ({"generation_goes_back": 3}, {"generation-regression"}),
    ],
)
async def test_planted_group_bug_is_caught(
    tmp_path: Path, bug: dict[str, Any], kinds: set[str]
) -> None:
    ops, _ = await drive(FakeGroupBroker(**bug), tmp_path)
    result = report.analyse(ops)
    assert not result["valid"]
    assert kinds & set(result["group"]["anomaly_types"]), result["group"]["anomaly_counts"]


def serve(broker: FakeGroupBroker) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(broker.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def group_url() -> Iterator[str]:
    yield from serve(FakeGroupBroker())


@pytest.fixture
def lossy_group_url() -> Iterator[str]:
    yield from serve(FakeGroupBroker(new_owner_starts_at_end=True))


def cli_run(url: str, out: Path) -> int:
    return main(
        ["run", "--urls", url, "--nemesis", "", "--workload", "group", "--time-limit", "1",
         "--recovery", "0.3", "--partitions", "3", "--producers", "2", "--members", "3",
         "--session-timeout-ms", "500", "--out", str(out)]
    )  # fmt: skip


def test_command_line_group_run_against_honest_broker_exits_zero(
    group_url: str, tmp_path: Path
) -> None:
    assert cli_run(group_url, tmp_path) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["valid"] is True
    assert result["run"]["final_reads_complete"] == {"group": True}
    assert result["group"]["stats"]["commits_ok"] > 0
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith("verdict: VALID") and "group anomalies: none" in summary
    ops = read_history(tmp_path / "history.jsonl")
    assert not any(op.f in ("poll", "create", "delete", "describe") for op in ops)


def test_command_line_group_run_against_lossy_broker_exits_one_and_check_agrees(
    lossy_group_url: str, tmp_path: Path
) -> None:
    assert cli_run(lossy_group_url, tmp_path / "run") == 1
    history = tmp_path / "run" / "history.jsonl"
    assert main(["check", str(history), "--out", str(tmp_path / "again")]) == 1
    assert "lost" in (tmp_path / "again" / "summary.txt").read_text()
