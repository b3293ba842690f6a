"""The group workload against three real brokers in this process (each with its HTTP API on
loopback): members talk to random nodes, crash, leave and send zombie commits; the history
passes every check, and the broker refused the zombies."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from inproc_harness import http_cluster

from raftline.chaos import report
from raftline.chaos.group_workload import GroupWorkload
from raftline.chaos.history import Recorder
from raftline.chaos.workload import Workload, session

MEMBERS = 3


async def test_group_workload_against_three_in_process_brokers_is_valid(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "history.jsonl")
    async with http_cluster(tmp_path, 3) as cluster:
        work = Workload(recorder, cluster.urls, "orders", 3, random.Random(7), 3)
        group = GroupWorkload(
            work,
            "billing",
            session_timeout_ms=1000,
            crash_every_s=1.5,
            leave_every_s=1.5,
            zombie_every_s=0.3,
            fetch_wait_ms=100,
        )
        async with session() as http:
            assert await work.create_topic(http, time.monotonic() + 20)
            until = time.monotonic() + 3.0
            await asyncio.gather(
                *(work.produce(http, p, until) for p in range(2)),
                *(group.member(http, 2 + m, m, until) for m in range(MEMBERS)),
                group.observe(http, 2 + MEMBERS, until, every_s=0.1),
            )
            final = await group.final_phase(http, 3 + MEMBERS, time.monotonic() + 30)
    recorder.close()
    ops = recorder.ops
    assert final["consumed_to_end"] and final["offsets_read"], final
    result = report.analyse(ops)
    assert result["valid"], (result["group"]["anomalies"], result["queue"]["anomalies"])
    stats = result["group"]["stats"]
    assert stats["acknowledged"] > 0 and stats["commits_ok"] > 0
    assert stats["generations"] > MEMBERS
    zombies = [op for op in ops if op.f == "group-commit" and (op.value or {}).get("zombie")]
    assert any(op.type == "fail" and op.error == "stale_generation" for op in zombies)
