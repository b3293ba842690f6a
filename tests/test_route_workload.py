"""The chaos routing workload (`--workload route`, chaos/route_workload.py) over HTTP against
three in-process brokers, judged by chaos/route_checker.py through report.analyse: a clean
run, and one through a stop of a destination's leader, pass with every acknowledged publish in
every destination once; brokers with planted bugs (a publish that writes its destinations one
by one and may fail between them; one that answers ok but skips a destination) fail it."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import http_cluster

from raftline.api import codec
from raftline.api.app import ApiState, _produce_partition
from raftline.api.exchange_publish import RoutingProducers
from raftline.api.validation import ProduceMessage
from raftline.chaos import report
from raftline.chaos.history import Recorder
from raftline.chaos.route_workload import RouteWorkload
from raftline.chaos.workload import Workload, session
from raftline.node.errors import BrokerError

pytestmark = pytest.mark.timeout(150)


async def run_route(
    tmp_path: Path, seconds: float = 3.0, stop_leader_at: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    async with http_cluster(tmp_path, 3) as cluster:
        recorder = Recorder(tmp_path / "history.jsonl")
        work = Workload(recorder, cluster.urls, "t", 1, random.Random(7), 3)
        route = RouteWorkload(work, destinations=3)

        async def stop_leader() -> None:
            """Stops the node leading the last destination's partition, HTTP and all."""
            if stop_leader_at is None:
                return
            await asyncio.sleep(stop_leader_at)
            topic = route.topics[-1]
            index = next(
                i
                for i in cluster.live
                for group, replica in cluster.brokers[i].partitions.items()
                if group.startswith(f"{topic}~")
                and cluster.brokers[i].runtime.groups[group].role == "leader"
            )
            await cluster.stop(index)

        async with session() as http:
            assert await route.setup(http, time.monotonic() + 30)
            until = time.monotonic() + seconds
            await asyncio.gather(
                stop_leader(),
                *(route.publisher(http, p, until) for p in range(3)),
                work.nodes.probe(http, until),
            )
            final = await route.final_phase(http, 3, time.monotonic() + 60)
        recorder.close()
        return report.analyse(recorder.ops), final


async def test_route_workload_over_http_leaves_a_valid_history(tmp_path: Path) -> None:
    result, final = await run_route(tmp_path)
    route = result["route"]
    assert final["destinations_read"]
    assert result["valid"], route["anomalies"]
    assert route["stats"]["acknowledged"] > 20
    assert route["stats"]["values_read"] >= route["stats"]["acknowledged"]
    assert "routing:" in report.summary_text(result)


async def test_route_workload_through_a_destination_leader_stop_stays_valid(
    tmp_path: Path,
) -> None:
    result, final = await run_route(tmp_path, seconds=4.0, stop_leader_at=1.5)
    assert final["destinations_read"]
    assert result["valid"], result["route"]["anomalies"]


async def test_a_publish_that_writes_destinations_one_by_one_fails_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chance = random.Random(3)

    async def one_by_one(
        self: RoutingProducers,
        state: ApiState,
        writes: dict[tuple[str, int], list[ProduceMessage]],
    ) -> dict[tuple[str, int], int]:
        bases = {}
        for n, ((topic, partition), messages) in enumerate(writes.items()):
            if n == 1 and chance.random() < 0.3:  # as a leader lost between two writes
                raise BrokerError("leader_unavailable", "planted: gave up after one write")
            batch = codec.encode_batch(messages, "none", state.broker.clock.now_ms())
            bases[(topic, partition)], _ = await _produce_partition(
                state, topic, partition, batch, "all"
            )
        return bases

    monkeypatch.setattr(RoutingProducers, "write", one_by_one)
    result, _ = await run_route(tmp_path, seconds=2.0)
    assert not result["valid"]
    assert "partial" in result["route"]["anomaly_types"]
    assert "routing anomalies:" in report.summary_text(result)


async def test_a_publish_that_skips_a_destination_fails_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RoutingProducers.write

    async def skipping(
        self: RoutingProducers,
        state: ApiState,
        writes: dict[tuple[str, int], list[ProduceMessage]],
    ) -> dict[tuple[str, int], int]:
        kept = dict(list(writes.items())[:-1])
        bases = await real(self, state, kept)
        return {**bases, **dict.fromkeys(set(writes) - set(kept), 0)}

    monkeypatch.setattr(RoutingProducers, "write", skipping)
    result, _ = await run_route(tmp_path, seconds=1.5)
    assert not result["valid"]
    assert {"lost", "partial"} <= set(result["route"]["anomaly_types"])
