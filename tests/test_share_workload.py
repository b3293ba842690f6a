"""The chaos queue workload (`--workload share`, chaos/share_workload.py) over HTTP against three
in-process brokers, judged by chaos/share_checker.py through report.analyse: a clean run passes
with every send accepted or dead-lettered, and a broker with a planted bug (an accept that
answers ok but only releases the record) fails the verdict."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import http_cluster

from raftline.chaos import report
from raftline.chaos.history import Recorder
from raftline.chaos.share_workload import ShareWorkload
from raftline.chaos.workload import Workload, session
from raftline.node.queues.service import QueueService

pytestmark = pytest.mark.timeout(120)


async def run_share(
    tmp_path: Path, seconds: float = 3.0, stop_leader_at: float | None = None
) -> tuple[dict[str, Any], dict]:
    async with http_cluster(tmp_path, 3) as cluster:
        recorder = Recorder(tmp_path / "history.jsonl")
        work = Workload(recorder, cluster.urls, "t", 2, random.Random(5), 3)
        share = ShareWorkload(work, lock_ms=300, max_deliveries=3)
        share.crash_share = share.late_share = 0.1

        async def stop_leader() -> None:
            """Stops the node leading the queue's shard, HTTP and all, mid-run."""
            if stop_leader_at is None:
                return
            await asyncio.sleep(stop_leader_at)
            index = next(
                i
                for i in cluster.live
                for r in cluster.brokers[i].queues.replicas.values()
                if r.serving and share.queue in r.state.queues
            )
            await cluster.stop(index)

        async with session() as http:
            assert await work.create_topic(http, time.monotonic() + 20)
            assert await share.setup(http, 9, time.monotonic() + 20)
            until = time.monotonic() + seconds
            await asyncio.gather(
                stop_leader(),
                *(work.produce(http, p, until) for p in range(2)),
                *(share.receiver(http, 2 + r, until) for r in range(3)),
                work.nodes.probe(http, until),
                work.watch_leaders(http, until),
            )
            final = await share.final_phase(http, 5, time.monotonic() + 40)
        recorder.close()
        return report.analyse(recorder.ops), final


async def test_share_workload_over_http_leaves_a_valid_history(tmp_path: Path) -> None:
    result, final = await run_share(tmp_path)
    share = result["share"]
    print(f"\nshare workload: {share['stats']}, final {final}")
    assert final["drained"] and final["dead_letters_read"] and final["unsettled"] == 0
    assert result["valid"], share["anomalies"]
    assert share["stats"]["sent"] > 50
    stats = share["stats"]
    assert stats["acknowledged"] + stats["dead_lettered"] >= stats["sent"]
    assert share["stats"]["dead_lettered"] > 0
    assert "share queue:" in report.summary_text(result)


async def test_share_workload_through_a_queue_shard_leader_stop_stays_valid(
    tmp_path: Path,
) -> None:
    result, final = await run_share(tmp_path, seconds=4.0, stop_leader_at=1.5)
    share = result["share"]
    print(f"\nshare workload with a leader stop: {share['stats']}, final {final}")
    assert final["drained"] and final["dead_letters_read"]
    assert result["valid"], share["anomalies"]


async def test_a_broker_whose_accepts_only_release_fails_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = QueueService._call_ack
    calls = [0]

    async def buggy(self: QueueService, shard: str, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("outcome") == "accept":
            calls[0] += 1
            if calls[0] % 4 == 0:  # answers ok, but the record is only released
                return await real(self, shard, {**args, "outcome": "release"})
        return await real(self, shard, args)

    monkeypatch.setattr(QueueService, "_call_ack", buggy)
    result, _ = await run_share(tmp_path, seconds=2.0)
    assert not result["valid"]
    assert "redelivered-after-ack" in result["share"]["anomaly_types"]
    assert "share anomalies:" in report.summary_text(result)
