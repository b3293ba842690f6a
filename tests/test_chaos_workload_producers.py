"""How the chaos workload's producers spread over partitions: each partition has producers of
its own, so a slow partition holds up its own sends only, as a real client's do.

A stand-in node on loopback answers produce requests, slowly for one partition.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from raftline.chaos.history import Recorder, client_ops, pair
from raftline.chaos.workload import Workload, session

SLOW_PARTITION_S = 0.3


async def node_with_a_slow_partition() -> TestServer:
    offsets: Counter[int] = Counter()

    async def produce(request: web.Request) -> web.Response:
        partition = (await request.json())["messages"][0]["partition"]
        await asyncio.sleep(SLOW_PARTITION_S if partition == 0 else 0.002)
        offsets[partition] += 1
        return web.json_response(
            {"offsets": [{"partition": partition, "offset": offsets[partition]}]}
        )

    app = web.Application()
    app.router.add_post("/v1/topics/t/messages", produce)
    server = TestServer(app)
    await server.start_server()
    return server


def test_every_partition_has_producers_of_its_own(tmp_path: Path) -> None:
    work = Workload(Recorder(tmp_path / "h.jsonl"), ["http://a"], "t", 4, random.Random(0))
    owned = [work.owned_partitions(p, 8) for p in range(8)]
    assert owned == [[0], [1], [2], [3], [0], [1], [2], [3]]


def test_fewer_producers_than_partitions_share_them_out(tmp_path: Path) -> None:
    work = Workload(Recorder(tmp_path / "h.jsonl"), ["http://a"], "t", 5, random.Random(0))
    assert [work.owned_partitions(p, 2) for p in range(2)] == [[0, 2, 4], [1, 3]]


async def test_a_slow_partition_does_not_hold_up_sends_to_the_others(tmp_path: Path) -> None:
    server = await node_with_a_slow_partition()
    recorder = Recorder(tmp_path / "h.jsonl")
    work = Workload(recorder, [str(server.make_url("")).rstrip("/")], "t", 4, random.Random(2))
    try:
        async with session() as http:
            await asyncio.gather(*work.producers(http, 8, time.monotonic() + 1.5))
    finally:
        await server.close()
        recorder.close()
    acked = Counter(
        op.invoke.value["key"] for op in pair(client_ops(recorder.ops)) if op.type == "ok"
    )
    slow = acked["t/0"]
    assert slow <= 2 * 1.5 / SLOW_PARTITION_S + 2  # its own two producers, one send at a time
    # Producers over random partitions spent most of their time waiting on t/0: the other
    # partitions then got about as many acks as it (3x in all); here they go on at their pace.
    assert acked["t/1"] + acked["t/2"] + acked["t/3"] > 10 * slow
