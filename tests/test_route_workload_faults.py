"""The chaos routing workload against three `raftline serve` processes while nodes are
SIGKILLed and restarted or SIGSTOPped and resumed, one at a time (the compose harness's kill
and pause faults without Docker): the history must stay valid, every acknowledged publish in
every destination once, none in some destinations only."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.chaos import report
from raftline.chaos.history import Recorder
from raftline.chaos.route_workload import RouteWorkload
from raftline.chaos.workload import Workload, session

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(400)]

FAULTS_S = 60.0
FAULT_EVERY_S = 8.0
FAULT_FOR_S = 3.0


async def faults(cluster: object, rng: random.Random, until: float) -> list[str]:
    done = []
    nodes = cluster.nodes  # type: ignore[attr-defined]
    while time.monotonic() + FAULT_EVERY_S < until:
        await asyncio.sleep(FAULT_EVERY_S - FAULT_FOR_S)
        node = rng.choice(nodes)
        if rng.random() < 0.5:
            node.kill()
            await asyncio.sleep(FAULT_FOR_S)
            node.start()
            done.append(f"kill {node.node_id}")
        else:
            node.pause()
            await asyncio.sleep(FAULT_FOR_S)
            node.resume()
            done.append(f"pause {node.node_id}")
    return done


def test_route_workload_under_kills_and_pauses_stays_valid(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:

        async def main() -> tuple[dict, dict, list[str]]:
            recorder = Recorder(tmp_path / "history.jsonl")
            urls = [n.url for n in cluster.nodes]
            work = Workload(recorder, urls, "t", 1, random.Random(11), 3)
            route = RouteWorkload(work, destinations=3)
            async with session() as http:
                assert await route.setup(http, time.monotonic() + 30)
                until = time.monotonic() + FAULTS_S
                injected, *_ = await asyncio.gather(
                    faults(cluster, random.Random(12), until),
                    *(route.publisher(http, p, until + 5) for p in range(4)),
                    work.nodes.probe(http, until + 5),
                )
                cluster.wait_ready()
                final = await route.final_phase(http, 4, time.monotonic() + 90)
            recorder.close()
            return report.analyse(recorder.ops), final, injected

        result, final, injected = asyncio.run(main())
        route = result["route"]
        print(f"\nfaults {injected}; {route['stats']}; {result['availability']['during_faults']}")
        assert final["destinations_read"]
        assert result["valid"], route["anomalies"]
        assert route["stats"]["acknowledged"] > 100
